"""Broken on purpose: select_victim never returns once two blocks are candidates.
Caught by runs-cleanly (the time limit)."""

from psgate.policy import BlockQueues, Decision, EvictionPolicy


class LoopsForever(EvictionPolicy):
    name = "broken-loops-forever"
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
        while self.q.sizes[0] > 1:      # meant to walk to the tail; never moves on
            b = self.q.head(0)
        return Decision(victim=b, num_candidates=self.q.sizes[0], position=0, queue="fifo")

    def on_evict(self, block):
        self.q.remove(block)

    @property
    def num_candidates(self):
        return self.q.sizes[0]

    def candidates(self):
        return self.q.items(0)
