"""tlru: time-to-live LRU: a block not reused within its TTL goes first.

    ttl(r) = r.retention_s if the request gives one, else ttl_s
    on_admit(r, t):        now = t; expire(t)
    on_cached(b):          last_use[b] = now; expires[b] = now + ttl(r)
    on_hit(b):             last_use[b] = now; expires[b] = max(expires[b], now + ttl(r))
                           (the request that reuses b refreshes its TTL; a shorter one
                           never cuts short an earlier request's)
    on_free(blocks, t):    expire(t); freed_seq[b] = ++seq (vLLM's order: a request's
                           last block first); class[b] = EXPIRED if t >= expires[b] else
                           LIVE (then (expires[b], b) -> expiry heap); b -> leaves if
                           children[b] == 0 else -> nonleaf, keyed by (class[b], freed_seq)
    expire(t):             every candidate whose expires <= t moves LIVE -> EXPIRED,
                           keeping its freed_seq
    select_victim():       head of leaves: the least recently freed expired leaf, else the
                           least recently freed live one
                           none: head of nonleaf, marked ancestry_fallback (guard)
    on_evict(b):           p = parent of b; children[p] -= 1; if p is now a leaf and a
                           candidate: nonleaf -> leaves, at p's own key

Sources. The rule is issue 47's: expired blocks before unexpired ones, LRU within each.
Its TTL is prompt caching's: Anthropic's prompt cache keeps a prefix 5 minutes from its
last use, refreshed each time it is read (``ttl_s`` 300 by default; its longer tier is
1 h); Continuum (Li et al., arXiv:2511.02230) likewise retains a multi-turn program's KV
for a time-to-live, then lets it go (its TTL is computed per tool call from reload cost
and queueing delay; it has no fixed default). The two-phase shape, a class of blocks
that are safe to lose drained first in LRU order and then plain LRU, is T-LRU's (Zhang,
Li, Moallemi & Peng, "Tail-Optimized Caching for LLM Inference", NeurIPS 2025,
arXiv:2510.15152; SGLang's ``TLRUStrategy``). Beware the name: that paper's T-LRU is
*tail-optimized* LRU, whose safe class is a conversation's "TEL-safe" tail (tokens past
L + q_hat - xi that cannot bring its next turn under the TTFT budget; SGLang's
defaults: threshold 0, next_prompt_estimate 0, in tokens), not expired blocks; a
replay trace carries neither conversation lengths nor a TTFT budget, so that rule is not
what this policy implements.

Adapting it to a block pool (choices made here):

- A use is the admission of a request that computes or hits the block (the moment the
  prefix is read, as a prompt cache refreshes its TTL); it is not refreshed while the
  request runs or when it frees the block. So a block held by a long request expires
  sooner than one freshly reused, which is where tlru and ``lru`` part: lru ranks by the
  last free (vLLM's free-queue order), and tlru does too *within* each class. With no
  expired candidate tlru evicts exactly as lru does, and so it does with every
  candidate expired.
- Expiry is exact in trace time: a heap of end times is drained in ``on_admit`` (the
  engine calls it with the batch's time before any ``select_victim``) and in
  ``on_free``, as ``priority-lru`` does; an expired block keeps its freed_seq.
- Retention hints: a request's ``retention_s`` (SGLang's proposed soft retention time,
  sgl-project/sglang#27970 ``retention_seconds``: a node's protection lapses once it has
  been idle since its last access for longer than that; hits refresh it) is its TTL for
  every block it computes or hits, read in ``_ttl_ns(req)``; without one, ``ttl_s``. It
  is soft: an unexpired block is still evicted, after the expired ones, when nothing else
  is left (the engine's hard invariants, pinned blocks above all, are never touched). Two
  requests, two retention times: a block is kept until the latest end any of its uses
  asked for (``max(expires, now + ttl)``), i.e. "at least retention_s after each use";
  SGLang's proposal likewise keeps the stronger (longer) retention on a shared prefix.
  With one TTL for all (no ``retention_s`` in the trace) this is the plain refresh: the
  latest use's end is always the latest. ``priority``/``priority_until``/``retention``
  (priority levels, ``priority-lru``'s) are not used.
- A chain's leaf goes before its parent: leaves only, as SGLang's radix cache evicts.
  With prefix hits a parent is reused whenever its child is and freed after it, so it
  never expires earlier nor ranks earlier than the child; the leaf rule makes that hold
  across requests too. A block with a resident child (``LeafTracker``) is not eligible,
  and becomes eligible at its own key when its last child is evicted. That machinery is
  ``LeafCandidates`` (the policy API's, shared with the other leaf-first policies);
  tlru supplies the key, ``class << 40 | freed_seq``, and keeps its classes itself.
- Pinned blocks are never candidates (the engine only offers unpinned cached blocks).
- A non-leaf candidate while no leaf candidate exists is not reachable with prefix hits;
  kept as a guard, as in ``leaf-lru``.
- Ledger: queue ``expired`` or ``live`` (or ``ancestry-fallback``), position 0 (the
  head); rank ``expired``, ``idle_s`` (seconds since the last use, at the decision),
  ``ttl_s``, ``freed_seq`` and ``leaf``. ``candidates()`` lists the leaves in order, then
  the non-leaves, as of the last processed time.
"""

from __future__ import annotations

from array import array
from heapq import heapify, heappop, heappush
from typing import Any

from psgate.policy import (NS_PER_S, Decision, EvictionPolicy, LeafCandidates, PolicyRequest,
                          PoolInfo, SeqQueues)

EXPIRED, LIVE = 0, 1
CLASS_NAMES = ("expired", "live")
_SEQ_BITS = 40                 # freed_seq below 2**40; the class above it


class TLRUPolicy(EvictionPolicy):
    name = "tlru"
    api_version = 1
    summary = ("time-to-live LRU: leaves not reused within ttl_s (300 s, a prompt cache's "
               "5 minutes) go first, then LRU; LRU within each")
    defaults: dict[str, Any] = {"ttl_s": 300.0}
    max_blocks = SeqQueues.MASK        # the most blocks SeqQueues holds
    honours_hints = ("retention_s",)

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        ttl = self.params["ttl_s"]
        if type(ttl) not in (int, float) or not 0 < ttl <= 10 ** 9:
            raise ValueError(f"'ttl_s' must be a number of seconds in (0, 1e9], found {ttl!r}")
        self.ttl_ns = round(ttl * NS_PER_S)

    def bind(self, pool: PoolInfo) -> None:
        super().bind(pool)
        n = pool.num_blocks
        self.c = LeafCandidates(n)              # keyed (class, freed_seq)
        self.last_use = array("q", [0]) * n
        self.ttl = array("q", [0]) * n          # the TTL of the last use
        self.freed_seq = array("q", [0]) * n
        self.klass = bytearray(n)               # EXPIRED / LIVE while a candidate
        self.expiry: list[tuple[int, int, int]] = []     # (expires_ns, freed_seq, b)
        self.num_pending = 0                    # live candidates (entries in expiry)
        self.seq = 0
        self.now = 0

    # -- helpers ----------------------------------------------------------------
    def _ttl_ns(self, req: PolicyRequest) -> int:
        """The TTL a use by req gives a block: its ``retention_s``, else ``ttl_s``."""
        r = req.retention_ns
        return self.ttl_ns if r is None else r

    def _use(self, b: int, req: PolicyRequest, hit: bool) -> None:
        now = self.now
        ttl = self._ttl_ns(req)
        if hit:     # keep an earlier use's later end (ttl = its end - now)
            left = self.last_use[b] + self.ttl[b] - now
            if left > ttl:
                ttl = left
        self.last_use[b] = now
        self.ttl[b] = ttl

    def _expire(self, now_ns: int) -> None:
        ex = self.expiry
        if not ex or ex[0][0] > now_ns:
            return
        c, klass, freed = self.c, self.klass, self.freed_seq
        cand = c.cand
        while ex and ex[0][0] <= now_ns:
            _, s, b = heappop(ex)
            if not (cand[b] and klass[b] == LIVE and freed[b] == s):
                continue
            self.num_pending -= 1
            klass[b] = EXPIRED
            c.rekey(b, s)                       # (EXPIRED << 40) | freed_seq

    def _dropped(self, b: int) -> None:
        """b stopped being a candidate: a live one leaves the pending count (its expiry
        entry goes stale; the heap is compacted when mostly stale)."""
        if self.klass[b] == LIVE:
            self.num_pending -= 1
            if len(self.expiry) > 2 * self.num_pending + 32:
                cand, klass, freed = self.c.cand, self.klass, self.freed_seq
                self.expiry = [e for e in self.expiry
                               if cand[e[2]] and klass[e[2]] == LIVE and freed[e[2]] == e[1]]
                heapify(self.expiry)

    # -- events ---------------------------------------------------------------
    def on_admit(self, req: PolicyRequest, now_ns: int) -> None:
        self.now = now_ns
        self._expire(now_ns)

    def on_cached(self, block: int, req: PolicyRequest, pos: int, parent: int,
                  key: int = -1) -> None:
        self.c.cached(block, parent)
        self._use(block, req, False)

    def on_hit(self, block: int, req: PolicyRequest, pos: int) -> None:
        self._use(block, req, True)

    def on_free(self, blocks: list[int], now_ns: int) -> None:
        self._expire(now_ns)
        push, freed = self.c.push, self.freed_seq
        klass, last_use, ttl, ex = self.klass, self.last_use, self.ttl, self.expiry
        s = self.seq
        for b in blocks:
            s += 1
            freed[b] = s
            end = last_use[b] + ttl[b]
            if now_ns >= end:
                klass[b] = EXPIRED
                key = s
            else:
                klass[b] = LIVE
                key = (LIVE << _SEQ_BITS) | s
                heappush(ex, (end, s, b))
                self.num_pending += 1
            push(b, key)
        self.seq = s

    def on_touch(self, block: int) -> None:
        self.c.remove(block)
        self._dropped(block)

    def select_victim(self, req: PolicyRequest, now_ns: int) -> Decision:
        return self.c.decision(
            lambda b, leaf: {"expired": self.klass[b] == EXPIRED,
                             "idle_s": (now_ns - self.last_use[b]) / NS_PER_S,
                             "ttl_s": self.ttl[b] / NS_PER_S,
                             "freed_seq": self.freed_seq[b], "leaf": leaf},
            queue=lambda b: CLASS_NAMES[self.klass[b]])

    def on_evict(self, block: int) -> None:
        if self.c.evicted(block):  # a parent left a leaf goes back at its own key
            self._dropped(block)

    # -- views ----------------------------------------------------------------
    @property
    def num_candidates(self) -> int:
        return self.c.num

    def candidates(self) -> list[int]:
        return self.c.items()
