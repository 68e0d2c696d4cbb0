"""Broken on purpose: one FIFO per accounting group, and the victim comes from the first
group with candidates in the iteration order of a set of group names, which depends on
PYTHONHASHSEED. Same in every replay of one interpreter, different across interpreters.
Caught by hash-seed-independent (and only by it)."""

from psgate.policy import BlockQueues, Decision, EvictionPolicy


class SetOrder(EvictionPolicy):
    name = "broken-set-order"
    api_version = 1

    def bind(self, pool):
        super().bind(pool)
        self.q = BlockQueues(pool.num_blocks, 0)
        self.qid = {}
        self.owner = [None] * pool.num_blocks

    def on_allocated(self, req, blocks):
        if req.group not in self.qid:
            self.qid[req.group] = self.q.add_queue()
        for b in blocks:
            self.owner[b] = req.group

    def on_free(self, blocks, now_ns):
        for b in blocks:
            self.q.append(self.qid[self.owner[b]], b)

    def on_touch(self, block):
        self.q.remove(block)

    def select_victim(self, req, now_ns):
        for group in set(self.qid):
            q = self.qid[group]
            if self.q.sizes[q]:
                return Decision(victim=self.q.head(q), num_candidates=self.num_candidates,
                                position=0, queue=group)
        raise AssertionError("select_victim called without candidates")

    def on_evict(self, block):
        self.q.remove(block)

    @property
    def num_candidates(self):
        return sum(self.q.sizes)

    def candidates(self):
        return [b for q in self.qid.values() for b in self.q.items(q)]
