"""priority-lru: priority-aware LRU with expiring hints (TensorRT-LLM retention priority).

    pin(b, r, pos)  (on_cached, on_hit):  hint[b] = r's range covering pos (retention), else
                                          (r.priority, r.priority_until)
                                          reuse_cost[b] = max(reuse_cost[b],
                                                              r.num_prompt_blocks - pos)
    eff(b, t) = hint[b].priority  if b has a hint and t < hint[b].until  else default
    on_free(blocks, t):  push (eff(b, t), reuse_cost[b], ++freed_seq, b);
                         an unexpired hint with an end goes in the expiry heap
    on_admit(r, t):      every candidate whose hint ended by t moves to default
    select_victim():     smallest (priority, reuse_cost, freed_seq, block)

Choices:
- Priorities are TensorRT-LLM's: lower is evicted first (0..100 there; any integer
  is accepted), ``default_priority`` 35 for blocks whose hint expired
  (``now >= priority_until``) or that never had one. A request without
  ``priority_until`` keeps its hint for the block's life.
- The hint is the one of the request that last pinned the block (its computing
  request, or the last request to hit it); a request without a hint clears it.
  It can change only while the block is pinned, so a candidate's key changes
  only by expiry.
- ``retention`` (TensorRT-LLM's KvCacheRetentionConfig token ranges): block ``pos`` of
  a request takes the range holding its first token (``pos * block_size``; TensorRT-LLM's
  ``getPerBlockRetentionPriorityDuration``), i.e. that range's priority for that range's
  ``duration_s``, counted from the moment the block is freed (TensorRT-LLM sets
  ``expirationTime = now + durationMs`` when it releases a block to the free queue), then
  ``default_priority``; a range without a duration never expires. A block no range of
  the request covers takes the request's ``priority``/``priority_until`` if it has them,
  else no hint (``default_priority``, TensorRT-LLM's 35 for tokens no range covers).
  Two requests, two hints: the latest pin wins, as TensorRT-LLM's ``claimBlock`` sets the
  priority and duration of each request that reuses a block (one difference: a TensorRT-LLM
  claim with no priority for the block keeps the block's earlier priority; here a pin
  without a hint clears it, as for ``priority``), and a re-freed block's duration counts
  again from that free.
- Reuse cost = how many prompt blocks a request that pinned the block would lose
  if it were evicted: the block itself and every later one (hits are contiguous
  prefixes, so nothing after a missing block can be hit): ``num_prompt_blocks -
  pos``, the largest over the requests that pinned it since it was cached.
  Lowest cost goes first, i.e. deeper blocks before shallower ones, as
  TensorRT-LLM and SGLang evict leaves first: a request's last block costs 1, its
  first costs the whole prompt. With the maximum, a parent always costs more than
  its child (every request that pins the child pins the parent one position
  earlier), so at equal priority a parent never goes before its child; across
  priorities it can, and orphans are measured as for any policy.
- Recency is the last free (vLLM's free-queue order, ``freed_seq``), unique per
  free, so the block id (the stated last tie break) never actually decides.
- Expiry is exact in trace time: a heap of end times is drained in ``on_admit``
  (the engine calls it with the batch's time before any ``select_victim``) and in
  ``on_free``; the expired block is re-keyed at the default priority, keeping its
  cost and freed_seq. One heap keyed by the full tuple, lazy deletion (an entry is
  live while the block is a candidate with that freed_seq and priority),
  compaction at twice the live entries: O(log n) per event.
- Ledger: queue ``priority``, position 0 (the heap's head); ``candidates()`` in
  eviction order as of the last processed time.
"""

from __future__ import annotations

from array import array
from heapq import heapify, heappop, heappush
from typing import Any

from psgate.policy import Decision, EvictionPolicy, PolicyRequest, PoolInfo


class PriorityLRUPolicy(EvictionPolicy):
    name = "priority-lru"
    api_version = 1
    summary = ("priority-aware LRU (TensorRT-LLM retention priority): lowest priority, "
               "then lowest reuse cost, then least recently freed; hints expire")
    defaults: dict[str, Any] = {"default_priority": 35}
    honours_hints = ("priority", "priority_until", "retention")

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        dp = self.params["default_priority"]
        if type(dp) is not int:
            raise ValueError(f"'default_priority' must be an integer, found {dp!r}")
        self.default = dp

    def bind(self, pool: PoolInfo) -> None:
        super().bind(pool)
        n = pool.num_blocks
        self.has_hint = bytearray(n)
        self.hint = array("q", [0]) * n
        self.until = array("q", [-1]) * n       # hint end (ns), -1 = none
        self.dur = array("q", [-1]) * n         # a retention range's duration (ns), -1 = none
        self.bs = pool.block_size
        self.cost = array("i", [0]) * n         # reuse cost
        self.prio = array("q", [0]) * n         # effective priority of the live entry
        self.expired = bytearray(n)             # the hint ended while it was a candidate
        self.pending = bytearray(n)             # has a live entry in the expiry heap
        self.freed_seq = array("q", [0]) * n
        self.cand = bytearray(n)
        self.heap: list[tuple[int, int, int, int]] = []   # (priority, cost, freed_seq, b)
        self.expiry: list[tuple[int, int, int]] = []      # (until_ns, freed_seq, b)
        self.num_pending = 0
        self.num_cand = 0
        self.seq = 0

    # -- helpers ----------------------------------------------------------------
    def _pin(self, b: int, req: PolicyRequest, pos: int) -> None:
        rng = None if req.retention is None else req.retention_at(pos, self.bs)
        if rng is not None:
            self.has_hint[b] = 1
            self.hint[b] = rng.priority
            self.until[b] = -1                  # set when freed: free time + duration
            d = rng.duration_ns
            self.dur[b] = -1 if d is None else d
        elif req.priority is None:
            self.has_hint[b] = 0
        else:
            self.has_hint[b] = 1
            self.hint[b] = req.priority
            u = req.priority_until_ns
            self.until[b] = -1 if u is None else u
            self.dur[b] = -1
        c = req.num_prompt_blocks - pos
        if c > self.cost[b]:
            self.cost[b] = c

    def _live(self, e: tuple[int, int, int, int]) -> bool:
        b = e[3]
        return self.cand[b] == 1 and self.freed_seq[b] == e[2] and self.prio[b] == e[0]

    def _drop(self, b: int) -> None:
        """b stops being a candidate."""
        self.cand[b] = 0
        self.num_cand -= 1
        if self.pending[b]:
            self.pending[b] = 0
            self.num_pending -= 1
            if len(self.expiry) > 2 * self.num_pending + 32:
                self.expiry = [x for x in self.expiry
                               if self.pending[x[2]] and self.freed_seq[x[2]] == x[1]]
                heapify(self.expiry)
        if len(self.heap) > 2 * self.num_cand + 32:
            self.heap = [e for e in self.heap if self._live(e)]
            heapify(self.heap)

    def _expire(self, now_ns: int) -> None:
        ex = self.expiry
        while ex and ex[0][0] <= now_ns:
            _, s, b = heappop(ex)
            if not (self.pending[b] and self.freed_seq[b] == s):
                continue
            self.pending[b] = 0
            self.num_pending -= 1
            self.expired[b] = 1
            if self.prio[b] != self.default:
                self.prio[b] = self.default
                heappush(self.heap, (self.default, self.cost[b], s, b))

    # -- events -------------------------------------------------------------------
    def on_admit(self, req: PolicyRequest, now_ns: int) -> None:
        self._expire(now_ns)

    def on_hit(self, block: int, req: PolicyRequest, pos: int) -> None:
        self._pin(block, req, pos)

    def on_cached(self, block: int, req: PolicyRequest, pos: int, parent: int,
                  key: int = -1) -> None:
        self.cost[block] = 0
        self._pin(block, req, pos)

    def on_touch(self, block: int) -> None:
        self._drop(block)

    def on_free(self, blocks: list[int], now_ns: int) -> None:
        self._expire(now_ns)
        default = self.default
        for b in blocks:
            self.seq += 1
            s = self.seq
            self.freed_seq[b] = s
            self.cand[b] = 1
            self.num_cand += 1
            self.expired[b] = 0
            p = default
            if self.has_hint[b]:
                if self.dur[b] >= 0:
                    self.until[b] = now_ns + self.dur[b]
                u = self.until[b]
                if u < 0 or now_ns < u:
                    p = self.hint[b]
                    if u >= 0:
                        self.pending[b] = 1
                        self.num_pending += 1
                        heappush(self.expiry, (u, s, b))
                else:
                    self.expired[b] = 1
            self.prio[b] = p
            heappush(self.heap, (p, self.cost[b], s, b))

    def select_victim(self, req: PolicyRequest, now_ns: int) -> Decision:
        h = self.heap
        while not self._live(h[0]):      # drop stale entries; the order is unchanged
            heappop(h)
        p, c, s, b = h[0]
        return Decision(victim=b, num_candidates=self.num_cand, position=0, queue="priority",
                        rank={"priority": p, "expired": bool(self.expired[b]),
                              "reuse_cost": c, "freed_seq": s})

    def on_evict(self, block: int) -> None:
        if self.cand[block]:
            self._drop(block)
        self.has_hint[block] = 0
        self.dur[block] = -1
        self.cost[block] = 0
        self.expired[block] = 0

    @property
    def num_candidates(self) -> int:
        return self.num_cand

    def candidates(self) -> list[int]:
        return [e[3] for e in sorted(self.heap) if self._live(e)]
