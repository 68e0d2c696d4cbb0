"""quota-lru: a per-tenant quota of cached candidates, then LRU.

    quota_g   = floor(shares.get(g, share) * usable blocks)
    holding_g = candidates (unpinned cached blocks) whose content group g computed
    on_free(b):    append b to the back of the global queue and of its owner's queue
    on_touch(b):   unlink b from both (a hit pins it: it is no candidate any more)
    select_victim: g* = the group with the largest holding_g - quota_g > 0 (ties: first seen)
                   g* exists: the front of g*'s queue (its least recently freed block)
                   none:      the front of the global queue (lru's choice)

A tenant within its quota loses blocks only once no group is over its own, so one
tenant flooding the cache with one-off prefixes evicts its own blocks first.
"""

from __future__ import annotations

from psgate.policy import BlockQueues, Decision, EvictionPolicy, GroupIds, NS_PER_S


class QuotaLRU(EvictionPolicy):
    name = "quota-lru"
    api_version = 1
    summary = "per-tenant quota of candidates (a share of the usable blocks), then LRU"
    defaults = {"share": 0.3, "shares": None}      # shares: {group: share} overrides

    def __init__(self, **params):
        super().__init__(**params)
        self.shares = self.params["shares"] or {}
        if not isinstance(self.shares, dict):
            raise ValueError(f"parameter 'shares': expected {{group: share}}, "
                             f"found {self.shares!r}")
        named = [("share", self.params["share"])]
        named += [(f"shares.{g}", v) for g, v in self.shares.items()]
        for key, value in named:
            if type(value) not in (int, float) or not 0 <= value <= 1:
                raise ValueError(f"parameter '{key}': expected 0..1, found {value!r}")

    def bind(self, pool):
        super().bind(pool)
        self.all = BlockQueues(pool.num_blocks, 1)     # every candidate, freed order
        self.mine = BlockQueues(pool.num_blocks, 0)    # one queue per owning group
        self.groups, self.quota = GroupIds(), []
        self.owner, self.freed_ns = [-1] * pool.num_blocks, [0] * pool.num_blocks
        for group in pool.groups:
            self._gid(group)

    def _gid(self, group):
        if group not in self.groups.ids:
            self.mine.add_queue()
            share = self.shares.get(group, self.params["share"])
            self.quota.append(int(share * self.pool.num_usable))
            return self.groups.add(group)
        return self.groups.ids[group]

    def on_cached(self, block, req, pos, parent, key=-1):
        self.owner[block] = self._gid(req.group)

    def on_free(self, blocks, now_ns):
        for b in blocks:
            self.all.append(0, b)
            self.mine.append(self.owner[b], b)
            self.freed_ns[b] = now_ns

    def on_touch(self, block):
        self.all.remove(block)
        self.mine.remove(block)

    on_evict = on_touch

    def _over(self, holding):
        """The group furthest over its quota, or -1 when none is over."""
        g = max(range(len(holding)), key=lambda g: (holding[g] - self.quota[g], -g))
        return g if holding[g] > self.quota[g] else -1

    def select_victim(self, req, now_ns):
        holding = self.mine.sizes
        g = self._over(holding)
        b = self.mine.head(g) if g >= 0 else self.all.head(0)
        o = self.owner[b]
        return Decision(victim=b, num_candidates=self.all.sizes[0], position=0,
                        queue=f"{self.groups.names[o]}/own" if g >= 0 else "all",
                        rank={"rule": "over-quota" if g >= 0 else "lru",
                              "group": self.groups.names[o], "holding": holding[o],
                              "quota": self.quota[o], "freed_t": self.freed_ns[b] / NS_PER_S})

    @property
    def num_candidates(self):
        return self.all.sizes[0]

    def candidates(self):
        """All candidates in the order select_victim takes them: the groups over their
        quota down to it, furthest over first, then the rest in freed order."""
        holding, out = list(self.mine.sizes), []
        heads = [iter(self.mine.items(g)) for g in range(len(holding))]
        while (g := self._over(holding)) >= 0:
            out.append(next(heads[g]))
            holding[g] -= 1
        taken = set(out)
        return out + [b for b in self.all.items(0) if b not in taken]
