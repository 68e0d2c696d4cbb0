"""Broken on purpose: a fast evict_batch that takes the tail of the queue while
select_victim takes its head. Caught by evict-batch-consistent."""

from psgate.policy import BlockQueues, Decision, EvictionPolicy


class BatchDisagrees(EvictionPolicy):
    name = "broken-batch-disagrees"
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

    def evict_batch(self, req, now_ns, num_blocks, decisions):
        victims = []
        for _ in range(num_blocks):
            items = self.q.items(0)
            b = items[-1]
            if decisions is not None:
                decisions.append(Decision(victim=b, num_candidates=len(items),
                                          position=len(items) - 1, queue="fifo"))
            self.q.remove(b)
            victims.append(b)
        return victims

    @property
    def num_candidates(self):
        return self.q.sizes[0]

    def candidates(self):
        return self.q.items(0)
