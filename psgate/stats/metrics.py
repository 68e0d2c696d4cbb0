"""Per-run metrics, as the receipt reports them.

Definitions (receipts quote these):
  hit_fraction       mean over measured requests of cached_tokens / prompt_tokens
                     (the PrefixShield paper's metric); admitted requests only
  token_hit_ratio    sum cached_tokens / sum prompt_tokens over the same requests
  saved_prefill_*    tokens served from cache, and the modeled ms that saved
  ttft_*             modeled; a request is a hit when cached_tokens > 0;
                     percentiles are nearest-rank
  churn              evictions / usable blocks
Requests dropped while waiting, rejected ones and warm-ups (measure=false) are
kept out of hit and latency metrics but counted.
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Iterable

from psgate.engines.cost import CostModel
from psgate.engines.results import (CANCELLED, DROPPED, REJECTED, OutcomeSink, RequestOutcome,
                                    RunResult)

METRICS = (
    "requests", "measured_requests", "hit_fraction", "token_hit_ratio", "saved_prefill_tokens",
    "saved_prefill_ms", "prefill_ms_total", "new_blocks", "recompute_tokens", "ttft_p50_ms",
    "ttft_p95_ms", "ttft_hit_p50_ms", "ttft_hit_p95_ms", "ttft_miss_p50_ms", "ttft_miss_p95_ms",
    "hit_requests", "miss_requests", "admission_waits", "wait_ms_total", "rejected", "dropped",
    "cancelled",
)
RUN_METRICS = ("evictions", "churn", "orphans_created", "orphan_blocks_max")
GROUP_METRICS = ("evictions_suffered", "evictions_caused", "occupancy_mean", "occupancy_max")
ALL_METRICS = METRICS + RUN_METRICS + GROUP_METRICS


def nearest_rank(sorted_values: list[float], p: float) -> float | None:
    if not sorted_values:
        return None
    rank = max(1, math.ceil(p / 100.0 * len(sorted_values)))
    return sorted_values[rank - 1]


def _r(x: float | None, nd: int = 6) -> float | None:
    return None if x is None else round(x, nd)


class _Values:
    """Latencies kept as 8-byte doubles, sorted in chunks as they arrive: a percentile needs
    every value, but never a Python float object per value (32 bytes each) for all of
    them at once, and never one sort over the whole run."""

    CHUNK = 1 << 16
    __slots__ = ("runs", "cur", "n")

    def __init__(self) -> None:
        self.runs: list[array] = []
        self.cur = array("d")
        self.n = 0

    def append(self, x: float) -> None:
        cur = self.cur
        cur.append(x)
        self.n += 1
        if len(cur) >= self.CHUNK:
            self.runs.append(array("d", sorted(cur)))
            self.cur = array("d")

    def sorted_runs(self) -> list[array]:
        if self.cur:
            self.runs.append(array("d", sorted(self.cur)))
            self.cur = array("d")
        return self.runs


def kth_smallest(runs: list[array], k: int) -> float:
    """The k-th smallest value (1-based) of the union of sorted runs: the value at rank k
    of their merged sort, found by narrowing each run's live range around pivots, so
    nothing is merged or copied. The pivot is the weighted median of the live ranges'
    middles (weights: their widths), so each step discards at least a quarter of the live
    values whichever side k falls on: O(log n) steps of O(R log n) work for R runs (a
    thousand tenants' latencies are thousands of runs; a pivot from the widest run alone
    would take a step per run)."""
    live = [(r, 0, len(r)) for r in runs if len(r)]
    while True:
        mids = sorted((r[(lo + hi) // 2], hi - lo) for r, lo, hi in live)
        half, acc = sum(w for _, w in mids) / 2, 0
        for pivot, w in mids:
            acc += w
            if acc >= half:
                break
        less = [(r, lo, bisect_left(r, pivot, lo, hi), hi) for r, lo, hi in live]
        num_less = sum(m - lo for _, lo, m, _ in less)
        if k <= num_less:
            live = [(r, lo, m) for r, lo, m, _ in less if m > lo]
            continue
        upto = [(r, bisect_right(r, pivot, m, hi), hi) for r, _, m, hi in less]
        num_upto = num_less + sum(u - m for (_, u, _), (_, _, m, _) in zip(upto, less))
        if k <= num_upto:
            return pivot
        k -= num_upto
        live = [(r, u, hi) for r, u, hi in upto if hi > u]


def _percentile(runs: list[array], n: int, p: float) -> float | None:
    """nearest_rank over the sorted union of ``runs`` (``n`` values in all)."""
    if not n:
        return None
    return kth_smallest(runs, max(1, math.ceil(p / 100.0 * n)))


class _Scope:
    """The running counts and sums of summarize() for one set of outcomes. Sums are taken
    in the order outcomes arrive, as summing a list of them would, so the floats (and the
    receipt) are the same whether outcomes are streamed or collected first."""

    __slots__ = ("n", "measured", "waits", "rejected", "dropped", "cancelled", "frac_sum",
                 "hit_n", "cached", "prompt", "new_blocks", "recompute", "prefill", "wait_ms")

    def __init__(self) -> None:
        self.n = self.measured = self.waits = self.rejected = self.dropped = 0
        self.cancelled = self.hit_n = self.cached = self.prompt = 0
        self.new_blocks = self.recompute = 0
        self.frac_sum = self.prefill = self.wait_ms = 0.0

    def add(self, o: RequestOutcome) -> bool:
        """Counts o; True when o is measured (its latency belongs to the percentiles)."""
        self.n += 1
        state = o.state
        if state == REJECTED:
            self.rejected += 1
        elif state == DROPPED:
            self.dropped += 1
        elif state == CANCELLED:
            self.cancelled += 1
        if o.waited:
            self.waits += 1
            self.wait_ms += o.wait_ms
        if not o.measure or not o.counts_for_hits:
            return False
        self.measured += 1
        self.frac_sum += o.cached_tokens / o.prompt_tokens
        self.cached += o.cached_tokens
        self.prompt += o.prompt_tokens
        self.new_blocks += o.new_blocks
        self.recompute += o.recompute_tokens
        self.prefill += o.prefill_ms or 0.0
        if o.cached_tokens > 0:
            self.hit_n += 1
        return True

    def summary(self, cost: CostModel | None, hit: list[_Values], miss: list[_Values]) -> dict:
        """The metrics; ``hit`` / ``miss``: the latencies of this scope's hits and misses."""
        measured, cached, prompt = self.measured, self.cached, self.prompt
        hit_runs = [r for v in hit for r in v.sorted_runs()]
        miss_runs = [r for v in miss for r in v.sorted_runs()]
        num_hit = sum(v.n for v in hit)
        num_miss = sum(v.n for v in miss)
        all_runs, num_all = hit_runs + miss_runs, num_hit + num_miss
        saved_ms = (None if cost is None
                    else cached * (cost.per_uncached_token_ms - cost.per_cached_token_ms))
        return {
            "requests": self.n,
            "measured_requests": measured,
            "hit_fraction": _r(self.frac_sum / measured) if measured else None,
            "token_hit_ratio": _r(cached / prompt) if prompt else None,
            "saved_prefill_tokens": cached,
            "saved_prefill_ms": _r(saved_ms, 3),
            "prefill_ms_total": None if cost is None else _r(self.prefill, 3),
            "new_blocks": self.new_blocks,
            "recompute_tokens": self.recompute,
            "ttft_p50_ms": _r(_percentile(all_runs, num_all, 50), 3),
            "ttft_p95_ms": _r(_percentile(all_runs, num_all, 95), 3),
            "ttft_hit_p50_ms": _r(_percentile(hit_runs, num_hit, 50), 3),
            "ttft_hit_p95_ms": _r(_percentile(hit_runs, num_hit, 95), 3),
            "ttft_miss_p50_ms": _r(_percentile(miss_runs, num_miss, 50), 3),
            "ttft_miss_p95_ms": _r(_percentile(miss_runs, num_miss, 95), 3),
            "hit_requests": self.hit_n,
            "miss_requests": measured - self.hit_n,
            "admission_waits": self.waits,
            "wait_ms_total": _r(self.wait_ms, 3),
            "rejected": self.rejected,
            "dropped": self.dropped,
            "cancelled": self.cancelled,
        }


class MetricsAccumulator(OutcomeSink):
    """What run_metrics needs from a run's outcomes, taken one outcome at a time: counts and
    sums per scope (totals, each group, each role) and the latencies, 8 bytes each, kept
    once per (group, role, hit) and shared by every scope they belong to."""

    def __init__(self) -> None:
        self.totals = _Scope()
        self.groups: dict[str, _Scope] = {}
        self.roles: dict[str, _Scope] = {}
        self.latencies: dict[tuple[str, str | None, bool], _Values] = {}
        # Each key's place in its group's and its role's list, so that one scope's summary
        # reads its own latencies, not every key's (a pass per group would be quadratic).
        self.group_keys: dict[str, list[tuple[str, str | None, bool]]] = {}
        self.role_keys: dict[str | None, list[tuple[str, str | None, bool]]] = {}

    def add(self, o: RequestOutcome, index: int = 0) -> None:
        measured = self.totals.add(o)
        g = self.groups.get(o.group)
        if g is None:
            g = self.groups[o.group] = _Scope()
        g.add(o)
        if o.role is not None:
            r = self.roles.get(o.role)
            if r is None:
                r = self.roles[o.role] = _Scope()
            r.add(o)
        if measured and o.ttft_ms is not None:
            key = (o.group, o.role, o.cached_tokens > 0)
            v = self.latencies.get(key)
            if v is None:
                v = self.latencies[key] = _Values()
                self.group_keys.setdefault(o.group, []).append(key)
                self.role_keys.setdefault(o.role, []).append(key)
            v.append(o.ttft_ms)

    def extend(self, outcomes: Iterable[RequestOutcome]) -> "MetricsAccumulator":
        for o in outcomes:
            self.add(o)
        return self

    def _split(self, keys: Iterable[tuple[str, str | None, bool]]
               ) -> tuple[list[_Values], list[_Values]]:
        hit, miss = [], []
        for key in keys:
            (hit if key[2] else miss).append(self.latencies[key])
        return hit, miss

    def totals_summary(self, cost: CostModel | None) -> dict:
        return self.totals.summary(cost, *self._split(self.latencies))

    def group_summary(self, group: str, cost: CostModel | None) -> dict:
        scope = self.groups.get(group) or _Scope()
        return scope.summary(cost, *self._split(self.group_keys.get(group, ())))

    def role_summary(self, role: str, cost: CostModel | None) -> dict:
        return self.roles[role].summary(cost, *self._split(self.role_keys.get(role, ())))


def summarize(outcomes: Iterable[RequestOutcome], cost: CostModel | None) -> dict:
    """Metrics of a set of outcomes. ``cost`` None: the times are observed (the real
    engine), so the modeled ones (saved and total prefill time) are null, never mixed in."""
    return MetricsAccumulator().extend(outcomes).totals_summary(cost)


def run_metrics(run: RunResult, cost: CostModel | None,
                acc: MetricsAccumulator | None = None) -> dict:
    """The receipt's view of one run: totals, per group, per role, who evicted whom
    (``cost`` None for observed runs, see summarize). ``acc``: the run's outcomes, already
    accumulated as they were streamed (``run.requests`` is then empty)."""
    if acc is None:
        acc = MetricsAccumulator().extend(run.requests)
    totals = acc.totals_summary(cost)
    totals["evictions"] = run.evictions
    totals["churn"] = _r(run.evictions / run.usable_blocks)
    for k in ("orphans_created", "orphan_blocks_max"):
        if k in run.orphans:       # the real engine does not track orphans
            totals[k] = run.orphans[k]

    suffered: dict[str, int] = {}
    for row in run.evictions_by.values():
        for owner, n in row.items():
            suffered[owner] = suffered.get(owner, 0) + n
    groups = {}
    for g in sorted(set(run.groups) | set(acc.groups)):
        m = acc.group_summary(g, cost)
        m["evictions_suffered"] = suffered.get(g, 0)
        m["evictions_caused"] = sum(run.evictions_by.get(g, {}).values())
        m["occupancy_mean"] = _r(run.occupancy_mean.get(g, 0.0), 3)
        m["occupancy_max"] = run.occupancy_max.get(g, 0)
        groups[g] = m
    roles = {role: acc.role_summary(role, cost) for role in sorted(acc.roles)}
    return {
        "totals": totals,
        "groups": groups,
        "roles": roles,
        "evictions_by": {a: dict(sorted(row.items()))
                         for a, row in sorted(run.evictions_by.items())},
        "recompute_paid_tokens": {g: groups[g]["recompute_tokens"] for g in groups},
    }


COMPARED = ("hit_fraction", "token_hit_ratio", "saved_prefill_tokens", "ttft_p50_ms",
            "ttft_p95_ms", "evictions_suffered")


def paired_difference(base: dict, cand: dict) -> dict:
    """candidate - baseline for the headline metrics, per totals/group/role."""

    def diff(a: dict, b: dict) -> dict:
        out = {}
        for m in COMPARED:
            x, y = a.get(m), b.get(m)
            out[m] = None if x is None or y is None else _r(y - x)
        return out

    return {
        "method": "single matched run: candidate minus baseline; no confidence interval",
        "totals": diff(base["totals"], cand["totals"]),
        "groups": {g: diff(base["groups"].get(g, {}), cand["groups"][g])
                   for g in cand["groups"]},
        "roles": {r: diff(base["roles"].get(r, {}), cand["roles"][r]) for r in cand["roles"]},
    }
