"""mru: most recently used first (SGLang's MRUStrategy, LMCache's MRU).

    on_cached(b, parent):  children[parent] += 1                          (LeafTracker)
    on_free(blocks):       freed_seq[b] = ++seq, in vLLM's order (a request's last
                           block first); b -> leaves if children[b] == 0 else -> nonleaf,
                           keyed by -freed_seq[b]
    on_touch(b):           b leaves whichever queue holds it
    select_victim():       head of leaves (largest freed_seq: the most recently used)
                           none: head of nonleaf, marked ancestry_fallback (guard)
    on_evict(b):           p = parent of b; children[p] -= 1; if p is now a leaf and a
                           candidate: nonleaf -> leaves, at p's own -freed_seq

Source: SGLang's radix cache with ``--radix-eviction-policy mru`` (``MRUStrategy``:
priority = ``-last_access_time``, so the most recently accessed leaf goes first; no
parameters) and LMCache's ``cache_policy="MRU"`` (the most recently used chunk goes
first; no parameters). MRU suits cyclic scans larger than the cache, where the block
used last is the one needed furthest in the future.

Adapting it to a block pool (choices made here):

- Recency is the block's last free, as ``lru``'s (vLLM's free-queue order): a block is
  in use while pinned, and its use ends when its last holder releases it. ``freed_seq``
  is a counter, so equal trace times never tie. mru's order among leaves is exactly the
  reverse of ``lru``'s.
- Leaves only, as SGLang's radix cache evicts (it collects the tree's leaves and pushes
  a parent once its last child is gone). vLLM frees a request's blocks last block
  first, so a request's *root* is its most recently freed block: a plain MRU would take
  it first and orphan the whole chain. Here a chain's leaf goes before its parent: a
  block with a resident child (``LeafTracker``: the block its request held at the
  previous position) is not eligible, and becomes eligible at its own place when its
  last child is evicted, i.e. mru eats the most recently used chain from its tail.
  That machinery is ``LeafCandidates`` (the policy API's, shared with the other
  leaf-first policies); mru supplies the key, ``_TOP - freed_seq``.
- Pinned blocks are never candidates (the engine only offers unpinned cached blocks).
- A non-leaf candidate while no leaf candidate exists is not reachable with prefix hits
  (a pinned child has a pinned parent); kept as a guard, as in ``leaf-lru``: the most
  recently freed non-leaf is evicted and its row says ``ancestry_fallback``.
- Ledger: queue ``leaf`` (or ``ancestry-fallback``), position 0 (the head); rank
  ``freed_seq`` (larger = more recent) and ``leaf``. ``candidates()`` lists the leaves
  in eviction order, then the non-leaves.
"""

from __future__ import annotations

from psgate.policies.leaf_lru import LeafLRUPolicy

_TOP = 1 << 62          # keys are _TOP - freed_seq: the most recent has the smallest key


class MRUPolicy(LeafLRUPolicy):
    """leaf-lru's candidates and decisions, in the reverse order of release."""

    name = "mru"
    api_version = 1
    summary = ("most recently used first (SGLang mru, LMCache MRU): the most recently "
               "freed leaf; a chain's leaf before its parent")
    defaults = {}

    def on_free(self, blocks: list[int], now_ns: int) -> None:
        push, freed = self.c.push, self.freed_seq
        s = self.seq
        for b in blocks:
            s += 1
            freed[b] = s
            push(b, _TOP - s)
        self.seq = s
