"""What one replay produces, independent of how it will be reported."""

from __future__ import annotations

from dataclasses import dataclass, field

from psgate.invariants.checker import Verdict

# Final states of a request in a replay.
COMPLETED = "completed"        # ran to its release time
CANCELLED = "cancelled"        # admitted, then cancelled (its hits count)
DROPPED = "dropped"            # cancelled while waiting (kept out of hit metrics)
REJECTED = "rejected"          # cannot fit even into an empty cache
UNFINISHED = "unfinished"      # still holding blocks when the trace ended (partial traces)


@dataclass(slots=True)
class RequestOutcome:
    id: str
    group: str
    contract: str
    role: str | None
    measure: bool
    state: str
    t_ns: int
    prompt_tokens: int
    cached_tokens: int = 0
    new_blocks: int = 0
    recompute_tokens: int = 0
    queue_ms: float | None = None
    prefill_ms: float | None = None
    ttft_ms: float | None = None
    release_ns: int | None = None
    waited: bool = False
    wait_ms: float = 0.0
    preemptions: int = 0           # times the step scheduler preempted it (recomputed later)
    # tokens it computed again after its preemptions: what it had computed when preempted,
    # less what its lookup on resuming found cached
    preempt_recompute_tokens: int = 0

    @property
    def counts_for_hits(self) -> bool:
        return self.state in (COMPLETED, CANCELLED, UNFINISHED)


class OutcomeSink:
    """Where an engine hands each request's outcome the moment it is final (``add``), with
    the request's arrival index (0, 1, ... in trace order). A replay that streams its
    per-request results to disk and keeps only aggregates needs memory for what is in
    flight, not for the whole trace; an engine given no sink collects the outcomes in
    ``RunResult.requests`` instead (an engine that cannot stream always does)."""

    def add(self, outcome: RequestOutcome, index: int) -> None:
        raise NotImplementedError


class Tee(OutcomeSink):
    """Several sinks fed the same outcomes, in the same order."""

    def __init__(self, *sinks: OutcomeSink) -> None:
        self._adds = tuple(s.add for s in sinks)

    def add(self, outcome: RequestOutcome, index: int) -> None:
        for add in self._adds:
            add(outcome, index)


@dataclass(slots=True)
class RunResult:
    label: str
    policy: dict
    usable_blocks: int
    requests: list[RequestOutcome]         # empty when they went to an OutcomeSink
    groups: list[str]                      # in first-seen order
    evictions: int
    evictions_by: dict[str, dict[str, int]]   # requesting group -> owning group -> count
    occupancy_mean: dict[str, float]
    occupancy_max: dict[str, int]
    counts: dict[str, int]
    invariants: dict[str, Verdict]
    orphans: dict[str, int]
    aborted: str | None = None
    rejected_ids: list[str] = field(default_factory=list)
    start_ns: int = 0
    end_ns: int = 0
    observed: dict | None = None     # the real engine: observed vs predicted per request
