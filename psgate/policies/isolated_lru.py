"""isolated-lru: one LRU list per scope with per-scope quotas (LMCache's IsolatedLRU).

    scope(b)   = the trace's ``scope`` (vLLM's ``cache_salt``) of the request that cached b
    used_s     = cached blocks of scope s, pinned or not
    quota_s    = floor(quotas[s] x usable)             with ``quotas`` (a scope missing
                                                       from it has quota 0)
               = floor(usable / scopes seen so far)    without (equal shares)
    evict() for a request of scope s:
        1. own:    used_s >= quota_s (the block to come takes s past its quota) and s has
                   a candidate: s's least recently freed candidate
        2. over:   else, among the scopes t with used_t > quota_t that have a candidate:
                   the least recently freed of their LRU candidates
        3. global: else the least recently freed candidate (lru's choice)

Source: LMCache's ``IsolatedLRUEvictionPolicy`` with its ``QuotaManager`` (LMCache PR
#3137): one LRU list per ``cache_salt``, a salt over its quota is evicted from its own
list, so one salt cannot evict another's data; quotas are set per salt, and a salt
without one has an effective limit of 0 (allowlist semantics), which ``quotas`` keeps.
LMCache enforces the quotas with a background controller against byte limits
(a watermark of each limit); adapting it to a block pool that evicts on demand (choices
made here):

- Blocks stand for bytes (every block is the same size) and a quota is a fraction of
  the usable blocks. Default: equal shares of the usable blocks among the scopes seen
  (a scope is seen when one of its requests is admitted), recomputed as scopes appear.
- Quotas are soft: a request is never refused and never evicts while free blocks exist
  (work-conserving, unlike static-quota); a scope within its quota may use idle room.
  Rules 2 and 3 are where LMCache has no answer, since its controller only ever evicts
  a salt that is over budget: room goes first from the scopes over their quotas (the
  oldest of their LRU heads, so the scope that overflowed longest ago gives first),
  and only when none is over (or none of them has an unpinned block) from global LRU.
- A scope's usage counts every cached block it computed, pinned ones included (they
  occupy its share); pinned blocks are never candidates: rule 1 takes s's least
  recently freed *unpinned* block, and a scope whose blocks are all pinned goes on to
  rules 2 and 3. Content is per (group, scope) namespace, so only requests of the same
  scope hit a block.
- Recency is vLLM's free-queue order (the order of release, a request's last block
  first), so within a scope a chain's leaf goes before its parent, as under lru.
- The scope is the trace's ``scope`` string: requests of two groups naming the same
  scope share one list and one quota.
- Ledger: ``queue`` is the rule (own, over, global), position 0; rank holds the rule, the
  victim's scope with its usage and quota, the requester's, and ``freed_t``.
  ``candidates()`` is the global LRU order.
"""

from __future__ import annotations

import math
from array import array
from typing import Any

from psgate.policy import BlockQueues, Decision, EvictionPolicy, PolicyRequest, PoolInfo

NS_PER_S = 1_000_000_000


class IsolatedLRUPolicy(EvictionPolicy):
    name = "isolated-lru"
    api_version = 1
    summary = ("LRU per scope with soft quotas (LMCache IsolatedLRU): a scope at its quota "
               "evicts its own LRU block, else the oldest block of a scope over its quota, "
               "else global LRU; default equal shares")
    defaults: dict[str, Any] = {"quotas": None}

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        quotas = self.params["quotas"]     # checked here, so a bad table is bad input
        if quotas is not None and (not isinstance(quotas, dict) or not all(
                type(k) is str and type(v) in (int, float) and math.isfinite(v)
                and 0 < v <= 1 for k, v in quotas.items())):
            raise ValueError(f"'quotas' must map scope names to fractions of the usable "
                             f"blocks in (0, 1], found {quotas!r:.60}")

    def bind(self, pool: PoolInfo) -> None:
        super().bind(pool)
        n = pool.num_blocks
        self.usable = pool.num_usable
        self.sids: dict[str, int] = {}
        self.names: list[str] = []
        self.used: list[int] = []
        self.quota: list[int] = []
        self.owner = array("i", [-1]) * n
        self.seq = array("q", [0]) * n          # release order
        self.freed_ns = array("q", [0]) * n
        self.tick = 0
        self.all = BlockQueues(n, 1)             # every candidate, LRU first
        self.mine = BlockQueues(n, 0)            # per scope, LRU first
        if self.params["quotas"] is not None:
            for s in sorted(self.params["quotas"]):   # named scopes: ids in name order
                self._sid(s)

    def _sid(self, scope: str) -> int:
        s = self.sids.get(scope)
        if s is not None:
            return s
        s = self.sids[scope] = len(self.names)
        self.names.append(scope)
        self.used.append(0)
        self.mine.add_queue()
        quotas = self.params["quotas"]
        if quotas is None:
            each = self.usable // len(self.names)
            self.quota = [each] * len(self.names)
        else:
            self.quota.append(math.floor(quotas.get(scope, 0) * self.usable))
        return s

    # -- events ---------------------------------------------------------------
    def on_admit(self, req: PolicyRequest, now_ns: int) -> None:
        self._sid(req.scope)

    def on_cached(self, block: int, req: PolicyRequest, pos: int, parent: int,
                  key: int = -1) -> None:
        s = self._sid(req.scope)
        self.owner[block] = s
        self.used[s] += 1

    def on_free(self, blocks: list[int], now_ns: int) -> None:
        all_, mine, owner, seq, freed = self.all, self.mine, self.owner, self.seq, self.freed_ns
        t = self.tick
        for b in blocks:
            s = owner[b]
            if s < 0:                      # cached without on_cached: the unnamed scope
                s = owner[b] = self._sid("")
                self.used[s] += 1
            t += 1
            seq[b] = t
            freed[b] = now_ns
            all_.append(0, b)
            mine.append(s, b)
        self.tick = t

    def on_touch(self, block: int) -> None:
        self.all.remove(block)
        self.mine.remove(block)

    def _choose(self, req: PolicyRequest | None) -> tuple[int, str, int]:
        """(victim, rule, requester's scope id or -1) without changing anything."""
        used, quota, mine = self.used, self.quota, self.mine
        s = self.sids.get(req.scope, -1) if req is not None else -1
        if s >= 0 and used[s] >= quota[s] and mine.sizes[s]:
            return mine.head(s), "own", s
        best, best_seq = -1, 0
        seq = self.seq
        for t in range(len(used)):
            if used[t] > quota[t] and mine.sizes[t]:
                h = mine.head(t)
                if best < 0 or seq[h] < best_seq:
                    best, best_seq = h, seq[h]
        if best >= 0:
            return best, "over", s
        return self.all.head(0), "global", s

    def _decision(self, b: int, rule: str, s: int) -> Decision:
        o = self.owner[b]
        rank: dict[str, Any] = {"rule": rule, "scope": self.names[o], "used": self.used[o],
                                "quota": self.quota[o]}
        if s >= 0:
            rank["req_scope"] = self.names[s]
            rank["req_used"] = self.used[s]
            rank["req_quota"] = self.quota[s]
        rank["freed_t"] = self.freed_ns[b] / NS_PER_S
        return Decision(victim=b, num_candidates=self.all.sizes[0], position=0, queue=rule,
                        rank=rank)

    def select_victim(self, req: PolicyRequest, now_ns: int) -> Decision:
        return self._decision(*self._choose(req))

    def on_evict(self, block: int) -> None:
        if self.all.where[block] >= 0:
            self.all.remove(block)
            self.mine.remove(block)
        o = self.owner[block]
        if o >= 0:
            self.used[o] -= 1
            self.owner[block] = -1

    def evict_batch(self, req: PolicyRequest, now_ns: int, num_blocks: int,
                    decisions: list[Decision] | None) -> list[int]:
        """select_victim then on_evict, num_blocks times, in one call."""
        victims: list[int] = []
        choose, evict = self._choose, self.on_evict
        for _ in range(num_blocks):
            b, rule, s = choose(req)
            if decisions is not None:
                decisions.append(self._decision(b, rule, s))
            evict(b)
            victims.append(b)
        return victims

    # -- views ----------------------------------------------------------------
    @property
    def num_candidates(self) -> int:
        return self.all.sizes[0]

    def candidates(self) -> list[int]:
        return self.all.items(0)
