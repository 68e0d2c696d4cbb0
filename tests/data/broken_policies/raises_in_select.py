"""Broken on purpose: select_victim looks the head up in a table nothing fills, so it
raises KeyError (from a helper, to check the hook is named, not the helper). Caught by
runs-cleanly."""

from psgate.policy import BlockQueues, Decision, EvictionPolicy


class RaisesInSelect(EvictionPolicy):
    name = "broken-raises-in-select"
    api_version = 1

    def bind(self, pool):
        super().bind(pool)
        self.q = BlockQueues(pool.num_blocks)
        self.scores = {}

    def on_free(self, blocks, now_ns):
        for b in blocks:
            self.q.append(0, b)

    def on_touch(self, block):
        self.q.remove(block)

    def score(self, block):
        return self.scores[block]

    def select_victim(self, req, now_ns):
        b = self.q.head(0)
        return Decision(victim=b, num_candidates=self.q.sizes[0], position=0, queue="fifo",
                        rank={"score": self.score(b)})

    def on_evict(self, block):
        self.q.remove(block)

    @property
    def num_candidates(self):
        return self.q.sizes[0]

    def candidates(self):
        return self.q.items(0)
