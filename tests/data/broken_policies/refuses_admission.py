"""Broken on purpose: declares itself work-conserving (the default) yet refuses every
request's first admission, so requests wait while capacity sits idle. Caught by
work-conserving."""

from psgate.policy import BlockQueues, Decision, EvictionPolicy


class RefusesAdmission(EvictionPolicy):
    name = "broken-refuses-admission"
    api_version = 1

    def bind(self, pool):
        super().bind(pool)
        self.q = BlockQueues(pool.num_blocks)
        self.asked = set()

    def admission_allowed(self, req, num_new_blocks, num_evictable_hits):
        first = req.id not in self.asked
        self.asked.add(req.id)
        return not first

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
