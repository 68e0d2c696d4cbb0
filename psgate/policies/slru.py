"""slru: segmented LRU, a probationary and a protected segment (Karedla et al. 1994).

    cap = round(protected_ratio x usable blocks)     (the protected segment's size)
    P, R: probationary and protected segments, each an LRU list of every cached block
          in it (pinned ones included); touch(b) = rec[b] = ++seq, b -> MRU end of its list
    on_cached(b, parent):  b -> P; touch(b);  children[parent] += 1         (LeafTracker)
    on_hit(b):             if b in P:  b -> R (promotion)
                                       while |R| > cap: d = R's LRU end; d -> P's MRU end
                           touch(b)
    on_free(blocks):       touch(b), in vLLM's order (a request's last block first);
                           b -> leaves if children[b] == 0 else -> nonleaf,
                           keyed by (segment[b], rec[b])
    on_touch(b):           b leaves whichever queue holds it
    select_victim():       head of leaves: P's least recent leaf, else R's least recent
                           none: head of nonleaf, marked ancestry_fallback (guard)
    on_evict(b):           b leaves its segment; p = parent of b; children[p] -= 1; if p
                           is now a leaf and a candidate: nonleaf -> leaves, at p's own key

Sources. SLRU is Karedla, Love & Wherry, "Caching strategies to improve disk system
performance" (IEEE Computer 27(3), 1994): a miss enters the probationary segment, a hit
there promotes to the protected segment's MRU end, the protected segment's overflow is
demoted to the probationary segment's MRU end, victims come from the probationary
segment's LRU end. The protected share is a parameter there; ``protected_ratio`` 0.8 is
Caffeine's W-TinyLFU default, whose main space is this SLRU with 80% protected
(``PERCENT_MAIN_PROTECTED = 0.80``; Einziger, Friedman & Manes, ACM ToS 2017). SGLang's
``SLRUStrategy`` is a different, uncapped reading (``protected_threshold`` 2: a node hit
at least twice ranks as protected, no size limit, no demotion); it is not followed here.

Adapting it to a block pool (choices made here):

- Segments hold every cached block, pinned ones included (as the paper's segments hold
  every cached object); membership and recency persist across pin/unpin. The protected
  size counts its pinned blocks, so demotion may move a pinned block to probation.
- An access is a hit (``on_hit``, one per request reusing the block), the computing of
  the block, and its last free: recency is the block's last free, as ``lru``'s (vLLM's
  free-queue order), so with ``protected_ratio`` 0 (every promotion demoted at once)
  slru evicts as ``lru`` does. A demoted block takes a fresh recency at P's MRU end.
- The victim is P's least recent candidate; R's only when P holds no candidate (the
  paper evicts from P, and R's overflow always refills it, unless every block in P is
  pinned).
- A chain's leaf goes before its parent: leaves only, as SGLang's radix cache evicts.
  With prefix hits a parent is promoted whenever its child is and used after it, so it
  already ranks after the child; the leaf rule makes that hold across requests too. A
  block with a resident child (``LeafTracker``) is not eligible, and becomes eligible
  at its own key when its last child is evicted. That machinery is ``LeafCandidates``
  (the policy API's, shared with the other leaf-first policies); slru supplies the key,
  ``segment << 40 | recency``, and keeps its segments itself.
- Pinned blocks are never candidates (the engine only offers unpinned cached blocks).
- A non-leaf candidate while no leaf candidate exists is not reachable with prefix hits;
  kept as a guard, as in ``leaf-lru``.
- Ledger: queue ``probationary`` or ``protected`` (or ``ancestry-fallback``), position 0
  (the head); rank ``protected`` (the victim's segment), ``recency_seq``, ``leaf``,
  ``protected_size`` and ``protected_cap``. ``candidates()`` lists the leaves in order,
  then the non-leaves.
"""

from __future__ import annotations

from array import array
from typing import Any

from psgate.policy import (BlockQueues, Decision, EvictionPolicy, LeafCandidates,
                          PolicyRequest, PoolInfo, SeqQueues)

PROB, PROT = 0, 1
SEGMENT_NAMES = ("probationary", "protected")
_SEQ_BITS = 40                 # recency below 2**40; the segment above it


class SLRUPolicy(EvictionPolicy):
    name = "slru"
    api_version = 1
    summary = ("segmented LRU (Karedla et al. 1994): a hit in probation promotes to a "
               "protected segment of protected_ratio x usable (0.8, Caffeine's W-TinyLFU); "
               "victims from probation first, leaves only")
    defaults: dict[str, Any] = {"protected_ratio": 0.8}
    max_blocks = SeqQueues.MASK        # the most blocks SeqQueues holds

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        pr = self.params["protected_ratio"]
        if type(pr) not in (int, float) or not 0 <= pr < 1:
            raise ValueError(f"'protected_ratio' must be a number in [0, 1), found {pr!r}")

    def bind(self, pool: PoolInfo) -> None:
        super().bind(pool)
        n = pool.num_blocks
        self.c = LeafCandidates(n)              # candidates, by (segment, recency)
        self.seg = BlockQueues(n, 2)            # every cached block, in recency order
        self.rec = array("q", [0]) * n
        self.seq = 0
        self.cap = round(self.params["protected_ratio"] * pool.num_usable)

    # -- helpers ----------------------------------------------------------------
    def _demote_overflow(self) -> None:
        seg, c, rec = self.seg, self.c, self.rec
        while seg.sizes[PROT] > self.cap:
            d = seg.head(PROT)
            seg.remove(d)
            seg.append(PROB, d)
            self.seq += 1
            rec[d] = self.seq
            if c.cand[d]:
                c.rekey(d, self.seq)        # (PROB << 40) | seq

    # -- events ---------------------------------------------------------------
    def on_cached(self, block: int, req: PolicyRequest, pos: int, parent: int,
                  key: int = -1) -> None:
        self.c.cached(block, parent)
        self.seg.append(PROB, block)
        self.seq += 1
        self.rec[block] = self.seq

    def on_hit(self, block: int, req: PolicyRequest, pos: int) -> None:
        seg = self.seg
        s = seg.where[block]
        if s >= 0:
            seg.remove(block)
        seg.append(PROT, block)
        self.seq += 1
        self.rec[block] = self.seq
        if s != PROT:
            self._demote_overflow()

    def on_free(self, blocks: list[int], now_ns: int) -> None:
        push, rec = self.c.push, self.rec
        seg = self.seg
        where, remove, append = seg.where, seg.remove, seg.append
        s = self.seq
        for b in blocks:
            s += 1
            rec[b] = s
            w = where[b]
            if w < 0:           # never cached here (a guard): it enters probation
                w = PROB
            else:
                remove(b)
            append(w, b)
            push(b, (w << _SEQ_BITS) | s)
        self.seq = s

    def on_touch(self, block: int) -> None:
        self.c.remove(block)

    def select_victim(self, req: PolicyRequest, now_ns: int) -> Decision:
        seg = self.seg
        return self.c.decision(
            lambda b, leaf: {"protected": seg.where[b] == PROT, "recency_seq": self.rec[b],
                             "leaf": leaf, "protected_size": seg.sizes[PROT],
                             "protected_cap": self.cap},
            queue=lambda b: SEGMENT_NAMES[seg.where[b]])

    def on_evict(self, block: int) -> None:
        self.c.evicted(block)      # a parent left a leaf goes back at its own key
        if self.seg.where[block] >= 0:
            self.seg.remove(block)

    # -- views ----------------------------------------------------------------
    @property
    def num_candidates(self) -> int:
        return self.c.num

    def candidates(self) -> list[int]:
        return self.c.items()
