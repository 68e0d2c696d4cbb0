"""Broken on purpose: select_victim unlinks its victim itself (on_evict then finds it
gone). A plain replay cannot tell, since the engine always evicts what was selected;
calling select_victim twice can. Caught by select-victim-pure."""

from psgate.policy import BlockQueues, Decision, EvictionPolicy


class MutatesInSelect(EvictionPolicy):
    name = "broken-mutates-in-select"
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
        n = self.q.sizes[0]
        b = self.q.head(0)
        self.q.remove(b)
        return Decision(victim=b, num_candidates=n, position=0, queue="fifo")

    def on_evict(self, block):
        if block in self.q:
            self.q.remove(block)

    @property
    def num_candidates(self):
        return self.q.sizes[0]

    def candidates(self):
        return self.q.items(0)
