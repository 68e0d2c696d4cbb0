"""A group's block creation over time, read as a token bucket would read it.

A series is one group's creations in time order: ``(t_s, blocks)``. The questions a
contract is sized by:

    window_rates(s, W)      at each creation: blocks created in (t - W, t] / W
    envelope_burst(s, rho)  the least burst with which a bucket refilled at rho, starting
                            full, never owes:  max over a <= b of  created in [a, b] - rho * (b - a),
                            computed as a running backlog  q = max(0, q - rho * dt) + n
    owed_share(s, rho, beta, t0, t1)
                            the share of [t0, t1] the bucket (rho, beta), starting full,
                            spends below zero (each creation charged whole at its time)
    max_min_fair(needs, budget)
                            water-filling: every need at or below the fair level is met, the
                            others get the level, with sum = min(budget, sum of needs)

Everything here is exact arithmetic on the series given: no clock, no randomness.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

Series = Sequence[tuple[float, float]]


def window_rates(series: Series, window_s: float) -> list[float]:
    """Blocks per second over the trailing ``window_s`` at each creation in ``series``."""
    out, total, lo = [], 0.0, 0
    for t, n in series:
        total += n
        while series[lo][0] <= t - window_s:
            total -= series[lo][1]
            lo += 1
        out.append(total / window_s)
    return out


def quantile(values: Sequence[float], q: float) -> float:
    """The nearest-rank ``q`` quantile of ``values`` (0 for none)."""
    if not values:
        return 0.0
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


def envelope_burst(series: Series, rho: float) -> float:
    """The least burst a bucket refilled at ``rho`` needs never to owe over ``series``."""
    backlog = worst = 0.0
    prev = None
    for t, n in series:
        if prev is not None:
            backlog = max(0.0, backlog - rho * (t - prev))
        backlog += n
        worst = max(worst, backlog)
        prev = t
    return worst


def owed_share(series: Series, rho: float, beta: float, t0: float, t1: float) -> float:
    """The share of ``[t0, t1]`` a bucket ``(rho, beta)``, full at ``t0``, is below zero."""
    span = t1 - t0
    if span <= 0:
        return 0.0
    level, now, owed = beta, t0, 0.0
    for t, n in series:
        if t > t1:
            break
        if level < 0:        # below zero from ``now`` until it refills to 0, or until t
            owed += min(t, now - level / rho) - now
        level = min(beta, level + rho * (t - now)) - n
        now = t
    if level < 0:
        owed += min(t1, now - level / rho) - now
    return min(1.0, max(0.0, owed / span))


def max_min_fair(needs: dict[str, float], budget: float) -> dict[str, float]:
    """Each key's share of ``budget`` by water-filling over ``needs`` (ties in key order)."""
    out: dict[str, float] = {}
    left = budget
    pending = sorted(needs, key=lambda k: (needs[k], k))
    while pending:
        level = left / len(pending)
        k = pending[0]
        if needs[k] <= level:
            out[k] = needs[k]
            left -= needs[k]
            pending.pop(0)
        else:
            for k in pending:
                out[k] = level
            break
    return out
