"""static-quota: hard isolation; every group owns an equal fixed share, no borrowing.

    share_g = floor(usable / number of groups)    (or the configured ``shares`` table)
    held_g  = blocks g holds: pinned by its requests, or cached content it materialized
    admit r of g needing n new blocks (h of its hits are candidates now):
        if pinned_g + h + n > share_g: r waits in g's own line (others are not blocked)
    reclaim for r: while held_g + remaining > share_g, evict g's own LRU candidate
                   (even when truly free blocks exist); otherwise the global LRU head

Groups are those the trace declares or names (the engine passes them in), so an
idle group's share stays reserved for it: that is the point of the baseline. A
request needing more than its group's share is rejected, not left waiting.
"""

from __future__ import annotations

from array import array
from typing import Any

from psgate.policy import BlockQueues, Decision, EvictionPolicy, PolicyRequest, PoolInfo

NS_PER_S = 1_000_000_000


class StaticQuota(EvictionPolicy):
    name = "static-quota"
    api_version = 1
    summary = "hard isolation: equal fixed share per group, no borrowing (waits at its share)"
    defaults: dict[str, Any] = {"shares": None}
    work_conserving = False

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        shares = self.params["shares"]      # checked here, so a bad table is bad input
        if shares is not None and (not isinstance(shares, dict) or not all(
                type(v) is int and v >= 0 for v in shares.values())):
            raise ValueError(f"'shares' must map group names to block counts (integers "
                             f">= 0), found {shares!r:.60}")

    def bind(self, pool: PoolInfo) -> None:
        super().bind(pool)
        n = pool.num_blocks
        groups = list(pool.groups)
        shares = self.params["shares"]
        if shares is not None:
            if sum(shares.values()) > pool.num_usable:   # the engine: bad input naming it
                raise ValueError(f"'shares' add up to {sum(shares.values())} blocks; only "
                                 f"{pool.num_usable} are usable (--capacity less the null "
                                 f"block)")
            groups += [g for g in shares if g not in groups]
            self.share = {g: shares.get(g, 0) for g in groups}
        else:
            each = pool.num_usable // max(1, len(groups))
            self.share = {g: each for g in groups}
        self.gids = {g: i for i, g in enumerate(groups)}
        self.gnames = groups
        self.shares = [self.share[g] for g in groups]
        self.held = [0] * len(groups)
        self.owner = array("i", [-1]) * n
        self.freed_ns = array("q", [0]) * n
        self.all = BlockQueues(n, 1)              # every candidate, LRU order
        self.mine = BlockQueues(n, len(groups))   # per group, LRU order
        self.remaining = 0

    def _g(self, group: str) -> int:
        g = self.gids.get(group)
        if g is None:    # not declared: no share at all
            raise ValueError(f"group '{group}' has no share")
        return g

    def capacity_for(self, req: PolicyRequest) -> int:
        return self.share.get(req.group, 0)

    def admission_allowed(self, req: PolicyRequest, num_new_blocks: int,
                          num_evictable_hits: int) -> bool:
        g = self._g(req.group)
        pinned = self.held[g] - self.mine.sizes[g]
        return pinned + num_evictable_hits + num_new_blocks <= self.shares[g]

    def reclaim_first(self, req: PolicyRequest, num_new_blocks: int) -> int:
        g = self._g(req.group)
        self.remaining = num_new_blocks      # all of them join held_g after the evictions
        # At most what the group has to give back: a running request's decode can take
        # the group past its share (admission checked its prompt only), and with none of
        # its own blocks evictable the rest comes from free blocks, not from a victim
        # that does not exist.
        # And never more than the batch: a group already over its share by more than the
        # batch (a decode took it there) gives back this batch's worth, not its excess.
        return min(num_new_blocks, self.mine.sizes[g],
                   max(0, self.held[g] + num_new_blocks - self.shares[g]))

    def on_allocated(self, req: PolicyRequest, blocks: list[int]) -> None:
        g = self._g(req.group)
        for b in blocks:
            self.owner[b] = g
        self.held[g] += len(blocks)

    def on_released(self, blocks: list[int]) -> None:
        for b in blocks:
            self.held[self.owner[b]] -= 1
            self.owner[b] = -1

    def on_free(self, blocks: list[int], now_ns: int) -> None:
        for b in blocks:
            self.all.append(0, b)
            self.mine.append(self.owner[b], b)
            self.freed_ns[b] = now_ns

    def on_touch(self, block: int) -> None:
        self.all.remove(block)
        self.mine.remove(block)

    def select_victim(self, req: PolicyRequest, now_ns: int) -> Decision:
        g = self._g(req.group)
        own = self.held[g] + self.remaining > self.shares[g] or self.all.sizes[0] == 0
        b = self.mine.head(g) if own else self.all.head(0)
        if b < 0:          # cannot happen after admission_allowed; keep the pool going
            b, own = self.all.head(0), False
        return Decision(victim=b, num_candidates=self.all.sizes[0], position=0,
                        queue=f"{self.gnames[g]}/own" if own else "all",
                        rank={"at_share": own, "held": self.held[g], "share": self.shares[g],
                              "freed_t": self.freed_ns[b] / NS_PER_S})

    def on_evict(self, block: int) -> None:
        self.all.remove(block)
        self.mine.remove(block)
        self.held[self.owner[block]] -= 1
        self.owner[block] = -1

    @property
    def num_candidates(self) -> int:
        return self.all.sizes[0]

    def candidates(self) -> list[int]:
        return self.all.items(0)
