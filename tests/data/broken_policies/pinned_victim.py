"""Broken on purpose: evicts a block a running request still pins (the lowest-numbered
block it was given). Caught by victims-are-candidates."""

from psgate.policy import BlockQueues, Decision, EvictionPolicy


class PinnedVictim(EvictionPolicy):
    name = "broken-pinned-victim"
    api_version = 1

    def bind(self, pool):
        super().bind(pool)
        self.q = BlockQueues(pool.num_blocks)
        self.held = set()

    def on_allocated(self, req, blocks):
        self.held.update(blocks)

    def on_free(self, blocks, now_ns):
        self.held.difference_update(blocks)
        for b in blocks:
            self.q.append(0, b)

    def on_released(self, blocks):
        self.held.difference_update(blocks)

    def on_touch(self, block):
        self.q.remove(block)

    def select_victim(self, req, now_ns):
        victim = min(self.held) if self.held else self.q.head(0)
        return Decision(victim=victim, num_candidates=self.q.sizes[0], position=0,
                        queue="fifo")

    def on_evict(self, block):
        if block in self.q:
            self.q.remove(block)
        self.held.discard(block)

    @property
    def num_candidates(self):
        return self.q.sizes[0]

    def candidates(self):
        return self.q.items(0)
