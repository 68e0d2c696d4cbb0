"""Broken on purpose: its own __init__ takes any parameter without checking it against
defaults, so a typo in --param would silently be ignored. Caught by params-validated."""

from psgate.policy import BlockQueues, Decision, EvictionPolicy


class AcceptsUnknownParams(EvictionPolicy):
    name = "broken-accepts-unknown-params"
    api_version = 1
    defaults = {"depth": 1}

    def __init__(self, **params):
        self.params = {**self.defaults, **params}
        self.pool = None

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
        return self.q.sizes[0]

    def candidates(self):
        return self.q.items(0)
