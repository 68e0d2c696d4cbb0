"""The library API behind the CLI: validate a trace, replay it, write a receipt.

    receipt = replay(ReplayConfig(trace="incident.jsonl", baseline="lru",
                                  candidate="prefixshield", out=Path("out")))

One validation pass reads the whole trace first (nothing is written for a
trace with an error anywhere), then each policy gets its own streaming pass
over the same bytes with the same capacity, clock and events.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from psgate.atomic import StagedOutput, atomic_file, check_destination, prepare_out_dir
from psgate.contracts import CONTRACT_NAMES, ContractsFile, contracts_params, load_contracts
from psgate.engines import ENGINES, engine_class
from psgate.engines.kv_groups import format_kv_groups, parse_kv_groups
from psgate.engines.cost import CostModel
from psgate.engines.pool import MAX_BLOCKS
from psgate.engines.step_cost import SchedulerParams, StepCostModel
from psgate.engines.replicas import check_replicas, merge_results, replicas_of
from psgate.engines.results import OutcomeSink, Tee
from psgate.engines.vllm_pool import vllm_version
from psgate.errors import EXIT_GATE_FAILED, EXIT_PASS, InputError
from psgate.inputs import read_capped
from psgate.policies import construct, resolve
from psgate.receipt.assemble import assemble_receipt, run_record
from psgate.receipt.gate import (MAX_GATE_FILE_BYTES, GateSpec, Tolerances,
                                 effective_tolerances, evaluate, load_gate_file, needs_paired)
from psgate.receipt.ledger import (COMPRESSIONS, GZIP_LEVEL, GZIP_LEVELS, LEDGER_ROWS,
                                   LEGACY_GZIP_LEVEL, LedgerWriter, RequestSpool, gzip_writer,
                                   ledger_name, write_requests)
from psgate.receipt.receipt import dumps, validate_receipt
from psgate.resources import BUNDLED_PREFIX, DEFAULT_BUNDLED_TRACE
from psgate.stats.bootstrap import paired_summary
from psgate.stats.metrics import MetricsAccumulator, run_metrics
from psgate.stats.saturation import SaturationMeter
from psgate.trace.future import future_uses
from psgate.trace.reader import (HashTable, Limits, TraceReader, TraceSource, corpus_traces,
                                 require_utf8_name, trace_directory, validate_trace)

DEFAULT_TRACE = BUNDLED_PREFIX + DEFAULT_BUNDLED_TRACE
DEFAULT_CAPACITY = 512
SCHEDULERS = ("service", "step")
DEFAULT_SCHEDULER = "step"

ProgressFactory = Callable[[str, int], Callable[[int], None]]


@dataclass
class ReplayConfig:
    trace: str = DEFAULT_TRACE
    baseline: str = "lru"
    candidate: str = "lru"
    baseline_params: dict = field(default_factory=dict)
    candidate_params: dict = field(default_factory=dict)
    capacity: int = DEFAULT_CAPACITY
    engine: str = "sim"
    model_config: str | None = None     # --engine vllm: the model's HF config directory
    time_compression: float = 1.0       # --engine vllm: trace seconds per wall second
    pacing: str = "wall"                # --engine vllm: "wall" or "lockstep" (step clock)
    out: Path = Path("psgate-out")
    force: bool = False
    gate_file: str | None = None
    allow_unexercised: bool = False
    # non-regression tolerances of the default gate (a gate file's [defaults] wins)
    tolerances: Tolerances = field(default_factory=Tolerances)
    paranoid: bool = False
    ledger_hits: bool = False
    ledger_rows: str = "all"            # or "evictions"
    ledger_compression: str = "compact"  # or "none", "gzip"
    # zlib level of a gzip or compact ledger; None: not recorded (a receipt from before the
    # level was recorded, written at LEGACY_GZIP_LEVEL)
    ledger_level: int | None = GZIP_LEVEL
    cost: CostModel = field(default_factory=CostModel)
    # How requests are scheduled: "service" (the first replay model: admission at arrival,
    # one FIFO prefill server) or "step" (vLLM's scheduler on a modeled step clock, with the
    # step cost model and scheduler settings below). vllm-sched always steps.
    scheduler: str = DEFAULT_SCHEDULER
    step_cost: StepCostModel = field(default_factory=StepCostModel)
    sched: SchedulerParams = field(default_factory=SchedulerParams)
    contracts: tuple[str, ...] = CONTRACT_NAMES
    # A contracts file (psgate.contracts): each group's contract, whatever the trace's
    # labels say; recorded in the receipt with its digest. None: the trace's labels.
    contracts_file: str | None = None
    contracts_label: str | None = None  # how the file is named in outputs (verify)
    # How the trace and gate file are named in outputs when that differs from where
    # they are read (verify re-runs a receipt with the names it recorded).
    trace_label: str | None = None
    gate_label: str | None = None
    limits: Limits = field(default_factory=Limits)
    # Serving instances each run is spread over, and how requests are routed to them
    # (psgate.engines.replicas); 1 is the single modeled instance.
    replicas: int = 1
    route: str = "round-robin"

    @property
    def uses_steps(self) -> bool:
        """Whether the replay runs the step scheduler (and records its settings)."""
        return self.engine == "vllm-sched" or (self.engine == "sim" and self.scheduler == "step")


@dataclass
class ReplayResult:
    receipt: dict
    out: Path
    notes: tuple[str, ...] = ()      # about the policies named (a shadowed entry point)

    @property
    def passed(self) -> bool:
        return self.receipt["gate"]["result"] == "pass"

    @property
    def exit_code(self) -> int:
        return EXIT_PASS if self.passed else EXIT_GATE_FAILED


def check_engine(engine: str) -> None:
    if engine == "sim":
        return
    if engine in ENGINES:
        vllm_version(engine)    # EngineUnavailable (exit 3) naming the install command
        return
    raise InputError(f"unknown engine '{engine}'; expected one of {', '.join(ENGINES)}",
                     path="--engine")


def check_scheduler(cfg: ReplayConfig) -> None:
    """The scheduler choice and settings, before any work. ``--scheduler`` is sim's choice;
    vllm-sched always steps, vllm-pool runs the service model and the real engine schedules
    as vLLM does (with these settings)."""
    if cfg.scheduler not in SCHEDULERS:
        raise InputError(f"unknown scheduler '{cfg.scheduler}'; expected one of "
                         f"{', '.join(SCHEDULERS)}", path="--scheduler")
    for name, v in (("--max-num-batched-tokens", cfg.sched.max_num_batched_tokens),
                    ("--max-num-seqs", cfg.sched.max_num_seqs)):
        if not 1 <= v <= 2**31:
            raise InputError(f"expected an integer in 1..2^31, found {v}", path=name)
    if cfg.sched.hybrid and not (cfg.uses_steps or cfg.engine == "vllm"):
        raise InputError(f"KV-cache groups are modeled by the step scheduler only (sim "
                         f"--scheduler step, or vllm-sched; the vllm engine takes its "
                         f"model's); found engine {cfg.engine} with scheduler "
                         f"{cfg.scheduler}", path="--kv-groups")


def check_trace_kv_groups(cfg: ReplayConfig, header, path: str) -> None:
    """A trace that records its model's KV-cache groups (a capture from a hybrid-attention
    model) replays only under those groups: any other model gives other hit fractions."""
    if header.kv_groups is None:
        return
    try:
        recorded = format_kv_groups(parse_kv_groups(header.kv_groups, where=None))
    except InputError as exc:
        raise InputError(str(exc), path=path, line=1, field="kv_groups") from None
    given = format_kv_groups(cfg.sched.kv_groups)
    if recorded != given:
        raise InputError(f"the trace was captured from a model whose KV-cache groups are "
                         f"{recorded}; the replay's are {given}: pass --kv-groups {recorded}",
                         path="--kv-groups")


def contract_table(default: tuple[str, ...], policies) -> list[str]:
    """Contracts a replay accepts: those every contract-aware policy knows (the
    defaults when no policy cares). A trace naming another is bad input."""
    tables = [set(t) for p in policies if (t := p.contract_table()) is not None]
    return sorted(set.intersection(*tables) if tables else set(default))


def validate(trace: str, limits: Limits | None = None) -> dict:
    """The trace's summary; for a directory (a corpus, a capture), each ``*.jsonl`` trace's
    under ``traces`` and the totals, every one checked as replay would check it."""
    directory = trace_directory(trace)
    if directory is not None:
        each = [validate(str(p), limits) for p in corpus_traces(directory)]
        return {"path": trace, "traces": each,
                **{k: sum(t[k] for t in each)
                   for k in ("lines", "requests", "cancels", "dones", "skipped_unknown")}}
    header, summary = validate_trace(trace, limits=limits)
    return {"path": summary.path, "block_size": header.block_size,
            "sha256": summary.sha256, "canonical_sha256": summary.canonical_sha256,
            "lines": summary.num_lines, "requests": summary.num_requests,
            "cancels": summary.num_cancels, "dones": summary.num_dones,
            "distinct_blocks": summary.num_distinct_blocks,
            "skipped_unknown": summary.num_skipped_unknown}


def replay(cfg: ReplayConfig, progress: ProgressFactory | None = None) -> ReplayResult:
    started = time.time()
    check_engine(cfg.engine)
    check_scheduler(cfg)
    check_replicas(cfg.replicas, cfg.route, cfg.engine)
    if cfg.engine == "vllm":
        from psgate.engines.vllm_real import check_pacing
        check_pacing(cfg.pacing)
    require_utf8_name(str(cfg.out), "--out")
    if cfg.ledger_rows not in LEDGER_ROWS:
        raise InputError(f"expected one of {', '.join(LEDGER_ROWS)}, found '{cfg.ledger_rows}'",
                         path="--ledger-rows")
    if cfg.ledger_compression not in COMPRESSIONS:
        raise InputError(f"expected one of {', '.join(COMPRESSIONS)}, found "
                         f"'{cfg.ledger_compression}'", path="--ledger-compression")
    if cfg.ledger_level is not None and (type(cfg.ledger_level) is not int
                                         or cfg.ledger_level not in GZIP_LEVELS):
        raise InputError(f"expected a zlib level from 1 to 9, found {cfg.ledger_level!r}",
                         path="--ledger-level (config.ledger.level)")
    sources = policy_sources(cfg)
    check_capacity(cfg.capacity, sources)
    file = load_contracts_file(cfg)
    if file is not None:
        cfg = dataclasses.replace(cfg, contracts=tuple(file.table()))
    policies = {label: construct(src, contracts_params(run_params(cfg, label),
                                                       getattr(src.cls, "defaults", {}),
                                                       file, f"--{label}-param"),
                                 f"--{label}")
                for label, src in sources.items()}
    contracts = contract_table(cfg.contracts, policies.values())
    if file is not None:
        missing = sorted(set(file.table()) - set(contracts))
        if missing:
            raise InputError(f"a policy's own contract table lacks '{missing[0]}', which the "
                             f"file defines (a contracts file needs policies that take a "
                             f"'contracts' parameter, or none)", path=file.path)
    gate_name = cfg.gate_label or cfg.gate_file
    spec: GateSpec | None = load_gate_file(cfg.gate_file) if cfg.gate_file else None
    if spec is not None and cfg.gate_label:
        spec = dataclasses.replace(spec, path=cfg.gate_label)
    effective_tolerances(spec, cfg.tolerances).validated()   # bad input before any work
    gate_sha = None
    if cfg.gate_file:
        gate_sha = hashlib.sha256(read_capped(cfg.gate_file, "gate file",
                                              MAX_GATE_FILE_BYTES)).hexdigest()

    src = TraceSource.resolve(cfg.trace)
    if cfg.trace_label:
        src = TraceSource(cfg.trace_label, src.path)
    hashes = HashTable()
    header, summary = validate_trace(cfg.trace, hashes, cfg.limits)
    check_trace_kv_groups(cfg, header, summary.path)

    created = prepare_out_dir(cfg.out, cfg.force, inputs=(src.path, cfg.gate_file))
    try:
        result = _replay_into(cfg, sources, policies, spec, gate_sha, gate_name, contracts,
                              src, hashes, header, summary, progress, started, file)
        result.notes = tuple(n for s in sources.values() for n in s.notes)
        return result
    except BaseException:
        if created:     # a failed replay leaves no trace of itself, not even the directory
            try:
                cfg.out.rmdir()
            except OSError:
                pass
        raise


def load_contracts_file(cfg: ReplayConfig) -> ContractsFile | None:
    """The run's contracts file, checked, named as outputs should name it; None when the
    trace's labels decide."""
    if cfg.contracts_file is None:
        return None
    file = load_contracts(cfg.contracts_file)
    if cfg.contracts_label:
        file = dataclasses.replace(file, path=cfg.contracts_label)
    return file


def check_capacity(capacity: int, sources: dict) -> None:
    """--capacity against the pool's limit and each policy's own (``max_blocks``), before
    any work: past them a run would fail after minutes of reading the trace, or never
    finish allocating its arrays."""
    if capacity < 2:
        raise InputError(f"expected at least 2 configured blocks (one is vLLM's null block), "
                         f"found {capacity}", path="--capacity")
    if capacity > MAX_BLOCKS:
        raise InputError(f"expected at most {MAX_BLOCKS} configured blocks (2^31 - 1: block "
                         f"ids are 32-bit), found {capacity}", path="--capacity")
    for label, src in sources.items():
        limit = getattr(src.cls, "max_blocks", None)
        if limit is not None and capacity > limit:
            raise InputError(f"policy '{src.cls.name}' (--{label}) holds at most {limit} "
                             f"configured blocks, found {capacity}", path="--capacity")
    memory = physical_memory()
    if memory is not None and capacity * MIN_BYTES_PER_BLOCK > memory:
        raise InputError(f"{capacity} configured blocks need at least "
                         f"{capacity * MIN_BYTES_PER_BLOCK / 2**30:.1f} GiB (about "
                         f"{MIN_BYTES_PER_BLOCK} bytes per block, lru's), more than this "
                         f"machine's {memory / 2**30:.1f} GiB", path="--capacity")


# The least a replay holds per configured block (the pool's, the checker's and lru's
# per-block arrays): lru against lru at 10^7 blocks peaks at 1.18 GB, 113 bytes a block.
# A capacity whose floor exceeds the machine's memory cannot finish; past the machine's
# memory the kernel's OOM killer ends the run (SIGKILL, no message), after minutes.
MIN_BYTES_PER_BLOCK = 100


def physical_memory() -> int | None:
    """This machine's physical memory in bytes, None where the platform does not say."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def policy_sources(cfg: ReplayConfig) -> dict:
    """Each run's policy spec resolved: its class, checked, and its code described."""
    return {"baseline": resolve(cfg.baseline, "--baseline"),
            "candidate": resolve(cfg.candidate, "--candidate")}


def run_params(cfg: ReplayConfig, label: str) -> dict:
    return cfg.baseline_params if label == "baseline" else cfg.candidate_params


def _replay_into(cfg, sources, policies, spec, gate_sha, gate_name, contracts, src, hashes, header,
                 summary, progress, started, file) -> ReplayResult:
    runs: dict[str, dict] = {}
    results = []
    spools: list[RequestSpool] = []
    engine_cls = engine_class(cfg.engine, cfg.scheduler)
    with StagedOutput(cfg.out) as staged:
        ledger = LedgerWriter(staged.path(ledger_name(cfg.ledger_compression)),
                              hits=cfg.ledger_hits, rows=cfg.ledger_rows,
                              compression=cfg.ledger_compression,
                              level=(LEGACY_GZIP_LEVEL if cfg.ledger_level is None
                                     else cfg.ledger_level))
        try:
            replicated = {label: _Replicated(cfg, label, sources[label], policy)
                          for label, policy in policies.items()}
            for rep in (r for run in replicated.values() for r in run.instances):
                label, policy = rep.label, rep.policy      # label: baseline/r0 on replicas
                ledger.start_run(label, policy.name)
                tick = progress(f"{label} ({policy.name})", summary.num_lines) if progress else None
                if policy.needs_future:
                    policy.set_future(future_uses(src, hashes, rep.lookahead))
                extra = ({"model_config": cfg.model_config,
                          "time_compression": cfg.time_compression, "pacing": cfg.pacing,
                          "step_cost": cfg.step_cost, "sched": cfg.sched}
                         if cfg.engine == "vllm" else {})
                # Outcomes stream to requests.csv's scratch part and the metrics as requests
                # finish, so memory follows what is in flight, not the trace's length.
                run = replicated[rep.run]
                spool = RequestSpool(staged.path(f".requests-{label.replace('/', '-')}.part"),
                                     label, policy.name)
                spools.append(spool)
                if cfg.engine != "vllm":
                    extra["sink"] = run.sink(rep, spool)
                if cfg.uses_steps:
                    extra.update(step_cost=cfg.step_cost, sched=cfg.sched)
                engine = engine_cls(header=header, hashes=hashes, capacity=cfg.capacity,
                                   policy=policy, contracts=contracts,
                                   done_ids=summary.done_ids, cost=cfg.cost, recorder=ledger,
                                   paranoid=cfg.paranoid, label=label, trace_path=src.display,
                                   progress=tick, groups=summary.groups,
                                   max_in_flight=cfg.limits.max_in_flight, **extra)
                with TraceReader(src, hashes, cfg.limits, validated=summary) as reader:
                    events = reader.events()
                    if file is not None:
                        events = file.relabelled(events)
                    events = rep.select(events, tick)
                    result = engine.run(events)
                    if result.aborted is not None:
                        for _ in events:    # an aborted run stops reading: the digest below
                            pass            # is of the whole trace all the same
                    if reader.summary().sha256 != summary.sha256:
                        raise InputError("the trace changed while it was being replayed",
                                         path=src.display)
                if result.requests:             # an engine that does not stream
                    run.extend(result.requests)
                    spool.extend(result.requests)
                if run.finished(result):        # its last instance: the run's record
                    results.append(run.result)
                    runs[rep.run] = run.record(None if cfg.engine == "vllm" else cfg.cost)
        finally:
            ledger.close()
        write_requests(staged.path("requests.csv"), spools)

        paired = None
        if needs_paired(spec):   # one run: a difference, never an interval
            paired = paired_summary([runs["baseline"]["metrics"]],
                                    [runs["candidate"]["metrics"]], resamples=100, seed=0)
        tolerances = effective_tolerances(spec, cfg.tolerances).validated()
        gate = evaluate(runs, spec, cfg.allow_unexercised, paired, tolerances)
        receipt = assemble_receipt(
            cfg, src=src, header=header, summary=summary, policies=policies, sources=sources,
            contracts=contracts, gate_name=gate_name, gate_sha=gate_sha, tolerances=tolerances,
            runs=runs, gate=gate, started=started, contracts_file=file,
            outputs={name: staged.path(name)
                     for name in (ledger_name(cfg.ledger_compression), "requests.csv")})
        validate_receipt(receipt)
        staged.path("receipt.json").write_bytes(dumps(receipt))
        staged.commit()
    return ReplayResult(receipt=receipt, out=cfg.out)


class _Replicated:
    """One run on its instances (``cfg.replicas``, psgate.engines.replicas): the sinks its
    outcomes stream to (the run's metrics and saturation in trace order; with several
    instances also each instance's own) and, once the last instance finished, its record."""

    def __init__(self, cfg: ReplayConfig, label: str, source, policy) -> None:
        params = run_params(cfg, label)
        self.instances = replicas_of(label, cfg.replicas, cfg.route,
                                     lambda: construct(source, params), policy)
        self.label = label
        self.acc, self.meter = MetricsAccumulator(), SaturationMeter()
        self.parts: list[tuple[MetricsAccumulator, SaturationMeter]] = []
        self.results: list = []
        self.result = None

    def sink(self, rep, spool: OutcomeSink) -> OutcomeSink:
        if len(self.instances) == 1:
            return Tee(self.acc, spool, self.meter)
        own = (MetricsAccumulator(), SaturationMeter())
        self.parts.append(own)
        return Tee(rep.in_trace_order(Tee(self.acc, self.meter)), spool, *own)

    def extend(self, outcomes) -> None:
        """Outcomes handed over at the end, in arrival order (one instance only)."""
        self.acc.extend(outcomes)
        self.meter.extend(outcomes)

    def finished(self, result) -> bool:
        self.results.append(result)
        if len(self.results) < len(self.instances):
            return False
        self.result = merge_results(self.label, self.instances, self.results)
        return True

    def record(self, cost) -> dict:
        n = len(self.instances)
        metrics = run_metrics(self.result, cost, self.acc)
        saturation = self.meter.verdict(metrics["totals"]["ttft_p95_ms"], n)
        replicas = None
        if n > 1:
            replicas = []
            for rep, result, (acc, meter) in zip(self.instances, self.results, self.parts):
                totals = run_metrics(result, cost, acc)["totals"]
                replicas.append({
                    "replica": rep.index, "run": rep.label, "requests": len(rep.index_of),
                    "aborted": result.aborted, "metrics": totals, "counts": result.counts,
                    "invariants_hold": all(v.holds for v in result.invariants.values()),
                    "saturation": meter.verdict(totals["ttft_p95_ms"], 1)})
        return run_record(self.result, metrics, saturation, replicas)


def convert_ledger(src, dst) -> int:
    """Write the CSV a compact ledger codes (``src``: the .compact.csv.gz file) to
    ``dst`` atomically, gzip when its name ends in .gz (no name, no time in the header);
    returns the number of lines after the header. ``dst`` may replace a regular file other
    than ``src``, never anything else (a rename onto a symlink, FIFO or device would
    replace it, not write into it)."""
    from psgate.receipt.compact import compact_lines
    src = Path(src)
    if not src.is_file():
        raise InputError("no such compact ledger", path=str(src))
    dst = check_destination(dst)
    if dst.is_symlink() or (dst.exists() and not dst.is_file()):
        raise InputError("exists and is not a regular file; name a new file to write",
                         path=str(dst))
    if dst.exists() and dst.samefile(src):
        raise InputError("is the compact ledger being converted; name another file",
                         path=str(dst))
    n = -1
    with atomic_file(dst) as out:
        gz = gzip_writer(out) if dst.name.endswith(".gz") else None
        sink = gz or out
        batch: list[str] = []
        for line in compact_lines(src):
            batch.append(line)
            n += 1
            if len(batch) >= 4096:
                sink.write("".join(batch).encode())
                batch.clear()
        sink.write("".join(batch).encode())
        if gz is not None:
            gz.close()
    return n
