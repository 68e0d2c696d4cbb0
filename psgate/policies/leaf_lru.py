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
  O(log n) per event. The tree, the two queues and the candidate count are
  ``LeafCandidates`` (the policy API's, shared with the other leaf-first policies:
  fifo, mru, lfu, slru, tlru); this module supplies only the key, freed_seq.
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

from psgate.policy import (Decision, EvictionPolicy, LeafCandidates, PolicyRequest, PoolInfo,
                          SeqQueues)


class LeafLRUPolicy(EvictionPolicy):
    name = "leaf-lru"
    api_version = 1
    summary = "least recently used leaf: only blocks with no resident child are evicted"
    defaults = {}
    max_blocks = SeqQueues.MASK        # the most blocks SeqQueues holds

    def bind(self, pool: PoolInfo) -> None:
        super().bind(pool)
        n = pool.num_blocks
        self.c = LeafCandidates(n)             # keyed by freed_seq
        self.tree = self.c.tree
        self.freed_seq = array("q", [0]) * n
        self.seq = 0

    def on_cached(self, block: int, req: PolicyRequest, pos: int, parent: int,
                  key: int = -1) -> None:
        self.c.cached(block, parent)

    def on_free(self, blocks: list[int], now_ns: int) -> None:
        push, freed = self.c.push, self.freed_seq
        s = self.seq
        for b in blocks:
            s += 1
            freed[b] = s
            push(b, s)
        self.seq = s

    def on_touch(self, block: int) -> None:
        self.c.remove(block)

    def select_victim(self, req: PolicyRequest, now_ns: int) -> Decision:
        freed = self.freed_seq
        return self.c.decision(lambda b, leaf: {"freed_seq": freed[b], "leaf": leaf})

    def on_evict(self, block: int) -> None:
        self.c.evicted(block)

    @property
    def num_candidates(self) -> int:
        return self.c.num

    def candidates(self) -> list[int]:
        return self.c.items()
