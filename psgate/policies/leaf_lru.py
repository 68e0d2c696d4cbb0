"""leaf-lru: evict the least recently used *leaf* (TensorRT-LLM / SGLang radix-tree style).

    on_cached(b, parent):  children[parent] += 1   (LeafTracker)
    on_free(blocks):       freed_seq[b] = ++seq; b -> leaves if children[b] == 0
                                                   else -> nonleaf (not eligible)
    on_touch(b):           b leaves whichever queue holds it
    select_victim():       head of leaves (smallest freed_seq)
                           none: head of nonleaf, marked ancestry_fallback (guard)
    on_evict(b):           p = parent of b; children[p] -= 1
                           if p is now a leaf and a candidate: nonleaf -> leaves,
                           at p's own freed_seq (not the tail)

Choices:
- Recency is the block's last free (vLLM's free-queue order), so among leaves the
  order is exactly ``lru``'s. A parent whose last resident child is evicted becomes
  eligible at its own position: both queues are ``SeqQueues`` (heaps by freed_seq),
  O(log n) per event.
- "Child" is the tree the requests built: the block a request held at the previous
  position when the block was cached (``LeafTracker``, guarded by a generation
  counter against reused block ids). Evicting only leaves never orphans a block.
- In sim and vllm-pool a request pins a block's whole prefix and frees its blocks
  last first, so a parent is never freed before its children and the LRU head is
  always a leaf: leaf-lru then evicts exactly as lru does. It differs where event
  orders do (another engine, or a policy-level event stream), and it is the
  leaf-only guarantee that the ledger states.
- A candidate that is not a leaf while no leaf candidate exists is not reachable
  with prefix hits (a pinned child has a pinned parent); kept as a guard: the
  oldest non-leaf is evicted and its row says ``ancestry_fallback``.
- Ledger: queue ``leaf`` (or ``ancestry-fallback``), position 0 (the head);
  ``candidates()`` lists the leaves in order, then the non-leaves.
"""

from __future__ import annotations

from array import array

from psgate.policy import (Decision, EvictionPolicy, LeafTracker, PolicyRequest, PoolInfo,
                          SeqQueues)

LEAVES, NONLEAF = 0, 1


class LeafLRUPolicy(EvictionPolicy):
    name = "leaf-lru"
    api_version = 1
    summary = "least recently used leaf: only blocks with no resident child are evicted"
    defaults = {}

    def bind(self, pool: PoolInfo) -> None:
        super().bind(pool)
        n = pool.num_blocks
        self.tree = LeafTracker(n)
        self.q = SeqQueues(n, 2)
        self.freed_seq = array("q", [0]) * n
        self.cand = bytearray(n)
        self.seq = 0
        self.num_cand = 0

    def on_cached(self, block: int, req: PolicyRequest, pos: int, parent: int,
                  key: int = -1) -> None:
        self.tree.cached(block, parent)

    def on_free(self, blocks: list[int], now_ns: int) -> None:
        tree, q, freed, cand = self.tree, self.q, self.freed_seq, self.cand
        for b in blocks:
            self.seq += 1
            freed[b] = self.seq
            cand[b] = 1
            q.push(LEAVES if tree.is_leaf(b) else NONLEAF, b, self.seq)
        self.num_cand += len(blocks)

    def on_touch(self, block: int) -> None:
        self.q.remove(block)
        self.cand[block] = 0
        self.num_cand -= 1

    def select_victim(self, req: PolicyRequest, now_ns: int) -> Decision:
        q = self.q
        b = q.head(LEAVES)
        if b >= 0:
            return Decision(victim=b, num_candidates=self.num_cand, position=0, queue="leaf",
                            segments={"leaf": q.live[LEAVES], "nonleaf": q.live[NONLEAF]},
                            rank={"freed_seq": self.freed_seq[b], "leaf": True})
        b = q.head(NONLEAF)     # guard, see the module docstring
        return Decision(victim=b, num_candidates=self.num_cand, position=0,
                        queue="ancestry-fallback",
                        segments={"leaf": 0, "nonleaf": q.live[NONLEAF]},
                        rank={"freed_seq": self.freed_seq[b], "leaf": False,
                              "ancestry_fallback": True})

    def on_evict(self, block: int) -> None:
        q = self.q
        if self.cand[block]:
            q.remove(block)
            self.cand[block] = 0
            self.num_cand -= 1
        parent = self.tree.evicted(block)
        if parent >= 0 and self.cand[parent] and q.where[parent] == NONLEAF:
            q.remove(parent)
            q.push(LEAVES, parent, self.freed_seq[parent])

    @property
    def num_candidates(self) -> int:
        return self.num_cand

    def candidates(self) -> list[int]:
        return self.q.items(LEAVES) + self.q.items(NONLEAF)
