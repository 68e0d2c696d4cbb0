"""Broken on purpose: num_candidates counts one block more than the policy holds, so
the engine's and the checker's counts disagree with it. Caught by hard-invariants
(capacity_and_accounting)."""

from psgate.policy import BlockQueues, Decision, EvictionPolicy


class Miscount(EvictionPolicy):
    name = "broken-miscount"
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
        return Decision(victim=self.q.head(0), num_candidates=self.q.sizes[0], position=0,
                        queue="fifo")

    def on_evict(self, block):
        self.q.remove(block)

    @property
    def num_candidates(self):
        return self.q.sizes[0] + (1 if self.q.sizes[0] > 2 else 0)

    def candidates(self):
        return self.q.items(0)
