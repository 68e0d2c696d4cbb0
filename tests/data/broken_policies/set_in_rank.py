"""Broken on purpose: a Python set among the ranking fields, which JSON cannot hold.
Caught by ledger-fields (and receipt-valid: the ledger cannot be written)."""

from psgate.policy import BlockQueues, Decision, EvictionPolicy


class SetInRank(EvictionPolicy):
    name = "broken-set-in-rank"
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
        b = self.q.head(0)
        return Decision(victim=b, num_candidates=self.q.sizes[0], position=0, queue="fifo",
                        rank={"considered": {b}})

    def on_evict(self, block):
        self.q.remove(block)

    @property
    def num_candidates(self):
        return self.q.sizes[0]

    def candidates(self):
        return self.q.items(0)
