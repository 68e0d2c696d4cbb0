"""Matched runs: one baseline/candidate comparison repeated over seeds or over a corpus.

    runs = [generate(KIND, params, seed_i) for i < N]      (--workload KIND --runs N --seed S)
        or [every *.jsonl in DIR, sorted by name]           (--trace DIR: an incident corpus)
    for each run: api.replay(baseline, candidate) into runs/<id>/ (its own receipt, ledgers
                  and structural gate; both policies see the identical trace, capacity, clock)
    summary = paired_summary(run-level metrics of every run)   (bootstrap CI over runs)
    gate    = every run's structural checks passed + non-regression on the paired
              intervals (overall and per group) + the gate file's checks on means and summary

seed_i = the first 4 bytes of SHA-256("psgate-run:S:i") as an integer below 2^31, so
distinct base seeds never share a run seed by construction and each run's seed is
recorded. Output (written so that a reader sees whole files or none):

    OUT/receipt.json        the experiment receipt (schemas/experiment.schema.json), last
    OUT/runs.csv            one row per run, policy and scope: the headline metrics
    OUT/runs/<id>/          each run's own receipt.json, ledger.csv, requests.csv
    OUT/traces/<id>.jsonl   the generated traces (a --workload experiment)
"""

from __future__ import annotations

import csv
import hashlib
import io
import re
import shutil
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

import orjson

from psgate import __version__, api
from psgate.atomic import EXPERIMENT_OUTPUTS, StagedOutput, prepare_out_dir
from psgate.engines.cost import CostModel
from psgate.errors import InputError
from psgate.receipt.gate import (GateSpec, effective_tolerances, evaluate_experiment,
                                 load_gate_file)
from psgate.receipt.ledger import file_sha256
from psgate.receipt.receipt import deterministic_part, dumps
from psgate.resources import first_schema_error
from psgate.stats.bootstrap import paired_summary
from psgate.trace.reader import check_seed, corpus_traces, require_utf8_name, validate_trace
from psgate.trace.writer import write_trace
from psgate.workloads import generate, generators
from psgate.workloads.common import StepRates

EXPERIMENT_FORMAT = 1
# One default for every command that bootstraps (replay over matched runs, sweep).
DEFAULT_RESAMPLES = 2_000
CSV_METRICS = ("hit_fraction", "token_hit_ratio", "saved_prefill_tokens", "ttft_p95_ms",
               "evictions_suffered", "evictions")
_ID = re.compile(r"[^A-Za-z0-9._-]+")


def derive_seed(base: int, i: int) -> int:
    digest = hashlib.sha256(f"psgate-run:{base}:{i}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


def _split_top(text: str) -> list[str]:
    """Split on commas outside brackets and quotes, so list values keep theirs."""
    parts, depth, quote, cur = [], 0, False, []
    for ch in text:
        if ch == '"':
            quote = not quote
        elif not quote and ch in "[{":
            depth += 1
        elif not quote and ch in "]}":
            depth -= 1
        if ch == "," and depth == 0 and not quote:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return parts


def parse_workload(spec: str) -> tuple[str, dict]:
    """``KIND[:key=value,...]`` (values as JSON when they parse, else strings)."""
    kind, _, rest = spec.partition(":")
    if not kind:
        raise InputError(f"expected KIND[:key=value,...], found '{spec}'", path="--workload")
    params: dict = {}
    for item in (_split_top(rest) if rest else []):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise InputError(f"expected key=value, found '{item}'", path="--workload")
        try:
            params[key.strip()] = orjson.loads(value)
        except orjson.JSONDecodeError:
            params[key.strip()] = value
    return kind, params


@dataclass
class ExperimentConfig:
    """A replay configuration repeated over runs; ``workload`` or ``corpus``, not both."""
    replay: api.ReplayConfig
    workload: str | None = None          # KIND[:key=value,...]
    corpus: str | None = None            # a directory of traces
    # How outputs name the corpus directory when it is read from elsewhere (verify
    # rebuilds an experiment from the traces its runs' receipts name).
    corpus_label: str | None = None
    runs: int = 1
    seed: int = 0
    resamples: int = DEFAULT_RESAMPLES
    bootstrap_seed: int = 0
    cost_for_workload: CostModel | StepRates | None = None
    run_ids: list[str] = field(default_factory=list, init=False)


# An experiment's result is read like a replay's: its receipt, where it is, and the gate.
ExperimentResult = api.ReplayResult


def _plan(cfg: ExperimentConfig) -> tuple[list[tuple[str, int | None, Path | None]], dict]:
    """(run id, seed, trace path or None to generate) per run, and the source description."""
    if (cfg.workload is None) == (cfg.corpus is None):
        raise InputError("give either --workload KIND or --trace DIR", path="--workload")
    if cfg.resamples < 100:
        raise InputError(f"expected at least 100 bootstrap resamples, found {cfg.resamples}",
                         path="--resamples")
    for option, seed in (("--seed", cfg.seed), ("--bootstrap-seed", cfg.bootstrap_seed)):
        check_seed(seed, option)     # receipts record seeds as JSON numbers
    require_utf8_name(str(cfg.replay.out), "--out")
    if cfg.corpus is not None:
        if cfg.runs != 1:
            raise InputError("--runs applies to --workload; a corpus has one run per trace",
                             path="--runs")
        d = Path(cfg.corpus)
        traces = corpus_traces(d)
        for p in traces:    # every trace is checked before any run is written
            validate_trace(str(p), limits=cfg.replay.limits)
        ids = [_ID.sub("_", p.stem) for p in traces]
        if len(set(ids)) != len(ids):
            raise InputError("two traces map to the same run id; rename one", path=str(d))
        return ([(i, None, p) for i, p in zip(ids, traces)],
                {"kind": "corpus", "directory": cfg.corpus_label or str(d),
                 "traces": [p.name for p in traces]})
    if cfg.runs < 1:
        raise InputError(f"expected at least 1 run, found {cfg.runs}", path="--runs")
    kind, params = parse_workload(cfg.workload)
    gen = generators().get(kind)
    if gen is not None and gen.uses_cost and cfg.cost_for_workload is None:
        # rates follow the cost model in use: the step model's where the workload asks
        cfg.cost_for_workload = (StepRates(cfg.replay.step_cost, cfg.replay.sched)
                                 if params.get("rates") == "step" else cfg.replay.cost)
    if "seed" in params:
        raise InputError("the run seeds derive from --seed; do not set seed in --workload",
                         path="--workload")
    generate(kind, {**params, "seed": derive_seed(cfg.seed, 0)},  # validates kind and params
             cost=cfg.cost_for_workload)
    width = max(3, len(str(cfg.runs - 1)))
    plan = [(f"run-{i:0{width}d}", derive_seed(cfg.seed, i), None) for i in range(cfg.runs)]
    source = {"kind": "workload", "workload": kind, "params": params, "base_seed": cfg.seed,
              "runs": cfg.runs}
    if cfg.cost_for_workload is not None and cfg.cost_for_workload.origin is not None:
        source["cost_model"] = dict(cfg.cost_for_workload.origin)
    return plan, source


def _csv(rows: list[dict]) -> bytes:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["run", "seed", "policy_role", "policy", "scope", *CSV_METRICS])
    for r in rows:
        for label in ("baseline", "candidate"):
            m = r["metrics"][label]
            scopes = [("run", m["totals"])] + [(f"group:{g}", v) for g, v in m["groups"].items()] \
                + [(f"role:{k}", v) for k, v in m["roles"].items()]
            for scope, vals in scopes:
                w.writerow([r["id"], "" if r["seed"] is None else r["seed"], label,
                            r["policies"][label], scope,
                            *("" if vals.get(k) is None else vals[k] for k in CSV_METRICS)])
    return buf.getvalue().encode()


def _headline(metrics: dict) -> dict:
    pick = lambda d: {k: d.get(k) for k in CSV_METRICS if k in d}  # noqa: E731
    return {"totals": pick(metrics["totals"]),
            "groups": {g: pick(v) for g, v in metrics["groups"].items()},
            "roles": {r: pick(v) for r, v in metrics["roles"].items()}}


def _record_final_paths(receipt: dict, staged: Path, final: Path, trace: Path | None) -> None:
    """A run's receipt names where its outputs (and a generated trace) are once the
    experiment is swapped in, not the staging directory it was written to, so ``psgate
    verify`` finds the trace from anywhere. Only the environment section changes."""
    env = receipt["environment"]
    env["out_dir"] = str(final.resolve())
    if trace is not None:
        env["trace_abspath"] = str(trace.resolve())
    (staged / "receipt.json").write_bytes(dumps(receipt))


def run_experiment(cfg: ExperimentConfig,
                   progress: Callable[[int, int, str], None] | None = None) -> ExperimentResult:
    started = time.time()
    base = cfg.replay
    plan, source = _plan(cfg)
    spec: GateSpec | None = load_gate_file(base.gate_file) if base.gate_file else None
    if spec is not None and base.gate_label:
        spec = replace(spec, path=base.gate_label)
    tolerances = effective_tolerances(spec, base.tolerances).validated()
    api.check_engine(base.engine)
    out = Path(base.out)
    created = prepare_out_dir(out, base.force, inputs=(cfg.corpus, base.gate_file))
    try:
        # The whole experiment (runs, traces, runs.csv, receipt) is built in the staging
        # directory and swapped in at the end: a kill or a late error keeps the old one.
        with StagedOutput(out, replaces=EXPERIMENT_OUTPUTS) as staged:
            work = staged.staging
            rows, run_gates, base_metrics, cand_metrics = [], [], [], []
            for n, (run_id, seed, trace) in enumerate(plan):
                if progress:
                    progress(n, len(plan), run_id)
                label = f"traces/{run_id}.jsonl" if trace is None else \
                    str(Path(cfg.corpus_label) / trace.name) if cfg.corpus_label else str(trace)
                if trace is None:
                    kind, params = parse_workload(cfg.workload)
                    trace = work / "traces" / f"{run_id}.jsonl"
                    trace.parent.mkdir(exist_ok=True)
                    write_trace(trace, generate(kind, {**params, "seed": seed},
                                                cost=cfg.cost_for_workload))
                run_out = work / "runs" / run_id
                run_out.parent.mkdir(exist_ok=True)
                result = api.replay(api.ReplayConfig(
                    trace=str(trace), baseline=base.baseline, candidate=base.candidate,
                    baseline_params=base.baseline_params, candidate_params=base.candidate_params,
                    capacity=base.capacity, engine=base.engine, out=run_out, force=False,
                    gate_file=None, allow_unexercised=base.allow_unexercised,
                    # runs are judged together on their paired interval, not one by one
                    tolerances=replace(tolerances, enabled=False),
                    paranoid=base.paranoid, ledger_hits=base.ledger_hits, cost=base.cost,
                    scheduler=base.scheduler, step_cost=base.step_cost, sched=base.sched,
                    ledger_rows=base.ledger_rows, ledger_compression=base.ledger_compression,
                    ledger_level=base.ledger_level,
                    contracts=base.contracts, limits=base.limits,
                    contracts_file=base.contracts_file,
                    contracts_label=base.contracts_label or base.contracts_file,
                    # Generated traces are named relative to OUT, so the receipts do not
                    # depend on where OUT is.
                    trace_label=label))
                r = result.receipt
                _record_final_paths(r, run_out, out / "runs" / run_id,
                                    out / label if trace.is_relative_to(work) else None)
                run_gates.append((run_id, r["gate"]))
                base_metrics.append(r["runs"]["baseline"]["metrics"])
                cand_metrics.append(r["runs"]["candidate"]["metrics"])
                rows.append({
                    "id": run_id, "seed": seed,
                    "trace": {"path": label, "canonical_sha256": r["trace"]["canonical_sha256"],
                              "num_requests": r["trace"]["num_requests"]},
                    "receipt": str(Path("runs") / run_id / "receipt.json"),
                    # Of the receipt outside its environment section: the run's evidence,
                    # the same wherever and whenever the run was made.
                    "receipt_sha256": hashlib.sha256(dumps(deterministic_part(r))).hexdigest(),
                    "gate": r["gate"]["result"],
                    "policies": {k: r["runs"][k]["policy"]["name"] for k in ("baseline", "candidate")},
                    "metrics": {"baseline": _headline(base_metrics[-1]),
                                "candidate": _headline(cand_metrics[-1])},
                })
                saturated = [k for k in ("baseline", "candidate")
                             if (r["runs"][k].get("saturation") or {}).get("verdict")
                             == "saturated"]
                if saturated:       # its hit fractions measure the backlog, not the policy
                    rows[-1]["saturated"] = saturated
            if progress:
                progress(len(plan), len(plan), "summary")
            paired = paired_summary(base_metrics, cand_metrics, cfg.resamples, cfg.bootstrap_seed)
            if source["kind"] == "corpus":
                paired["method"] = paired["method"].replace("matched run(s)", "traces")
            gate = evaluate_experiment(run_gates, paired, spec, tolerances)
            staged.path("runs.csv").write_bytes(_csv(rows))
            first = None
            if rows:
                first = orjson.loads((work / rows[0]["receipt"]).read_bytes())["config"]
            receipt = {
                "psgate_experiment": EXPERIMENT_FORMAT,
                "tool": {"name": "psgate", "version": __version__},
                "source": source,
                "config": {
                    "engine": base.engine, "capacity": base.capacity,
                    "usable_blocks": base.capacity - 1, "cost_model": base.cost.to_json(),
                    "baseline": first["baseline"], "candidate": first["candidate"],
                    "allow_unexercised": base.allow_unexercised, "paranoid": base.paranoid,
                    "limits": base.limits.to_json(),
                    "non_regression": tolerances.to_json(),
                    "gate_file": ({"path": base.gate_label or base.gate_file,
                                   "sha256": hashlib.sha256(Path(base.gate_file).read_bytes())
                                   .hexdigest()} if base.gate_file else None),
                    "bootstrap": {"resamples": cfg.resamples, "seed": cfg.bootstrap_seed,
                                  "level": 0.95, "method": "percentile, runs resampled"},
                },
                "runs": [{k: v for k, v in r.items() if k != "policies"} for r in rows],
                "summary": paired,
                "gate": gate,
                "outputs": {"runs.csv": {"sha256": file_sha256(staged.path("runs.csv"))}},
                "environment": {"out_dir": str(out.resolve()), "started_unix": round(started, 3),
                                "wall_s": round(time.time() - started, 3)},
            }
            for key in ("replay_model", "scheduler", "step_cost_model", "contracts_file"):
                if key in first:        # the step scheduler's settings, as each run has them
                    receipt["config"][key] = first[key]
            found = first_schema_error(receipt, "experiment")
            if found:   # a defect in psgate, never in the input
                raise AssertionError(f"experiment receipt violates its schema at {found[0]}: "
                                     f"{found[1]}")
            staged.path("receipt.json").write_bytes(dumps(receipt))
            staged.commit()
    except BaseException:
        if created:
            shutil.rmtree(out, ignore_errors=True)
        raise
    return ExperimentResult(receipt=receipt, out=out)
