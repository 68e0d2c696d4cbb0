"""Run-level statistics over matched runs: means, paired differences, bootstrap intervals.

    for each scope (totals, group g, role r) and metric m:
        b_i, c_i = baseline's and candidate's m in run i (same trace, capacity and clock)
        d_i = c_i - b_i; rel_i = d_i / b_i where b_i != 0
        report mean(b), mean(c), mean(d) and a 95% percentile-bootstrap interval of mean(d)
        (resample the runs with replacement, R times, from a seeded generator)

The unit of resampling is the run, never the request: requests inside one run share a
cache and are not independent. One run gives a difference but no interval (None), and a
gate check that needs an interval fails closed on it.
"""

from __future__ import annotations

import math
import random

LEVEL = 0.95
STATS = ("baseline_mean", "candidate_mean", "diff_mean", "diff_ci_low", "diff_ci_high",
         "rel_diff_mean", "rel_diff_ci_low", "rel_diff_ci_high")


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 9)


def _mean(xs: list[float]) -> float:
    return math.fsum(xs) / len(xs)


def bootstrap_ci(values: list[float], resamples: int, rng: random.Random,
                 level: float = LEVEL) -> tuple[float, float] | None:
    """Percentile interval of the mean of ``values``; None with fewer than two values."""
    n = len(values)
    if n < 2:
        return None
    means = sorted(_mean([values[rng.randrange(n)] for _ in range(n)])
                   for _ in range(resamples))
    lo_i = int(math.floor((1 - level) / 2 * (resamples - 1)))
    hi_i = int(math.ceil((1 + level) / 2 * (resamples - 1)))
    return means[lo_i], means[hi_i]


def _numeric(d: dict) -> dict[str, float]:
    return {k: v for k, v in d.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)}


def paired_summary(base_runs: list[dict], cand_runs: list[dict], resamples: int,
                   seed: int) -> dict:
    """``*_runs``: one run_metrics() dict per run, in run order. Every numeric metric a scope
    has in every run of both policies is summarised; a scope or metric missing from some run
    (a group that made no request there) is summarised over the runs that have it, and its
    ``n`` says how many. The bootstrap draws come from one generator seeded by ``seed`` and
    visit scopes and metrics in sorted order, so the output is a pure function of its input."""
    rng = random.Random(seed)

    def scope_pairs(kind: str) -> dict[str, list[tuple[dict, dict]]]:
        out: dict[str, list[tuple[dict, dict]]] = {}
        for b, c in zip(base_runs, cand_runs):
            if kind == "totals":
                out.setdefault("", []).append((b["totals"], c["totals"]))
                continue
            for name in sorted(set(b[kind]) & set(c[kind])):
                out.setdefault(name, []).append((b[kind][name], c[kind][name]))
        return out

    def summarise(pairs: list[tuple[dict, dict]]) -> dict:
        metrics = sorted(set.intersection(*(set(_numeric(b)) & set(_numeric(c))
                                            for b, c in pairs)))
        out = {}
        for m in metrics:
            bs = [b[m] for b, c in pairs if b.get(m) is not None and c.get(m) is not None]
            cs = [c[m] for b, c in pairs if b.get(m) is not None and c.get(m) is not None]
            if not bs:
                continue
            diffs = [c - b for b, c in zip(bs, cs)]
            rels = [(c - b) / b for b, c in zip(bs, cs) if b != 0]
            ci = bootstrap_ci(diffs, resamples, rng)
            rci = bootstrap_ci(rels, resamples, rng) if len(rels) == len(diffs) else None
            out[m] = {"n": len(diffs), "baseline_mean": _r(_mean(bs)),
                      "candidate_mean": _r(_mean(cs)), "diff_mean": _r(_mean(diffs)),
                      "diff_ci_low": _r(ci[0]) if ci else None,
                      "diff_ci_high": _r(ci[1]) if ci else None,
                      "rel_diff_mean": _r(_mean(rels)) if len(rels) == len(diffs) else None,
                      "rel_diff_ci_low": _r(rci[0]) if rci else None,
                      "rel_diff_ci_high": _r(rci[1]) if rci else None}
        return out

    totals = scope_pairs("totals")[""]
    return {
        "method": f"paired over {len(base_runs)} matched run(s): candidate minus baseline per "
                  f"run; {int(LEVEL * 100)}% percentile bootstrap of the mean difference "
                  f"({resamples} resamples of runs, seed {seed})",
        "num_runs": len(base_runs),
        "totals": summarise(totals),
        "groups": {g: summarise(p) for g, p in sorted(scope_pairs("groups").items())},
        "roles": {r: summarise(p) for r, p in sorted(scope_pairs("roles").items())},
    }
