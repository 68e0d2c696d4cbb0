"""fifo: first cached, first out, whatever the hits (SGLang's FIFOStrategy, LMCache's FIFO).

    on_cached(b, parent):  cached_seq[b] = ++seq; children[parent] += 1   (LeafTracker)
    on_hit(b):             nothing: a hit does not move a block
    on_free(blocks):       b -> leaves if children[b] == 0 else -> nonleaf, keyed by
                           cached_seq[b] (its place never changes while it is cached)
    on_touch(b):           b leaves whichever queue holds it
    select_victim():       head of leaves (smallest cached_seq)
                           none: head of nonleaf, marked ancestry_fallback (guard)
    on_evict(b):           p = parent of b; children[p] -= 1; if p is now a leaf and a
                           candidate: nonleaf -> leaves, at p's own cached_seq

Source: SGLang's radix cache with ``--radix-eviction-policy fifo`` (``FIFOStrategy``:
priority = the node's ``creation_time``, smallest first; no parameters) and LMCache's
``cache_policy="FIFO"`` (insertion order, no parameters).

Adapting it to a block pool (choices made here):

- First in = first *cached*: a block's place is the order in which it was computed
  (``on_cached``), a counter, so equal trace times never tie. A hit, a free or a pin
  does not move it; a block evicted and computed again is a new block at the tail.
- Leaves only, as SGLang's radix cache evicts (it collects the tree's leaves and pushes
  a parent once its last child is gone). A request's chain is cached root first, so a
  plain FIFO would take a chain's root before the blocks computed on top of it and
  orphan them; here a chain's leaf goes before its parent: a block with a resident
  child (``LeafTracker``: the block its request held at the previous position) is not
  eligible, and becomes eligible at its own FIFO place when its last child is evicted.
  Among leaves the order is strictly FIFO.
- Pinned blocks are never candidates (the engine only offers unpinned cached blocks);
  a block pinned at its turn simply keeps its place until it is a candidate again.
- A non-leaf candidate while no leaf candidate exists is not reachable with prefix hits
  (a pinned child has a pinned parent); kept as a guard, as in ``leaf-lru``: the oldest
  non-leaf is evicted and its row says ``ancestry_fallback``.
- The tree and the leaf / non-leaf queues are ``LeafCandidates`` (the policy API's,
  shared with the other leaf-first policies): ``SeqQueues`` (heaps, lazy removal),
  keyed here ``cached_seq << 22 | the block's free count mod 2**22``: the count never
  decides the order (FIFO places are unique), it only tells a re-freed block's entry
  from its stale one.
- Ledger: queue ``leaf`` (or ``ancestry-fallback``), position 0 (the head); rank
  ``cached_seq`` (the block's FIFO place) and ``leaf``. ``candidates()`` lists the
  leaves in order, then the non-leaves.
"""

from __future__ import annotations

from array import array

from psgate.policies.leaf_lru import LeafLRUPolicy
from psgate.policy import Decision, PolicyRequest, PoolInfo

# A queue's entries are lazy: a block freed again at an unchanged FIFO place needs a new
# key, or its stale entry would look live. The low bits count the block's frees.
_STAMP_BITS = 22
_STAMP_MASK = (1 << _STAMP_BITS) - 1


class FIFOPolicy(LeafLRUPolicy):
    """leaf-lru's candidates, ordered by when each block was cached instead of freed."""

    name = "fifo"
    api_version = 1
    summary = ("first cached, first out, hits ignored (SGLang fifo, LMCache FIFO); "
               "leaves only, a chain's leaf before its parent")
    defaults = {}

    def bind(self, pool: PoolInfo) -> None:
        super().bind(pool)              # self.c keyed cached_seq << 22 | frees
        n = pool.num_blocks
        self.cached_seq = array("q", [0]) * n
        self.frees = array("I", [0]) * n        # per block, to tell its heap entries apart

    # -- events ---------------------------------------------------------------
    def on_cached(self, block: int, req: PolicyRequest, pos: int, parent: int,
                  key: int = -1) -> None:
        self.c.cached(block, parent)
        self.seq += 1
        self.cached_seq[block] = self.seq

    def on_free(self, blocks: list[int], now_ns: int) -> None:
        push, cseq, frees = self.c.push, self.cached_seq, self.frees
        for b in blocks:
            f = frees[b] = (frees[b] + 1) & _STAMP_MASK
            push(b, (cseq[b] << _STAMP_BITS) | f)

    def select_victim(self, req: PolicyRequest, now_ns: int) -> Decision:
        cseq = self.cached_seq
        return self.c.decision(lambda b, leaf: {"cached_seq": cseq[b], "leaf": leaf})
