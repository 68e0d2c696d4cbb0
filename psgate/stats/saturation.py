"""Whether a run's modeled instance was saturated: its waiting backlog grew without bound.

A trace captured from several serving instances overloads the one instance a replay models:
requests queue for minutes, the queue pins the cache, and hit fractions then measure the
queue, not the policy. The verdict comes from the per-request outcomes alone (arrival time,
queue delay, state), so it is the same for every engine, and the TTFT p95 the metrics
already report.

The rule (the README and the receipt schema quote it):
  arrival_span_s last arrival - first arrival, over every request of the run (span_s)
  queue delay    ``queue_ms`` of each admitted request (completed, cancelled or unfinished):
                 arrival to the start of its prefill, capacity waits included
  queue_slope    least-squares slope of queue delay (s) on arrival time (s) over the second
                 half of the arrivals (by arrival index): the seconds of delay the backlog
                 adds per second of trace. A FIFO server offered load rho grows it at
                 rho - 1 (fluid limit); a stable one keeps it near 0
  queue_end_s    mean queue delay of the last tenth of the arrivals
  saturated      when (queue_slope >= SLOPE_MIN and queue_end_s >= END_MIN * span_s)
                 or ttft_p95 >= P95_MIN * span_s (a p95 TTFT as long as the trace itself)
  undetermined   fewer than MIN_REQUESTS admitted requests, or a zero span (a burst at one
                 instant has no trend to read)
  suggested_replicas  (saturated only) ceil(N * (1 + queue_slope) / TARGET_LOAD) for a run
                 on N replicas, at least N + 1: the offered load read from the slope, spread
                 so each replica runs at TARGET_LOAD
Memory is fixed: sums per bin of arrival indices (BINS bins, each twice as wide whenever the
arrivals outgrow them), so the halves and tenths are taken at bin edges (exact up to BINS
arrivals, within 2/BINS of the run beyond).
"""

from __future__ import annotations

import math

from psgate.engines.results import (CANCELLED, COMPLETED, UNFINISHED, OutcomeSink,
                                    RequestOutcome)

SLOPE_MIN = 0.1
END_MIN = 0.1
P95_MIN = 1.0
MIN_REQUESTS = 20
TARGET_LOAD = 0.8
BINS = 256
_ADMITTED = frozenset((COMPLETED, CANCELLED, UNFINISHED))   # RequestOutcome.counts_for_hits

SATURATED, NOT_SATURATED, UNDETERMINED = "saturated", "not_saturated", "undetermined"


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 6)


class SaturationMeter(OutcomeSink):
    """The queue-delay sums of one run, fed each outcome with its arrival index."""

    __slots__ = ("width", "n", "sx", "sy", "sxx", "sxy", "t_ref", "t_min", "t_max",
                 "num_arrivals", "num_admitted")

    def __init__(self) -> None:
        self.width = 1                           # arrival indices per bin
        self.n = [0] * BINS                      # admitted requests per bin
        self.sx = [0.0] * BINS                   # arrival s (from t_ref)
        self.sy = [0.0] * BINS                   # queue delay s
        self.sxx = [0.0] * BINS
        self.sxy = [0.0] * BINS
        self.t_ref: int | None = None
        self.t_min = 1 << 62
        self.t_max = -(1 << 62)
        self.num_arrivals = 0                    # highest arrival index + 1
        self.num_admitted = 0

    def _widen(self) -> None:
        """Twice as wide bins: bin i takes bins 2i and 2i+1 (sums stay exact)."""
        half = BINS // 2
        for a in (self.n, self.sx, self.sy, self.sxx, self.sxy):
            a[:half] = [a[2 * i] + a[2 * i + 1] for i in range(half)]
            a[half:] = [type(a[0])()] * half
        self.width *= 2

    def add(self, o: RequestOutcome, index: int = 0) -> None:
        t = o.t_ns
        if t > self.t_max:
            self.t_max = t
        if t < self.t_min:
            self.t_min = t
        if index >= self.num_arrivals:
            self.num_arrivals = index + 1
        q = o.queue_ms
        if q is None or o.state not in _ADMITTED:
            return
        b = index // self.width
        while b >= BINS:
            self._widen()
            b = index // self.width
        if self.t_ref is None:
            self.t_ref = t
        x = (t - self.t_ref) / 1e9
        y = q / 1000.0
        self.n[b] += 1
        self.sx[b] += x
        self.sy[b] += y
        self.sxx[b] += x * x
        self.sxy[b] += x * y
        self.num_admitted += 1

    def extend(self, outcomes) -> "SaturationMeter":
        """Outcomes already in arrival order (an engine that does not stream)."""
        for i, o in enumerate(outcomes):
            self.add(o, i)
        return self

    def _bins_from(self, first_index: int) -> range:
        return range(min(BINS, -(-first_index // self.width)), BINS)

    def verdict(self, ttft_p95_ms: float | None, replicas: int = 1) -> dict:
        """The receipt's ``saturation`` object for this run (``replicas``: the instances
        the run was spread over, for the suggestion)."""
        span = max(0.0, (self.t_max - self.t_min) / 1e9)
        half = self._bins_from(self.num_arrivals // 2)
        n = sum(self.n[b] for b in half)
        slope = None
        if n >= 2:
            sx = sum(self.sx[b] for b in half)
            sy = sum(self.sy[b] for b in half)
            sxx = sum(self.sxx[b] for b in half) - sx * sx / n
            sxy = sum(self.sxy[b] for b in half) - sx * sy / n
            if sxx > 1e-12 * max(1.0, sx * sx / n):
                slope = sxy / sxx
        end = self._bins_from(self.num_arrivals - self.num_arrivals // 10)
        n_end = sum(self.n[b] for b in end)
        queue_end = sum(self.sy[b] for b in end) / n_end if n_end else None
        p95 = None if ttft_p95_ms is None else ttft_p95_ms / 1000.0
        end_vs_span = queue_end / span if queue_end is not None and span > 0 else None
        p95_vs_span = p95 / span if p95 is not None and span > 0 else None
        reasons = []
        if self.num_admitted < MIN_REQUESTS:
            verdict = UNDETERMINED
            reasons.append(f"{self.num_admitted} admitted requests: too few to read a trend "
                           f"(fewer than {MIN_REQUESTS})")
        elif span <= 0:
            verdict = UNDETERMINED
            reasons.append("every request arrived at one instant: no trend to read")
        else:
            if (slope is not None and slope >= SLOPE_MIN and end_vs_span is not None
                    and end_vs_span >= END_MIN):
                reasons.append(f"queue delay grows {slope:.3g} s per trace second over the "
                               f"second half and ends at {queue_end:.4g} s "
                               f"({end_vs_span:.3g} of the span)")
            if p95_vs_span is not None and p95_vs_span >= P95_MIN:
                reasons.append(f"TTFT p95 {p95:.4g} s is {p95_vs_span:.3g} times the "
                               f"trace's span")
            verdict = SATURATED if reasons else NOT_SATURATED
        suggested = None
        if verdict == SATURATED:
            load = 1.0 + max(0.0, slope or 0.0)
            suggested = max(replicas + 1, math.ceil(replicas * load / TARGET_LOAD - 1e-9))
        return {
            "verdict": verdict,
            "reasons": reasons,
            "admitted_requests": self.num_admitted,
            "arrival_span_s": _r(span),
            "queue_slope": _r(slope),
            "queue_end_s": _r(queue_end),
            "queue_end_vs_span": _r(end_vs_span),
            "ttft_p95_vs_span": _r(p95_vs_span),
            "suggested_replicas": suggested,
        }
