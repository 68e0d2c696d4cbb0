"""lfu: least frequently used, with aging, ties least recently used first.

    W = round(aging_factor x usable blocks)   (accesses per aging period; 0: never age)
    on_cached(b, parent):  freq[b] = 0; accesses += 1;  children[parent] += 1  (LeafTracker)
    on_hit(b):             freq[b] += 1; accesses += 1
                           if accesses >= W: every cached block's freq halves (floor),
                                             accesses = 0
    on_free(blocks):       freed_seq[b] = ++seq (vLLM's order: a request's last block first);
                           b -> leaves if children[b] == 0 else -> nonleaf,
                           keyed by (freq[b], freed_seq[b])
    on_touch(b):           b leaves whichever queue holds it
    select_victim():       head of leaves: smallest freq, then least recently freed
                           none: head of nonleaf, marked ancestry_fallback (guard)
    on_evict(b):           p = parent of b; children[p] -= 1; if p is now a leaf and a
                           candidate: nonleaf -> leaves, at p's own key

Sources. The ranking is SGLang's ``LFUStrategy`` (``--radix-eviction-policy lfu``):
priority ``(hit_count, last_access_time)``, a node's hit count starting at 0 and
growing by one per request that matches it, ties least recently used first; LMCache's
``cache_policy="LFU"`` ranks by frequency too (ties in insertion order). Neither ages
its counts: a block hit often long ago then outlives everything. The aging followed
here is TinyLFU's reset (Einziger, Friedman & Manes, "TinyLFU: A Highly Efficient Cache
Admission Policy", ACM ToS 2017), as Caffeine's W-TinyLFU implements it: after a sample
of W accesses every counter is halved, W = 10 x the cache's maximum size
(``aging_factor`` 10, the paper's and Caffeine's default).

Adapting it to a block pool (choices made here):

- A hit is an ``on_hit`` (one per request that reuses the block); computing a block is
  an access (it counts toward W) but not a hit, so a block starts at 0 as in SGLang.
  Counts persist across pin/unpin and end with the block's eviction.
- Aging is by accesses, not by time: W counts cachings and hits together (TinyLFU's
  sample counts every access). A halving is ``freq >>= 1`` on every cached block,
  pinned ones included, and re-keys the candidates: O(n log n) every W = 10 x usable
  accesses, amortized O(log n) per access. Halving keeps the order of counts (it may
  make new ties, which recency then breaks).
- Recency is the block's last free, as ``lru``'s (vLLM's free-queue order); a counter,
  so nothing else ties.
- A chain's leaf goes before its parent: leaves only, as SGLang's radix cache evicts (it
  collects the tree's leaves and pushes a parent once its last child is gone). With
  prefix hits a parent is hit whenever its child is and freed after it, so among the
  blocks of one chain the leaf already ranks first; the leaf rule makes it hold after
  aging ties and across requests too. A block with a resident child (``LeafTracker``)
  is not eligible, and becomes eligible at its own key when its last child is evicted.
  That machinery is ``LeafCandidates`` (the policy API's, shared with the other
  leaf-first policies); lfu supplies the key, ``freq << 40 | freed_seq``.
- Pinned blocks are never candidates (the engine only offers unpinned cached blocks).
- A non-leaf candidate while no leaf candidate exists is not reachable with prefix hits
  (a pinned child has a pinned parent); kept as a guard, as in ``leaf-lru``.
- Ledger: queue ``leaf`` (or ``ancestry-fallback``), position 0 (the head); rank
  ``freq`` (after any halving), ``freed_seq``, ``leaf`` and ``agings`` (how many
  halvings so far). ``candidates()`` lists the leaves in order, then the non-leaves.
"""

from __future__ import annotations

from array import array
from typing import Any

from psgate.policy import (Decision, EvictionPolicy, LeafCandidates, PolicyRequest, PoolInfo,
                          SeqQueues)

_SEQ_BITS = 40                 # freed_seq below 2**40; the count above it
MAX_FREQ = (1 << 21) - 1       # a key stays below 2**61


class LFUPolicy(EvictionPolicy):
    name = "lfu"
    api_version = 1
    summary = ("least frequently used leaf (SGLang lfu: hit count, then least recently "
               "used); counts halve every aging_factor x usable accesses (TinyLFU reset, 10)")
    defaults: dict[str, Any] = {"aging_factor": 10}
    max_blocks = SeqQueues.MASK        # the most blocks SeqQueues holds

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        af = self.params["aging_factor"]
        if type(af) not in (int, float) or af < 0:
            raise ValueError(f"'aging_factor' must be a number >= 0 (0: never age), "
                             f"found {af!r}")

    def bind(self, pool: PoolInfo) -> None:
        super().bind(pool)
        n = pool.num_blocks
        self.c = LeafCandidates(n)      # keyed (freq, freed_seq)
        self.freq = array("i", [0]) * n
        self.freed_seq = array("q", [0]) * n
        self.seq = 0
        af = self.params["aging_factor"]
        self.period = max(1, round(af * pool.num_usable)) if af > 0 else 0
        self.accesses = 0
        self.agings = 0

    # -- aging ----------------------------------------------------------------
    def _age(self) -> None:
        """Halve every count; the candidates whose key changed go back at their new one."""
        self.accesses = 0
        self.agings += 1
        old = self.freq
        self.freq = freq = array("i", [f >> 1 for f in old])
        c, freed = self.c, self.freed_seq
        cand, rekey = c.cand, c.rekey
        for b in range(len(old)):
            if cand[b] and old[b]:
                rekey(b, (freq[b] << _SEQ_BITS) | freed[b])

    # -- events ---------------------------------------------------------------
    def on_cached(self, block: int, req: PolicyRequest, pos: int, parent: int,
                  key: int = -1) -> None:
        self.c.cached(block, parent)
        self.freq[block] = 0
        if self.period:
            self.accesses += 1
            if self.accesses >= self.period:
                self._age()

    def on_hit(self, block: int, req: PolicyRequest, pos: int) -> None:
        freq = self.freq
        if freq[block] < MAX_FREQ:
            freq[block] += 1
        if self.period:
            self.accesses += 1
            if self.accesses >= self.period:
                self._age()

    def on_free(self, blocks: list[int], now_ns: int) -> None:
        push, freed, freq = self.c.push, self.freed_seq, self.freq
        s = self.seq
        for b in blocks:
            s += 1
            freed[b] = s
            push(b, (freq[b] << _SEQ_BITS) | s)
        self.seq = s

    def on_touch(self, block: int) -> None:
        self.c.remove(block)

    def select_victim(self, req: PolicyRequest, now_ns: int) -> Decision:
        return self.c.decision(lambda b, leaf: {
            "freq": self.freq[b], "freed_seq": self.freed_seq[b], "leaf": leaf,
            "agings": self.agings})

    def on_evict(self, block: int) -> None:
        self.c.evicted(block)      # a parent left a leaf goes back at its own key

    # -- views ----------------------------------------------------------------
    @property
    def num_candidates(self) -> int:
        return self.c.num

    def candidates(self) -> list[int]:
        return self.c.items()
