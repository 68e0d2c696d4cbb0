"""lru: vLLM's native eviction order.

    on_free(blocks):   append each block to the back of the queue
    on_touch(block):   unlink it (a hit takes it out of the free queue)
    select_victim():   the front of the queue

This is exactly vLLM v1's ``FreeKVCacheBlockQueue`` restricted to cached
blocks: the engine keeps truly free blocks in front of them, as vLLM's
``prepend_n`` does, and hands out those first.
"""

from __future__ import annotations

from array import array

from psgate.policy import (BlockQueues, Decision, EvictionPolicy, kernels, PolicyRequest,
                          PoolInfo)

NS_PER_S = 1_000_000_000


class LRUPolicy(EvictionPolicy):
    name = "lru"
    api_version = 1
    summary = "vLLM native: evict the head of the free queue (least recently freed)"
    defaults = {}

    def bind(self, pool: PoolInfo) -> None:
        super().bind(pool)
        self._q = BlockQueues(pool.num_blocks, 1)
        self._freed_ns = array("q", [0]) * pool.num_blocks
        # The compiled walk makes lru's own decisions; a subclass's _decision runs here.
        self._core = kernels() if type(self)._decision is LRUPolicy._decision else None

    def on_free(self, blocks: list[int], now_ns: int) -> None:
        if not blocks:
            return
        if self._core is not None:
            self._core.lru_freed(self._q, self._freed_ns, blocks, now_ns)
            return
        q = self._q                      # q.append(0, b) for each, inline
        nxt, prv, where = q.next, q.prev, q.where
        freed = self._freed_ns
        s = q.num_blocks
        last = prv[s]
        for b in blocks:
            prv[b] = last
            nxt[last] = b
            where[b] = 0
            freed[b] = now_ns
            last = b
        nxt[last] = s
        prv[s] = last
        q.sizes[0] += len(blocks)

    def on_touch(self, block: int) -> None:
        self._q.remove(block)

    def touch_queues(self):
        return self._q if type(self).on_touch is LRUPolicy.on_touch else None

    def _decision(self, b: int, num_candidates: int) -> Decision:
        return Decision(victim=b, num_candidates=num_candidates, position=0, queue="lru",
                        rank={"freed_t": self._freed_ns[b] / NS_PER_S})

    def select_victim(self, req: PolicyRequest, now_ns: int) -> Decision:
        return self._decision(self._q.head(0), self._q.sizes[0])

    def on_evict(self, block: int) -> None:
        self._q.remove(block)

    def evict_batch(self, req: PolicyRequest, now_ns: int, num_blocks: int,
                    decisions: list[Decision] | None) -> list[int]:
        """The first num_blocks of the queue, unlinked in one pass."""
        if self._core is not None:
            return self._core.lru_take(self._q, self._freed_ns, num_blocks, decisions,
                                       Decision)
        q = self._q
        nxt, prv, where = q.next, q.prev, q.where
        s = q.num_blocks
        size = q.sizes[0]
        victims: list[int] = []
        b = nxt[s]
        while len(victims) < num_blocks and b != s:
            if decisions is not None:
                decisions.append(self._decision(b, size - len(victims)))
            victims.append(b)
            where[b] = -1
            b = nxt[b]
        nxt[s] = b
        prv[b] = s
        q.sizes[0] = size - len(victims)
        return victims

    @property
    def num_candidates(self) -> int:
        return self._q.sizes[0]

    def candidates(self) -> list[int]:
        return self._q.items(0)
