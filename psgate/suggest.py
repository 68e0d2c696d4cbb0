"""Contracts from data (``psgate contracts suggest``): each group's refill and burst sized
from its own history, written as a contracts file (psgate.contracts).

    history   the trace's requests arriving in the first ``history`` fraction of its
              arrival span (or before ``until_s``), replayed under LRU at ``capacity`` on
              the configured scheduler (and instances). With no group in debt
              prefixshield-b evicts as LRU does, so LRU's creations are what a contract
              that never puts a group in debt has to cover: each admitted request creates
              its prompt blocks that missed and its full output blocks, at admission.
    need      per group, rate = the ``quantile`` of its creation rate over trailing windows
              of ``window_s`` (taken at each creation) times ``headroom``, at least
              ``min_refill``; a group spread over instances needs its busiest instance's.
    turnover  all groups' refills together may come to at most the cache once per
              ``window_s`` (capacity / window_s blocks/s), shared max-min fairly
              (water-filling): a group needing less than an equal share gets its need,
              the others split what is left equally. The refill is min(need, share).
    fit       the burst a group needs at that refill never to owe over the history
              (stats.creation.envelope_burst, times ``headroom``, at least ``min_burst``).
              If it is at most ``max_burst_share`` of the cache, the group fits: its
              contract is that refill and burst, each raised to its label's class where
              the class is larger (a suggestion never takes away what the built-in table
              gave). If not, the group's history over-runs any contract the cache can
              give (a flood, or a victim whose blocks a flood kept evicting, both judged
              on the history as it was): it keeps its label's class, unchanged.
    default   groups not in the history (an attacker that appears later, a new tenant)
              fall back to the default class, which the file names.
    owed      per group, the share of the history span the contract written would have
              spent below zero (stats.creation.owed_share): 0 for a group that fits.

So an attacker flooding in the history gets the built-in contract of its label, never a
contract its flood bought; a tenant that fits its history and changes behaviour later
over-runs the contract it got and owes. The result is deterministic: the same trace and
settings give the same file, byte for byte.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from psgate.contracts import DEFAULT_CONTRACTS, MAX_CONTRACTS, dumps_contracts
from psgate.engines import engine_class
from psgate.engines.cost import CostModel
from psgate.engines.pool import MAX_BLOCKS
from psgate.engines.replicas import check_replicas, replicas_of
from psgate.engines.step_cost import SchedulerParams, StepCostModel
from psgate.errors import InputError
from psgate.policies import make_policy
from psgate.stats.creation import (envelope_burst, max_min_fair, owed_share, quantile,
                                   window_rates)
from psgate.trace.model import CancelEvent, DoneEvent, RequestEvent
from psgate.trace.reader import (HashTable, TraceReader, TraceSource, corpus_traces,
                                 trace_directory, validate_trace)


@dataclass(frozen=True)
class SuggestConfig:
    trace: str
    capacity: int
    history: float = 0.5            # the first fraction of the arrival span
    until_s: float | None = None    # instead: requests arriving before this time (s)
    window_s: float = 5.0
    quantile: float = 0.99
    headroom: float = 1.5
    max_burst_share: float = 0.5
    min_refill: float = 1.0
    min_burst: float = 16.0
    default: str = "best-effort"
    classes: dict = field(default_factory=lambda: {k: list(v) for k, v in
                                                   DEFAULT_CONTRACTS.items()})
    scheduler: str = "step"
    replicas: int = 1               # instances the trace is spread over, each ``capacity``
    route: str = "round-robin"
    sched: SchedulerParams = field(default_factory=SchedulerParams)
    step_cost: StepCostModel = field(default_factory=StepCostModel)

    def checked(self) -> "SuggestConfig":
        def bad(option: str, expected: str, found) -> InputError:
            return InputError(f"expected {expected}, found {found!r}", path=option)
        if not 0 < self.history <= 1:
            raise bad("--history", "a fraction in (0, 1]", self.history)
        for option, v in (("--window", self.window_s), ("--headroom", self.headroom),
                          ("--min-refill", self.min_refill)):
            if not (v > 0 and v < float("inf")):
                raise bad(option, "a finite number > 0", v)
        if not 0 < self.quantile <= 1:
            raise bad("--quantile", "a fraction in (0, 1]", self.quantile)
        if not 0 < self.max_burst_share <= 1:
            raise bad("--max-burst-share", "a fraction in (0, 1]", self.max_burst_share)
        if not self.min_burst >= 1:
            raise bad("--min-burst", "at least 1 block", self.min_burst)
        if self.until_s is not None and not self.until_s > 0:
            raise bad("--until", "a time > 0 s", self.until_s)
        if not 2 <= self.capacity <= MAX_BLOCKS:
            raise bad("--capacity", f"2 to {MAX_BLOCKS} configured blocks", self.capacity)
        check_replicas(self.replicas, self.route, "sim")
        if self.default not in self.classes:
            raise bad("--default", f"one of {', '.join(sorted(self.classes))}", self.default)
        return self


@dataclass
class GroupSizing:
    """One group's row of the suggestion table."""

    group: str
    label: str                 # the contract the trace labelled it with (its first request)
    requests: int
    created: float             # blocks created in the history, under LRU
    mean_rate: float           # blocks/s over the history span
    rate_need: float           # quantile window rate, times headroom
    burst_need: float          # envelope at rate_need, times headroom
    refill: float
    burst: float
    fits: bool                 # its history fits a contract under the caps
    notes: list[str]           # what the caps did
    owed_share: float

    def to_json(self) -> dict:
        return {"group": self.group, "label": self.label, "requests": self.requests,
                "created_blocks": round(self.created, 3),
                "mean_rate": round(self.mean_rate, 6), "rate_need": round(self.rate_need, 6),
                "burst_need": round(self.burst_need, 6), "refill": self.refill,
                "burst": self.burst, "fits": self.fits, "notes": self.notes,
                "owed_share": round(self.owed_share, 6)}


@dataclass
class Suggestion:
    config: SuggestConfig
    span_s: tuple[float, float]            # the history window, trace seconds
    groups: list[GroupSizing]
    turnover_budget: float                 # blocks/s, all groups together

    def contracts(self) -> dict[str, list[float]]:
        return {g.group: [g.refill, g.burst] for g in self.groups}

    def text(self, source: str) -> str:
        c = self.config
        return dumps_contracts(
            c.default, c.classes, self.contracts(),
            comments=[f"contracts suggested by psgate from {source}",
                      f"history: trace seconds {self.span_s[0]:.3f} to {self.span_s[1]:.3f}, "
                      f"replayed under lru at {c.capacity} blocks ({c.scheduler} scheduler)",
                      f"rate: the {c.quantile:g} quantile over {c.window_s:g}-s windows, "
                      f"burst: its envelope, both x {c.headroom:g}",
                      f"caps: refills share {self.turnover_budget:.6g} blocks/s max-min "
                      f"fairly (the cache once per window), bursts at most "
                      f"{c.max_burst_share:g} of the cache; a group whose history does not "
                      f"fit keeps its label's class", ""],
            notes={g.group: (f"observed {g.created:g} blocks in {g.requests} requests; "
                             f"would have owed {100 * g.owed_share:.2f}% of the history"
                             + (f"; {'; '.join(g.notes)}" if g.notes else ""))
                   for g in self.groups})

    def to_json(self) -> dict:
        c = self.config
        return {"history_s": [round(self.span_s[0], 6), round(self.span_s[1], 6)],
                "capacity": c.capacity, "window_s": c.window_s, "quantile": c.quantile,
                "headroom": c.headroom, "max_burst_share": c.max_burst_share,
                "turnover_budget": round(self.turnover_budget, 6), "default": c.default,
                "groups": [g.to_json() for g in self.groups]}


def split_time_s(lines: list[dict], history: float) -> float:
    """Where a trace's history ends (trace seconds): ``history`` of its arrival span after
    the first arrival, the cut :func:`suggest` makes; ``lines`` are the trace's lines
    (header first) as dicts."""
    ts = [e["t"] for e in lines[1:] if e.get("op") == "request"]
    if not ts:
        raise InputError("no request in the trace")
    return min(ts) + history * (max(ts) - min(ts))


def rest_lines(lines: list[dict], t_s: float) -> list[dict]:
    """The trace's requests arriving at or after ``t_s``, with their cancels and dones,
    under the same header: the part a time split judges contracts on."""
    out, ids = [lines[0]], set()
    for e in lines[1:]:
        if e.get("op") == "request":
            if e["t"] < t_s:
                continue
            ids.add(e["id"])
        elif e.get("id") not in ids:
            continue
        out.append(e)
    return out


def _round(x: float) -> float:
    """A contract value as the file writes it: 3 decimals, so the file reads the same."""
    return round(x, 3)


def _history(path: str) -> tuple[list, object, object, HashTable]:
    hashes = HashTable()
    header, summary = validate_trace(path, hashes)
    with TraceReader(TraceSource.resolve(path), hashes, validated=summary) as reader:
        events = list(reader.events())
    return events, header, summary, hashes


def _creations(cfg: SuggestConfig, events: list, header, summary, hashes, t_end_ns: int
               ) -> tuple[list[list[tuple[str, float, float]]], list[RequestEvent]]:
    """Per instance, (group, admission time s, blocks created) of each admitted request of
    the history, replayed under LRU (every instance holds its own contracts' buckets, so
    each is sized on what one instance sees); and the history's requests."""
    kept, ids = [], set()
    for ev in events:
        if ev.t_ns >= t_end_ns:
            break
        if type(ev) is RequestEvent:
            ids.add(ev.id)
        elif type(ev) in (CancelEvent, DoneEvent) and ev.id not in ids:
            continue
        kept.append(ev)
    reqs = {ev.id: ev for ev in kept if type(ev) is RequestEvent}
    if not reqs:
        return [], []
    labels = sorted({ev.contract for ev in reqs.values()})
    step = ({"step_cost": cfg.step_cost, "sched": cfg.sched}
            if cfg.scheduler == "step" else {})
    bs = header.block_size
    per_instance = []
    for rep in replicas_of("history", cfg.replicas, cfg.route, lambda: make_policy("lru"),
                           make_policy("lru")):
        engine = engine_class("sim", cfg.scheduler)(
            header=header, hashes=hashes, capacity=cfg.capacity, policy=rep.policy,
            contracts=labels, done_ids=summary.done_ids & ids, groups=(), cost=CostModel(),
            **step)
        result = engine.run(rep.select(iter(kept)))
        out = []
        for o in result.requests:
            if o.queue_ms is None:          # rejected, or never admitted: created nothing
                continue
            ev = reqs[o.id]
            full_out = (ev.prompt_tokens + ev.out) // bs - ev.prompt_tokens // bs
            out.append((o.group, o.t_ns / 1e9 + o.queue_ms / 1e3,
                        float(o.new_blocks + full_out)))
        per_instance.append(out)
    return per_instance, list(reqs.values())


def suggest(cfg: SuggestConfig) -> Suggestion:
    """Contracts for every group of the trace's (or capture directory's) history."""
    cfg.checked()
    directory = trace_directory(cfg.trace)
    paths = [str(p) for p in corpus_traces(directory)] if directory else [cfg.trace]
    loaded = [_history(p) for p in paths]
    arrivals = [ev.t_ns for events, *_ in loaded for ev in events
                if type(ev) is RequestEvent]
    if not arrivals:
        raise InputError("no request to learn from", path=cfg.trace)
    t0, t1 = min(arrivals), max(arrivals)
    if cfg.until_s is not None:
        t_end = int(round(cfg.until_s * 1e9))
    else:
        t_end = t0 + int(round(cfg.history * (t1 - t0))) + (1 if cfg.history >= 1 else 0)
    span = (t0 / 1e9, min(t_end, t1 + 1) / 1e9)
    # per instance, per group: its creations (a capture directory's files share one
    # clock, so they join per instance)
    series: list[dict[str, list[tuple[float, float]]]] = [{} for _ in range(cfg.replicas)]
    label: dict[str, str] = {}
    requests: dict[str, int] = {}
    for events, header, summary, hashes in loaded:
        per_instance, seen = _creations(cfg, events, header, summary, hashes, t_end)
        for ev in seen:     # a group whose requests were all rejected created nothing
            label.setdefault(ev.group, ev.contract)
            requests[ev.group] = requests.get(ev.group, 0) + 1
        for i, rows in enumerate(per_instance):
            for group, t, n in rows:
                series[i].setdefault(group, []).append((t, n))
    if not label:
        raise InputError(f"no request arrives in the history window (before trace second "
                         f"{t_end / 1e9:.3f})", path=cfg.trace)
    if len(label) + len(cfg.classes) > MAX_CONTRACTS:
        raise InputError(f"{len(label)} groups in the history and {len(cfg.classes)} classes: "
                         f"a contracts file holds at most {MAX_CONTRACTS} contracts",
                         path=cfg.trace)
    for per_group in series:
        for s in per_group.values():
            s.sort()
    h = cfg.headroom
    # a group's need is its busiest instance's
    rate_need = {g: max(cfg.min_refill,
                        h * max((quantile(window_rates(per_group[g], cfg.window_s),
                                          cfg.quantile)
                                 for per_group in series if g in per_group), default=0.0))
                 for g in label}
    budget = cfg.capacity / cfg.window_s
    fair = max_min_fair(rate_need, budget)
    burst_cap = max(1.0, cfg.max_burst_share * cfg.capacity)
    rows = []
    hist_span = max(1e-9, span[1] - span[0])
    for g in sorted(label):
        mine = [per_group[g] for per_group in series if g in per_group]
        cls_name = label[g] if label[g] in cfg.classes else cfg.default
        cls_rho, cls_beta = cfg.classes[cls_name]
        notes = []
        rho = min(rate_need[g], fair[g])
        beta = max(1.0, cfg.min_burst,
                   h * max((envelope_burst(s, rho) for s in mine), default=0.0))
        fits = beta <= burst_cap
        if fits:
            # it fits: never below its class, raised to what its history needs
            if max(rho, cls_rho) < rate_need[g]:
                notes.append(f"refill {rate_need[g]:.3f} -> {max(rho, cls_rho):.3f} "
                             f"(turnover share), burst {beta:.3f} covers it")
            rho, beta = max(rho, cls_rho), max(beta, cls_beta)
        else:
            notes.append(f"needs a burst of {beta:.3f} at a refill of {rho:.3f} (its "
                         f"turnover share), over the cap of {burst_cap:.3f}: keeps class "
                         f"{cls_name}")
            rho, beta = cls_rho, cls_beta
        rho, beta = _round(rho), max(1.0, _round(beta))
        created = sum(n for s in mine for _, n in s)
        rows.append(GroupSizing(
            group=g, label=label[g], requests=requests[g], created=created,
            mean_rate=created / hist_span / cfg.replicas, rate_need=rate_need[g],
            burst_need=h * max((envelope_burst(s, rate_need[g]) for s in mine), default=0.0),
            refill=rho, burst=beta, fits=fits, notes=notes,
            owed_share=max((owed_share(s, rho, beta, span[0], span[1]) for s in mine),
                           default=0.0)))
    return Suggestion(cfg, span, rows, budget)
