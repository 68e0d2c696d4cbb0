"""Broken on purpose: a NaN among the ranking fields (the ledger would show null).
Caught by ledger-fields."""

from psgate.policy import BlockQueues, Decision, EvictionPolicy


class NanRank(EvictionPolicy):
    name = "broken-nan-rank"
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
                        queue="fifo", rank={"score": float("nan")})

    def on_evict(self, block):
        self.q.remove(block)

    @property
    def num_candidates(self):
        return self.q.sizes[0]

    def candidates(self):
        return self.q.items(0)
