"""One run spread over N serving instances: routing the trace's requests, merging results.

A trace captured from a cluster overloads the single instance a replay models. With
``--replicas N`` each run is N engine instances, each with its own policy instance and the
configured blocks, replayed one after another over the same trace: instance i reads the
whole trace and keeps the requests routed to it, with their cancel and done events. Their
results are merged into the run's (outcomes in trace order through the run's sink, counts
summed, invariants held only where every instance held them) and kept per instance.

Routing rules (``--route``), a pure function of the trace, so a replay is deterministic:
  round-robin  request k of the trace (0-based arrival index) goes to instance k mod N;
  session      a request goes to instance H(key) mod N, key = its ``prefix`` (the trace's
               logical prefix label, the one field that names a conversation or session),
               else its ``group``; H = BLAKE2b with an 8-byte digest (BLAKE2b-64) of the
               key's UTF-8, read big-endian. A conversation stays on one instance, so its
               prefix stays where it was cached.
Memory per instance pass: the ids routed to it (a cancel or done names only the id) and
8 bytes per routed request (its trace arrival index); the validation pass holds every id.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Callable, Iterable, Iterator

from psgate.engines.results import REJECTED, OutcomeSink, RequestOutcome, RunResult
from psgate.errors import InputError
from psgate.invariants.checker import Verdict
from psgate.trace.model import RequestEvent

ROUTES = ("round-robin", "session")
MAX_REPLICAS = 1024
# The real vLLM engine runs one live runtime and hands its outcomes over at the end; the
# replaying engines stream theirs through a sink, which is what the merge needs.
UNREPLICATED_ENGINES = ("vllm",)


def check_replicas(replicas: int, route: str, engine: str) -> None:
    """Bad values are bad input, named by their option, before any work."""
    if type(replicas) is not int or not 1 <= replicas <= MAX_REPLICAS:
        raise InputError(f"expected an integer in 1..{MAX_REPLICAS}, found {replicas!r}",
                         path="--replicas")
    if route not in ROUTES:
        raise InputError(f"expected one of {', '.join(ROUTES)}, found '{route}'",
                         path="--route")
    if replicas > 1 and engine in UNREPLICATED_ENGINES:
        raise InputError(f"engine '{engine}' runs one live vLLM runtime; --replicas above 1 "
                         f"needs a replaying engine (sim, vllm-pool)", path="--replicas")


def route_key(ev: RequestEvent) -> str:
    """What session affinity hashes: the request's prefix label, else its group."""
    return ev.prefix if ev.prefix is not None else ev.group


def replica_of(route: str, replicas: int, ev: RequestEvent, arrival: int) -> int:
    """The instance request ``ev`` (the trace's ``arrival``-th request) is routed to."""
    if replicas == 1:
        return 0
    if route == "round-robin":
        return arrival % replicas
    digest = hashlib.blake2b(route_key(ev).encode("utf-8", "surrogatepass"),
                             digest_size=8).digest()
    return int.from_bytes(digest, "big") % replicas


class _InTraceOrder(OutcomeSink):
    """An instance's outcomes handed on with their arrival index in the whole trace."""

    def __init__(self, replica: "Replica", sink: OutcomeSink) -> None:
        self._replica = replica
        self._add = sink.add

    def add(self, outcome: RequestOutcome, index: int) -> None:
        g = self._replica.index_of[index]
        if outcome.state == REJECTED:
            self._replica.rejected.append((g, outcome.id))
        self._add(outcome, g)


class Replica:
    """Instance ``index`` of ``num`` of one run: the events it sees, its ledger label."""

    def __init__(self, run: str, index: int, num: int, route: str, policy) -> None:
        self.run = run
        self.index = index
        self.num = num
        self.route = route
        self.policy = policy
        # the ledger's and requests.csv's run column: which instance a row comes from
        self.label = run if num == 1 else f"{run}/r{index}"
        self.index_of = array("q")      # instance arrival index -> trace arrival index
        self.rejected: list[tuple[int, str]] = []

    def select(self, events: Iterable, tick: Callable[[int], None] | None = None,
               record: bool = True) -> Iterator:
        """The trace's events this instance sees, in trace order; ``tick`` gets the line
        of each event it does not see (the engine ticks the others). ``record``: note each
        routed request's trace arrival index (the replay's pass; a look-ahead pass, such
        as the clairvoyant policy's, does not)."""
        if self.num == 1:
            yield from events
            return
        own: set[str] = set()
        arrival = 0
        route, num, index = self.route, self.num, self.index
        for ev in events:
            if type(ev) is RequestEvent:
                mine = replica_of(route, num, ev, arrival) == index
                arrival += 1
                if mine:
                    own.add(ev.id)
                    if record:
                        self.index_of.append(arrival - 1)
            else:
                mine = ev.id in own
            if mine:
                yield ev
            elif tick is not None:
                tick(ev.line)

    def lookahead(self, events: Iterable) -> Iterator:
        """select() for a pass that reads ahead (the clairvoyant policy's future)."""
        return self.select(events, record=False)

    def in_trace_order(self, sink: OutcomeSink) -> OutcomeSink:
        """``sink`` fed this instance's outcomes with their trace arrival index."""
        return sink if self.num == 1 else _InTraceOrder(self, sink)


def replicas_of(run: str, num: int, route: str, make_policy: Callable[[], object],
                first_policy) -> list[Replica]:
    """The instances of one run: the first runs ``first_policy`` (the one the receipt's
    config describes), the others a fresh instance each from ``make_policy``."""
    return [Replica(run, i, num, route, first_policy if i == 0 else make_policy())
            for i in range(num)]


def _merge_verdicts(parts: list[tuple[int, dict[str, Verdict]]]) -> dict[str, Verdict]:
    out: dict[str, Verdict] = {}
    for i, verdicts in parts:
        for name, v in verdicts.items():
            m = out.get(name)
            if m is None:
                m = out[name] = Verdict(name=v.name, hard=v.hard)
            m.checks += v.checks
            m.violations += v.violations
            if m.first_violation is None and v.first_violation is not None:
                m.first_violation = f"r{i}: {v.first_violation}"
    return out


def _sum_maps(maps: Iterable[dict]) -> dict:
    out: dict = {}
    for m in maps:
        for k, v in m.items():
            out[k] = out.get(k, 0) + v
    return out


def merge_results(run: str, replicas: list[Replica], results: list[RunResult]) -> RunResult:
    """One run's result from its instances': sums of counts, evictions, who evicted whom,
    occupancy (mean and max per group summed over instances: the blocks the cluster held)
    and orphans; every invariant's checks and violations summed (it holds only where it
    held on every instance); the usable blocks of all instances (so churn is per block of
    the cluster); rejected ids in trace order; the earliest start and the latest end."""
    if len(results) == 1:
        return results[0]
    groups: list[str] = []
    for r in results:
        groups += [g for g in r.groups if g not in groups]
    evictions_by: dict[str, dict[str, int]] = {}
    for r in results:
        for a, row in r.evictions_by.items():
            mine = evictions_by.setdefault(a, {})
            for b, n in row.items():
                mine[b] = mine.get(b, 0) + n
    aborted = next((f"r{i}: {r.aborted}" for i, r in enumerate(results) if r.aborted), None)
    return RunResult(
        label=run, policy=results[0].policy,
        usable_blocks=sum(r.usable_blocks for r in results),
        requests=[o for r in results for o in r.requests], groups=groups,
        evictions=sum(r.evictions for r in results), evictions_by=evictions_by,
        occupancy_mean=_sum_maps(r.occupancy_mean for r in results),
        occupancy_max=_sum_maps(r.occupancy_max for r in results),
        counts=_sum_maps(r.counts for r in results),
        invariants=_merge_verdicts(list(enumerate(r.invariants for r in results))),
        orphans=_sum_maps(r.orphans for r in results), aborted=aborted,
        rejected_ids=[rid for _, rid in sorted(x for rep in replicas for x in rep.rejected)],
        start_ns=min(r.start_ns for r in results), end_ns=max(r.end_ns for r in results))
