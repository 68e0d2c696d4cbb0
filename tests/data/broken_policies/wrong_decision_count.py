"""Broken on purpose: each Decision claims one candidate more than there are, so its
ledger row misstates the choice. Caught by ledger-fields."""

from psgate.policy import BlockQueues, Decision, EvictionPolicy


class WrongDecisionCount(EvictionPolicy):
    name = "broken-wrong-decision-count"
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
        return Decision(victim=self.q.head(0), num_candidates=self.q.sizes[0] + 1,
                        position=0, queue="fifo")

    def on_evict(self, block):
        self.q.remove(block)

    @property
    def num_candidates(self):
        return self.q.sizes[0]

    def candidates(self):
        return self.q.items(0)
