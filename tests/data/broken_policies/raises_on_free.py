"""Broken on purpose: on_free refuses a request's blocks once two come back together.
Caught by runs-cleanly."""

from psgate.policy import BlockQueues, Decision, EvictionPolicy


class RaisesOnFree(EvictionPolicy):
    name = "broken-raises-on-free"
    api_version = 1

    def bind(self, pool):
        super().bind(pool)
        self.q = BlockQueues(pool.num_blocks)

    def on_free(self, blocks, now_ns):
        if len(blocks) > 1:
            raise ValueError(f"expected one block at a time, got {len(blocks)}")
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
