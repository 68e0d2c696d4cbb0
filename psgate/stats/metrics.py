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
from collections.abc import Iterable

from psgate.engines.cost import CostModel
from psgate.engines.results import CANCELLED, DROPPED, REJECTED, RequestOutcome, RunResult

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


def summarize(outcomes: Iterable[RequestOutcome], cost: CostModel | None) -> dict:
    """Metrics of a set of outcomes. ``cost`` None: the times are observed (the real
    engine), so the modeled ones (saved and total prefill time) are null, never mixed in."""
    n = measured = waits = rejected = dropped = cancelled = 0
    frac_sum = 0.0
    hit_n = 0
    cached = prompt = new_blocks = recompute = 0
    prefill = wait_ms = 0.0
    ttft, ttft_hit, ttft_miss = [], [], []
    for o in outcomes:
        n += 1
        if o.state == REJECTED:
            rejected += 1
        elif o.state == DROPPED:
            dropped += 1
        elif o.state == CANCELLED:
            cancelled += 1
        if o.waited:
            waits += 1
            wait_ms += o.wait_ms
        if not o.measure or not o.counts_for_hits:
            continue
        measured += 1
        frac_sum += o.cached_tokens / o.prompt_tokens
        cached += o.cached_tokens
        prompt += o.prompt_tokens
        new_blocks += o.new_blocks
        recompute += o.recompute_tokens
        prefill += o.prefill_ms or 0.0
        if o.cached_tokens > 0:
            hit_n += 1
        if o.ttft_ms is not None:
            ttft.append(o.ttft_ms)
            (ttft_hit if o.cached_tokens > 0 else ttft_miss).append(o.ttft_ms)
    for lst in (ttft, ttft_hit, ttft_miss):
        lst.sort()
    saved_ms = (None if cost is None
                else cached * (cost.per_uncached_token_ms - cost.per_cached_token_ms))
    return {
        "requests": n,
        "measured_requests": measured,
        "hit_fraction": _r(frac_sum / measured) if measured else None,
        "token_hit_ratio": _r(cached / prompt) if prompt else None,
        "saved_prefill_tokens": cached,
        "saved_prefill_ms": _r(saved_ms, 3),
        "prefill_ms_total": None if cost is None else _r(prefill, 3),
        "new_blocks": new_blocks,
        "recompute_tokens": recompute,
        "ttft_p50_ms": _r(nearest_rank(ttft, 50), 3),
        "ttft_p95_ms": _r(nearest_rank(ttft, 95), 3),
        "ttft_hit_p50_ms": _r(nearest_rank(ttft_hit, 50), 3),
        "ttft_hit_p95_ms": _r(nearest_rank(ttft_hit, 95), 3),
        "ttft_miss_p50_ms": _r(nearest_rank(ttft_miss, 50), 3),
        "ttft_miss_p95_ms": _r(nearest_rank(ttft_miss, 95), 3),
        "hit_requests": hit_n,
        "miss_requests": measured - hit_n,
        "admission_waits": waits,
        "wait_ms_total": _r(wait_ms, 3),
        "rejected": rejected,
        "dropped": dropped,
        "cancelled": cancelled,
    }


def run_metrics(run: RunResult, cost: CostModel | None) -> dict:
    """The receipt's view of one run: totals, per group, per role, who evicted whom
    (``cost`` None for observed runs, see summarize)."""
    totals = summarize(run.requests, cost)
    totals["evictions"] = run.evictions
    totals["churn"] = _r(run.evictions / run.usable_blocks)
    for k in ("orphans_created", "orphan_blocks_max"):
        if k in run.orphans:       # the real engine does not track orphans
            totals[k] = run.orphans[k]

    by_group: dict[str, list[RequestOutcome]] = {g: [] for g in run.groups}
    by_role: dict[str, list[RequestOutcome]] = {}
    for o in run.requests:
        by_group.setdefault(o.group, []).append(o)
        if o.role is not None:
            by_role.setdefault(o.role, []).append(o)
    suffered: dict[str, int] = {}
    for row in run.evictions_by.values():
        for owner, n in row.items():
            suffered[owner] = suffered.get(owner, 0) + n
    groups = {}
    for g in sorted(by_group):
        m = summarize(by_group[g], cost)
        m["evictions_suffered"] = suffered.get(g, 0)
        m["evictions_caused"] = sum(run.evictions_by.get(g, {}).values())
        m["occupancy_mean"] = _r(run.occupancy_mean.get(g, 0.0), 3)
        m["occupancy_max"] = run.occupancy_max.get(g, 0)
        groups[g] = m
    roles = {role: summarize(by_role[role], cost) for role in sorted(by_role)}
    return {
        "totals": totals,
        "groups": groups,
        "roles": roles,
        "evictions_by": {a: dict(sorted(row.items())) for a, row in sorted(run.evictions_by.items())},
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
