"""arc: Adaptive Replacement Cache (Megiddo & Modha, FAST'03) over the candidate blocks.

    c = usable blocks; T1 (seen once), T2 (seen again): cached blocks, each an LRU list;
    B1, B2: ghost LRU lists of the content keys last evicted from T1, T2; p: T1's target
    (0 <= p <= c, starts at 0).  The paper's only parameter is c; there is nothing to set.

    on_cached(b, key):                               (a miss: the content is computed)
        key in B1:  p = min(c, p + max(|B2| / |B1|, 1));  B1 -= key;  b -> T2
        key in B2:  p = max(0, p - max(|B1| / |B2|, 1));  B2 -= key;  b -> T2
        else:       b -> T1;  drop B1's LRU while |T1| + |B1| > c,
                              drop B2's LRU while |T1| + |T2| + |B1| + |B2| > 2c
    on_hit(b):      b -> T2                          (a hit, from T1 or T2)
    on_free(b):     b -> MRU end of its list's candidates (a request's last block first)
    evict():        REPLACE: list = T1 if |T1| > p else T2   (|T1| >= 1 follows from p >= 0)
                    victim = that list's LRU candidate, else the other list's;
                    its key -> MRU of B1 (from T1) or B2 (from T2)

Sources: the paper (Fig. 4 pseudocode, p adapted on ghost hits by the ratio of the ghost
sizes), the LMCache ARC policy and an open vLLM proposal to use ARC for the GPU prefix
cache. Adapting the page cache to a block pool (choices made here):

- A ghost is content that was evicted, so B1 and B2 hold content keys (the block's chain
  hash in its namespace, ``on_cached``'s ``key``), never block ids: a block id is reused
  for other content as soon as it is evicted.
- Pinned blocks (in use by running requests) are in the cache, so they count toward
  |T1| and |T2| (and the directory bounds |T1| + |B1| <= c, total <= 2c), as every
  cached page does in the paper: p is a target for T1's share of the cache, and a T1
  full of pinned blocks does hold that share. They are never candidates: REPLACE picks a
  list by the sizes, then takes that list's least recently used *unpinned* block; when
  every block of the chosen list is pinned it takes the other list's (``fallback`` in
  the ledger) rather than evicting a pinned block the paper would have picked.
- Recency is the order of release (``on_free``, vLLM's free-queue order), as for lru:
  a pinned block is in use, so its LRU position is set when its last user drops it. A
  request's blocks are released last block first, so within a list a chain's leaf goes
  before its parent (the paper says nothing about chains).
- The paper adapts p before REPLACE runs for the missing page. Here the engine evicts
  for a whole allocation batch before it caches the batch's blocks, so p moves when a
  ghost's content is computed again (``on_cached``), after the evictions that made room
  for it. For the same reason REPLACE has no incoming page: the paper's tie rule
  (``x in B2 and |T1| = p`` takes T1) is dropped, and a tie takes T2.
- A hit is an ``on_hit`` (one per request reusing the block, pinned or not): the block
  moves to T2 even when another request holds it.
- Ledger: ``queue`` is T1 or T2 (the list the victim came from), position 0 (its LRU
  end); rank holds ``list``, ``p``, the four sizes and whether REPLACE's list had no
  candidate (``fallback``). ``candidates()`` lists REPLACE's list first, then the other.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from typing import Any

from psgate.policy import BlockQueues, Decision, EvictionPolicy, PolicyRequest, PoolInfo

T1, T2 = 0, 1
NAMES = ("T1", "T2")


class ARCPolicy(EvictionPolicy):
    name = "arc"
    api_version = 1
    summary = ("ARC (FAST'03): recency list T1, frequency list T2, ghost lists B1/B2 of "
               "evicted content, T1 target p adapted on ghost hits; pinned blocks count, "
               "never evicted; no parameters")
    defaults: dict[str, Any] = {}

    def bind(self, pool: PoolInfo) -> None:
        super().bind(pool)
        n = pool.num_blocks
        self.c = pool.num_usable
        self.lst = array("b", [-1]) * n          # T1 / T2 while cached, else -1
        self.key = array("q", [-1]) * n
        self.q = BlockQueues(n, 2)               # candidates of T1 and T2, LRU first
        self.size = [0, 0]                       # cached blocks per list, pinned included
        self.b1: OrderedDict[int, None] = OrderedDict()   # LRU first
        self.b2: OrderedDict[int, None] = OrderedDict()
        self.p = 0.0

    # -- events ---------------------------------------------------------------
    def on_cached(self, block: int, req: PolicyRequest, pos: int, parent: int,
                  key: int = -1) -> None:
        b1, b2, c = self.b1, self.b2, self.c
        if key >= 0 and key in b1:
            self.p = min(float(c), self.p + max(len(b2) / len(b1), 1.0))
            del b1[key]
            lst = T2
        elif key >= 0 and key in b2:
            self.p = max(0.0, self.p - max(len(b1) / len(b2), 1.0))
            del b2[key]
            lst = T2
        else:
            lst = T1
        self.lst[block] = lst
        self.key[block] = key
        size = self.size
        size[lst] += 1
        while b1 and size[T1] + len(b1) > c:
            b1.popitem(last=False)
        while b2 and size[T1] + size[T2] + len(b1) + len(b2) > 2 * c:
            b2.popitem(last=False)

    def on_hit(self, block: int, req: PolicyRequest, pos: int) -> None:
        if self.lst[block] == T1:
            self.lst[block] = T2
            self.size[T1] -= 1
            self.size[T2] += 1

    def on_touch(self, block: int) -> None:
        self.q.remove(block)

    def on_free(self, blocks: list[int], now_ns: int) -> None:
        q, lst = self.q, self.lst
        for b in blocks:
            li = lst[b]
            if li < 0:                       # cached without on_cached: a T1 block
                lst[b] = li = T1
                self.size[T1] += 1
            q.append(li, b)

    def _choose(self) -> tuple[int, int, int, bool]:
        """(victim, its list, REPLACE's list, fallback) without changing anything."""
        want = T1 if self.size[T1] > self.p else T2
        b = self.q.head(want)
        if b >= 0:
            return b, want, want, False
        other = 1 - want
        return self.q.head(other), other, want, True

    def _decision(self, b: int, lst: int, want: int, fallback: bool) -> Decision:
        q = self.q
        return Decision(victim=b, num_candidates=q.sizes[0] + q.sizes[1], position=0,
                        queue=NAMES[lst], segments={"T1": q.sizes[0], "T2": q.sizes[1]},
                        rank={"list": NAMES[lst], "p": self.p, "t1": self.size[T1],
                              "t2": self.size[T2], "b1": len(self.b1), "b2": len(self.b2),
                              "replace": NAMES[want], "fallback": fallback})

    def select_victim(self, req: PolicyRequest, now_ns: int) -> Decision:
        return self._decision(*self._choose())

    def on_evict(self, block: int) -> None:
        lst = self.lst[block]
        if self.q.where[block] >= 0:
            self.q.remove(block)
        if lst < 0:
            return
        self.size[lst] -= 1
        self.lst[block] = -1
        k = self.key[block]
        self.key[block] = -1
        if k < 0:
            return
        b1, b2, c = self.b1, self.b2, self.c
        b1.pop(k, None)                   # a key is in at most one ghost list
        b2.pop(k, None)
        (b1 if lst == T1 else b2)[k] = None
        while b1 and self.size[T1] + len(b1) > c:
            b1.popitem(last=False)
        while b2 and self.size[T1] + self.size[T2] + len(b1) + len(b2) > 2 * c:
            b2.popitem(last=False)

    def evict_batch(self, req: PolicyRequest, now_ns: int, num_blocks: int,
                    decisions: list[Decision] | None) -> list[int]:
        """select_victim then on_evict, num_blocks times, in one call."""
        victims: list[int] = []
        choose, evict = self._choose, self.on_evict
        for _ in range(num_blocks):
            b, lst, want, fallback = choose()
            if decisions is not None:
                decisions.append(self._decision(b, lst, want, fallback))
            evict(b)
            victims.append(b)
        return victims

    # -- views ----------------------------------------------------------------
    @property
    def num_candidates(self) -> int:
        return self.q.sizes[0] + self.q.sizes[1]

    def candidates(self) -> list[int]:
        want = T1 if self.size[T1] > self.p else T2
        return self.q.items(want) + self.q.items(1 - want)
