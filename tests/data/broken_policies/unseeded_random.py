"""Broken on purpose: picks its victim with the unseeded global random generator.
Caught by deterministic (and select-victim-pure: two calls disagree)."""

import random

from psgate.policy import BlockQueues, Decision, EvictionPolicy


class UnseededRandom(EvictionPolicy):
    name = "broken-unseeded-random"
    api_version = 1

    def bind(self, pool):
        super().bind(pool)
        self.q = BlockQueues(pool.num_blocks)

    def on_free(self, blocks, now_ns):
        for b in blocks:
            self.q.append(0, b)

    def on_touch(self, block):
        self.q.remove(block)

    def select_victim(self, req, now_ns):
        items = self.q.items(0)
        i = random.randrange(len(items))
        return Decision(victim=items[i], num_candidates=len(items), position=i, queue="fifo")

    def on_evict(self, block):
        self.q.remove(block)

    @property
    def num_candidates(self):
        return self.q.sizes[0]

    def candidates(self):
        return self.q.items(0)
