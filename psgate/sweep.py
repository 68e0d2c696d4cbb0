"""Sweeps: one matched-run experiment per cell of a grid, on a process pool or on Ray.

    cells = product of the axes, in the order given:
            capacity=..., candidate=... (policies), and any parameter of the workload
            (alpha for the paper's nominal load, capacity_target, rate_fraction, ...)
    for each cell not already complete in OUT/cells/<id>/:
        run_experiment(workload with the cell's parameters, baseline vs the cell's
                       candidate, --runs seeds derived from --seed)      (in a worker)
    table = one row per cell (axes, means, paired differences with their 95% CIs, gate
            and the names of its failing checks: a failed gate is a row, not an error),
            written as OUT/table.csv and OUT/table.json in cell order

A corpus instead of a workload (``SweepConfig.corpus``, a directory of ``*.jsonl``
traces: one run per trace, as ``psgate replay --trace DIR``) sweeps capacity and
candidate over recorded traces; the cell records each trace's SHA-256.

A cell is complete when its experiment receipt exists and its cell.json matches the
cell's specification, so an interrupted sweep resumes where it stopped and a changed
grid redoes only the cells it changed. The specification includes a digest of the
source files a sim replay runs (``code``, REPLAY_CODE), so a cell computed by other code
(a changed policy, say) is redone rather than resumed. Cell ids are the cell's index and a digest of its
specification. Nothing in a cell depends on which worker ran it or when.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import io
import itertools
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import Callable

import orjson

from psgate import api
from psgate.atomic import write_atomic
from psgate.contracts import load_contracts
from psgate.engines.cost import CostModel
from psgate.engines.step_cost import SchedulerParams, StepCostModel
from psgate.errors import InputError
from psgate.executors import check_executor, run_ray
from psgate.trace.reader import check_seed, corpus_traces
from psgate.experiment import (DEFAULT_RESAMPLES, ExperimentConfig, parse_workload,
                               run_experiment)
from psgate.policies import resolve
from psgate.receipt.gate import Tolerances
from psgate.receipt.receipt import dumps
from psgate.workloads import generators

TABLE_METRICS = ("hit_fraction", "token_hit_ratio", "ttft_p95_ms")


@dataclass
class SweepConfig:
    workload: str | None             # KIND[:key=value,...]; None with ``corpus``
    out: Path
    axes: dict[str, list] = field(default_factory=dict)
    baseline: str = "lru"
    candidate: str = "prefixshield"
    candidate_params: dict = field(default_factory=dict)
    capacity: int = api.DEFAULT_CAPACITY
    runs: int = 3
    seed: int = 0
    resamples: int = DEFAULT_RESAMPLES
    bootstrap_seed: int = 0
    workers: int = 1
    executor: str = "local"
    address: str | None = None
    cost: CostModel = field(default_factory=CostModel)
    paranoid: bool = False
    allow_unexercised: bool = False
    corpus: str | Path | None = None     # a directory of traces instead of a workload
    tolerances: Tolerances = field(default_factory=Tolerances)   # each cell's gate
    scheduler: str = api.DEFAULT_SCHEDULER
    step_cost: StepCostModel = field(default_factory=StepCostModel)
    sched: SchedulerParams = field(default_factory=SchedulerParams)
    contracts_file: str | None = None    # every cell's groups' contracts (psgate.contracts)


_CODE_DIGEST: str | None = None
# The code a cell's sim replays run (files, and folders ending in /), relative to psgate/;
# the CLI, reports, calibration and the live vLLM engines are not in it.
REPLAY_CODE = ("__init__.py", "api.py", "atomic.py", "contracts.py", "errors.py",
               "experiment.py", "resources.py", "sweep.py", "engines/__init__.py",
               "engines/base.py", "engines/cost.py", "engines/pool.py", "engines/replicas.py",
               "engines/results.py", "engines/sched.py", "engines/sim.py",
               "engines/step_cost.py", "invariants/",
               "policies/", "policy/", "receipt/", "stats/", "trace/", "workloads/")


def code_digest() -> str:
    """SHA-256 over the ``*.py`` files of REPLAY_CODE (relative path and bytes, in path
    order): which code a cell's numbers came from."""
    global _CODE_DIGEST
    if _CODE_DIGEST is None:
        root = Path(__file__).resolve().parent
        h = hashlib.sha256()
        for f in sorted(root.rglob("*.py")):
            rel = f.relative_to(root).as_posix()
            if any(rel == c or (c.endswith("/") and rel.startswith(c)) for c in REPLAY_CODE):
                h.update(rel.encode() + b"\0" + f.read_bytes() + b"\0")
        _CODE_DIGEST = h.hexdigest()
    return _CODE_DIGEST


def _file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def parse_axis(text: str) -> tuple[str, list]:
    """``KEY=V1,V2,...`` with JSON values where they parse."""
    key, sep, values = text.partition("=")
    if not sep or not key or not values:
        raise InputError(f"expected KEY=V1,V2,..., found '{text}'", path="--axis")
    out = []
    for v in values.split(","):
        try:
            out.append(orjson.loads(v))
        except orjson.JSONDecodeError:
            out.append(v)
    return key, out


def _corpus(cfg: SweepConfig) -> tuple[Path, dict[str, str]]:
    if cfg.workload:
        raise InputError("give either a workload or a corpus directory, not both",
                         path="--workload")
    d = Path(cfg.corpus)
    if not d.is_dir():
        raise InputError("expected a directory of *.jsonl traces", path=str(d))
    traces = {p.name: _file_sha256(p) for p in corpus_traces(d)}
    if len(traces) < 2:
        raise InputError(f"a sweep cell needs at least 2 traces for a confidence interval, "
                         f"found {len(traces)}", path=str(d))
    for key in cfg.axes:
        if key not in ("capacity", "candidate"):
            raise InputError(f"a corpus sweep's axes are capacity and candidate, found "
                             f"'{key}'", path="--axis")
    return d.resolve(), traces


def cells(cfg: SweepConfig) -> list[dict]:
    for option, seed in (("--seed", cfg.seed), ("--bootstrap-seed", cfg.bootstrap_seed)):
        check_seed(seed, option)     # cell specs and receipts record seeds as JSON numbers
    corpus, traces = (None, None) if cfg.corpus is None else _corpus(cfg)
    if corpus is None:
        kind, params = parse_workload(cfg.workload or "")
        gen = generators().get(kind)
        if gen is None:
            raise InputError(f"unknown workload '{kind}'", path="--workload")
        if cfg.runs < 2:
            raise InputError("a sweep cell needs at least 2 runs for a confidence interval",
                             path="--runs")
    else:
        kind, params, gen = None, {}, None
    for key, values in cfg.axes.items():
        if not values:
            raise InputError(f"axis '{key}' has no values", path="--axis")
        if key == "capacity":
            if any(type(v) is not int or v < 2 for v in values):
                raise InputError(f"capacity values must be integers >= 2, found {values}",
                                 path="--axis")
        elif key == "candidate":
            for v in values:
                resolve(str(v), "--axis candidate")
        elif gen is not None and (key not in gen.defaults or key == "seed"):
            raise InputError(f"'{key}' is neither capacity, candidate nor a parameter of "
                             f"'{kind}' (seeds come from --runs/--seed)", path="--axis")
    contracts_sha256 = (load_contracts(cfg.contracts_file).sha256
                        if cfg.contracts_file is not None else None)
    keys = list(cfg.axes)
    out = []
    for index, combo in enumerate(itertools.product(*(cfg.axes[k] for k in keys))):
        point = dict(zip(keys, combo))
        wl = {**params, **{k: v for k, v in point.items() if k not in ("capacity", "candidate")}}
        spec = {
            "axes": point,
            "workload": kind, "params": wl, "runs": cfg.runs, "seed": cfg.seed,
            "baseline": cfg.baseline, "candidate": point.get("candidate", cfg.candidate),
            "candidate_params": dict(cfg.candidate_params),
            "capacity": point.get("capacity", cfg.capacity), "resamples": cfg.resamples,
            "bootstrap_seed": cfg.bootstrap_seed, "cost": cfg.cost.to_json(),
            "paranoid": cfg.paranoid, "allow_unexercised": cfg.allow_unexercised,
            "non_regression": cfg.tolerances.to_json(),
            "code": code_digest(),
        }
        # A policy from outside psgate: its own code is part of what made the numbers.
        for label, name in (("baseline", spec["baseline"]), ("candidate", spec["candidate"])):
            source = resolve(str(name), f"--{label}")
            if source.kind != "builtin":
                spec.setdefault("policy_code", {})[label] = source.sha256
        if cfg.scheduler == "step":     # a service-model cell's spec is as it always was
            spec.update({"scheduler": "step", "sched": cfg.sched.to_json(),
                         "step_cost": cfg.step_cost.to_json()})
        if cfg.contracts_file is not None:   # its digest is what the cell depends on
            spec["contracts"] = {"path": str(Path(cfg.contracts_file).resolve()),
                                 "sha256": contracts_sha256}
        if corpus is not None:      # one run per trace; where the directory is stays out
            spec.update({"runs": len(traces), "seed": None, "traces": traces,
                         "corpus": str(corpus)})
        digest = hashlib.sha256(dumps({k: (v if k != "contracts" else v["sha256"])
                                       for k, v in spec.items()
                                       if k not in ("axes", "corpus")}))
        spec["id"] = f"c{index:04d}-{digest.hexdigest()[:10]}"
        out.append(spec)
    return out


def _step_settings(spec: dict) -> dict:
    if spec.get("scheduler") != "step":
        return {"scheduler": "service"}
    return {"scheduler": "step", "sched": SchedulerParams(**spec["sched"]),
            "step_cost": StepCostModel.from_json(spec["step_cost"])}


def _workload_text(kind: str, params: dict) -> str:
    return kind + (":" + ",".join(f"{k}={orjson.dumps(v).decode()}" for k, v in params.items())
                   if params else "")


def run_cell(spec: dict, out: str) -> dict:
    """One cell: its experiment (unless already complete), summarised as a table row.
    Module level and plain data in, plain data out, so any executor can ship it."""
    cell_dir = Path(out) / "cells" / spec["id"]
    marker = cell_dir / "cell.json"
    receipt_path = cell_dir / "receipt.json"
    resumed = (receipt_path.exists() and marker.exists()
               and orjson.loads(marker.read_bytes()) == spec)
    if not resumed:
        cost = CostModel.from_json(spec["cost"])
        replay = api.ReplayConfig(baseline=spec["baseline"], candidate=spec["candidate"],
                                  candidate_params=spec.get("candidate_params", {}),
                                  capacity=spec["capacity"], out=cell_dir, force=True,
                                  cost=cost, paranoid=spec["paranoid"],
                                  allow_unexercised=spec["allow_unexercised"],
                                  tolerances=Tolerances.from_json(spec["non_regression"]),
                                  **_step_settings(spec))
        if spec.get("contracts"):
            path = spec["contracts"]["path"]
            if load_contracts(path).sha256 != spec["contracts"]["sha256"]:
                raise InputError("the contracts file changed since the sweep was planned",
                                 path=path)
            replay = dataclasses.replace(replay, contracts_file=path)
        if spec.get("corpus"):
            d = Path(spec["corpus"])
            found = {p.name: _file_sha256(p) for p in sorted(d.iterdir())
                     if p.is_file() and p.suffix == ".jsonl"}
            if found != spec["traces"]:
                raise InputError("the corpus changed since the sweep was planned", path=str(d))
            cfg = ExperimentConfig(replay=replay, corpus=str(d), runs=1,
                                   resamples=spec["resamples"],
                                   bootstrap_seed=spec["bootstrap_seed"])
        else:
            cfg = ExperimentConfig(
                replay=replay, workload=_workload_text(spec["workload"], spec["params"]),
                runs=spec["runs"], seed=spec["seed"], resamples=spec["resamples"],
                bootstrap_seed=spec["bootstrap_seed"])
        receipt = run_experiment(cfg).receipt
        write_atomic(marker, orjson.dumps(spec, option=orjson.OPT_SORT_KEYS))
    else:
        receipt = orjson.loads(receipt_path.read_bytes())
    return _row(spec, receipt, resumed)


def _row(spec: dict, receipt: dict, resumed: bool) -> dict:
    s = receipt["summary"]
    row = {"cell": spec["id"], **spec["axes"], "baseline": spec["baseline"],
           "candidate": spec["candidate"], "capacity": spec["capacity"],
           "runs": s["num_runs"], "gate": receipt["gate"]["result"],
           # a failed gate is a finding of the grid, named here rather than raised
           "gate_failed": "; ".join(c["name"] for c in receipt["gate"]["checks"]
                                    if c["verdict"] == "fail"),
           "resumed": resumed}
    scopes = [("all", s["totals"])] + [(f"role:{r}", v) for r, v in s["roles"].items()]
    for name, scope in scopes:
        for m in TABLE_METRICS:
            e = scope.get(m)
            if e is None:
                continue
            for stat in ("baseline_mean", "candidate_mean", "diff_mean", "diff_ci_low",
                         "diff_ci_high"):
                row[f"{name}.{m}.{stat}"] = e[stat]
    return row


def _write_tables(out: Path, rows: list[dict]) -> None:
    cols: list[str] = []
    for r in rows:
        cols += [k for k in r if k not in cols and k != "resumed"]
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(cols)
    for r in rows:
        w.writerow(["" if r.get(c) is None else r.get(c) for c in cols])
    for name, data in (("table.csv", buf.getvalue().encode()),
                       ("table.json", orjson.dumps([{k: v for k, v in r.items()
                                                      if k != "resumed"} for r in rows],
                                                     option=orjson.OPT_INDENT_2) + b"\n")):
        write_atomic(out / name, data)


def sweep(cfg: SweepConfig, progress: Callable[[int, int, dict], None] | None = None
          ) -> list[dict]:
    check_executor(cfg.executor, cfg.workers)
    api.check_scheduler(api.ReplayConfig(scheduler=cfg.scheduler, sched=cfg.sched))
    specs = cells(cfg)
    cfg.out.mkdir(parents=True, exist_ok=True)
    manifest = {"psgate_sweep": 1, "workload": cfg.workload, "axes": cfg.axes,
                "cells": [s["id"] for s in specs]}
    if cfg.corpus is not None:
        manifest["corpus"] = specs[0]["corpus"] if specs else str(cfg.corpus)
    write_atomic(cfg.out / "sweep.json",
                 orjson.dumps(manifest, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS))
    rows: dict[str, dict] = {}

    def done(spec: dict, row: dict) -> None:
        rows[spec["id"]] = row
        if progress:
            progress(len(rows), len(specs), row)

    if cfg.executor == "ray":
        out = str(cfg.out.resolve())
        run_ray(run_cell, [(spec, out) for spec in specs], cfg.workers, cfg.address,
                lambda i, row: done(specs[i], row))
    elif cfg.workers == 1:
        for spec in specs:
            done(spec, run_cell(spec, str(cfg.out)))
    else:
        with ProcessPoolExecutor(max_workers=cfg.workers, mp_context=get_context("spawn")) as pool:
            pending = {pool.submit(run_cell, spec, str(cfg.out)): spec for spec in specs}
            try:
                while pending:
                    finished, _ = wait(pending, return_when=FIRST_COMPLETED)
                    for f in sorted(finished, key=lambda f: pending[f]["id"]):
                        done(pending.pop(f), f.result())
            except BaseException:
                # A failed cell, Ctrl-C or SIGTERM: stop at the cells already running
                # (each keeps or discards its own outputs whole) instead of starting the rest.
                pool.shutdown(wait=False, cancel_futures=True)
                raise
    ordered = [rows[s["id"]] for s in specs]
    _write_tables(cfg.out, ordered)
    return ordered
