"""psgate's command line: parse options, call psgate.api, render. No logic here.

Exit codes: 0 gate passed, 1 gate failed, 2 bad input or usage (including outputs that
cannot be written and memory exhausted), 3 engine unavailable, 4 internal error (a psgate
bug; PSGATE_DEBUG=1 prints its traceback), 5 verify: the receipt's
policy code is not the code here, 130/143 interrupted by SIGINT/SIGTERM (the previous
outputs are left as they were).
Humans read stderr (rich); machines read stdout (one JSON object) and the files.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import time
from pathlib import Path
from typing import Annotated, Optional

import signal

import orjson
import typer
import typer.main
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

from psgate import __version__, api
from psgate.atomic import check_output, write_atomic
from psgate.suggest import SuggestConfig, suggest
from psgate.check import DEFAULT_EXAMPLES, DEFAULT_TIME_LIMIT_S, check_policy
from psgate.engines.cost import (COEFFICIENTS, CostModel, checked_coefficients,
                                 load_cost_model, load_step_cost_model, step_cost_from_params)
from psgate.engines.kv_groups import parse_retention
from psgate.engines.replicas import check_replicas
from psgate.engines.step_cost import SchedulerParams, StepCostModel
from psgate.errors import (EXIT_BAD_INPUT, EXIT_INTERNAL, EXIT_INTERRUPTED,
                           EXIT_POLICY_CHANGED, EXIT_TERMINATED, InputError, PsgateError)
from psgate.policies import describe as describe_policy
from psgate.policies import installed as installed_policies
from psgate.policy import API_VERSION
from psgate.experiment import DEFAULT_RESAMPLES
from psgate.receipt.gate import Tolerances, load_gate_file
from psgate.receipt.junit import write_junit
from psgate.report.diff import diff as diff_receipts
from psgate.report.explain import explain as explain_rows
from psgate.report.explain import (explain_block, explain_request, render_block,
                                   render_request)
from psgate.report.html import build_report
from psgate.report import render
from psgate.report.verify import verify as verify_receipt
from psgate.trace.importers import import_trace
from psgate.trace.reader import MAX_BLOCK_SIZE, Limits, require_utf8_name, trace_directory
from psgate.trace.stats import trace_stats
from psgate.trace.redact import UNKEYED_WARNING, key_fingerprint, load_key, redact_lines
from psgate.trace.writer import write_trace
from psgate.workloads import generate as generate_workload
from psgate.workloads import generators as workload_generators

app = typer.Typer(add_completion=True, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Policy receipt and release gate for KV prefix-cache eviction.")
err = Console(stderr=True, highlight=False)


def _emit(obj: dict) -> None:
    sys.stdout.buffer.write(orjson.dumps(obj, option=orjson.OPT_SORT_KEYS) + b"\n")
    sys.stdout.flush()


def _params(items: list[str] | None, option: str) -> dict:
    out = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise InputError(f"expected KEY=VALUE, found '{item}'", path=option)
        try:
            out[key] = orjson.loads(value)
        except orjson.JSONDecodeError:
            out[key] = value
    return out


def _cost(items: list[str] | None, model_file: str | None = None) -> CostModel:
    if model_file is not None:
        if items:
            raise InputError("--cost-param and --cost-model are exclusive: a calibrated file "
                             "is used as measured", path="--cost-param")
        return load_cost_model(model_file)
    return CostModel(**checked_coefficients(_params(items, "--cost-param"), COEFFICIENTS,
                                            "--cost-param"))


def _step_cost(items: list[str] | None, model_file: str | None = None) -> StepCostModel:
    """The step replay's cost model: a calibrated file's step fit, or the defaults with
    --step-param overrides."""
    if model_file is not None:
        if items:
            raise InputError("--step-param and --cost-model are exclusive: a calibrated file "
                             "is used as measured", path="--step-param")
        return load_step_cost_model(model_file)
    return step_cost_from_params(_params(items, "--step-param"), "--step-param")


def _limits(line_bytes: int, blocks: int, in_flight: int) -> Limits:
    for name, v in (("--max-line-bytes", line_bytes), ("--max-blocks-per-request", blocks),
                    ("--max-in-flight", in_flight)):
        if not 1 <= v <= 2**31:
            raise InputError(f"expected an integer in 1..2^31, found {v}", path=name)
    return Limits(line_bytes, blocks, in_flight)


def _progress_factory():
    if not err.is_terminal:
        return None
    progress = Progress(TextColumn("{task.description}"), BarColumn(),
                        TextColumn("{task.completed}/{task.total} lines"), TimeRemainingColumn(),
                        console=err, transient=True)

    def factory(label: str, total: int):
        if not progress.live.is_started:
            progress.start()
        task = progress.add_task(label, total=total)

        def tick(line: int) -> None:
            if line % 512 == 0 or line == total:
                progress.update(task, completed=line)
                if line == total:
                    progress.stop()
        return tick
    return factory


def _require_policies(baseline: str | None, candidate: str | None,
                      candidate_axis: bool = False) -> None:
    """No default policy: a gate comparing a default with itself would pass on nothing."""
    for opt, v in (("--baseline", baseline), ("--candidate", candidate)):
        if v is None and not (opt == "--candidate" and candidate_axis):
            raise InputError("missing option: name a policy (psgate policies lists them; "
                             "module:Class or path/to/file.py:Class name your own), "
                             "e.g. --baseline lru --candidate prefixshield", path=opt)


def _refuse_existing(path: Path, force: bool, option: str) -> None:
    """Every writer's rule: an existing output is replaced only with --force."""
    if Path(path).exists() and not force:
        raise InputError(f"already exists; pass --force to replace it, or name another "
                         f"{option}", path=str(path))


def _output(path: Path, option: str, force: bool | None, **protect) -> None:
    """Every single-file writer's checks, before any work: the path can take a file and is
    none of the command's inputs (psgate.atomic.check_output: ``protect`` names them), and
    an existing one is replaced only with --force (``force`` None: no such rule)."""
    check_output(path, option, **protect)
    if force is not None:
        _refuse_existing(path, force, option)


def _spec_file(spec: str | None) -> tuple[str, str | None]:
    """A policy spec's source file (path/to/file.py:Class), which no output may replace."""
    head = (spec or "").rpartition(":")[0]
    return "the policy source", head if head.endswith(".py") else None


def _tolerances(hit: float, tokens: float, ttft: float, min_requests: int,
                min_requests_ttft: int) -> Tolerances:
    return Tolerances(hit=hit, tokens=tokens, ttft=ttft, min_requests=min_requests,
                      min_requests_ttft=min_requests_ttft).validated()


@app.command()
def replay(
    trace: Annotated[str, typer.Option(help="psgate-trace v1 file, bundled:NAME, or a directory of traces (one run each, one gate)", rich_help_panel="Trace, policies, output")] = api.DEFAULT_TRACE,
    workload: Annotated[Optional[str], typer.Option(help="generate matched runs: KIND[:key=value,...] (see psgate trace kinds)", rich_help_panel="Matched runs (--workload)")] = None,
    runs: Annotated[int, typer.Option(help="matched runs of --workload, each with its own seed derived from --seed", rich_help_panel="Matched runs (--workload)")] = 1,
    seed: Annotated[int, typer.Option(help="base seed of the matched runs", rich_help_panel="Matched runs (--workload)")] = 0,
    resamples: Annotated[int, typer.Option(help="bootstrap resamples for the confidence intervals", rich_help_panel="Matched runs (--workload)")] = DEFAULT_RESAMPLES,
    bootstrap_seed: Annotated[int, typer.Option(help="seed of the bootstrap resampling", rich_help_panel="Matched runs (--workload)")] = 0,
    baseline: Annotated[Optional[str], typer.Option(help="policy the serving engine runs today (required)", show_default=False, rich_help_panel="Trace, policies, output")] = None,
    candidate: Annotated[Optional[str], typer.Option(help="policy proposed to replace it (required)", show_default=False, rich_help_panel="Trace, policies, output")] = None,
    capacity: Annotated[int, typer.Option(help="configured KV blocks (one is the null block)", rich_help_panel="Trace, policies, output")] = api.DEFAULT_CAPACITY,
    engine: Annotated[str, typer.Option(help="sim (default), vllm-pool, vllm-sched or vllm", rich_help_panel="Engine and scheduler")] = "sim",
    model_config: Annotated[Optional[str], typer.Option(help="--engine vllm: Hugging Face model config directory (default: the bundled tiny Qwen2)", rich_help_panel="Engine and scheduler")] = None,
    time_compression: Annotated[float, typer.Option(help="--engine vllm: trace seconds per wall-clock second", rich_help_panel="Engine and scheduler")] = 1.0,
    pacing: Annotated[str, typer.Option(help="--engine vllm: wall (requests on the compressed wall clock, times observed) or lockstep (on the modeled step clock, one step at a time, times modeled)", rich_help_panel="Engine and scheduler")] = "wall",
    scheduler: Annotated[str, typer.Option(help="--engine sim: step (vLLM's scheduler on a modeled step clock) or service (the first model: admission at arrival, one prefill server)", rich_help_panel="Engine and scheduler")] = api.DEFAULT_SCHEDULER,
    max_num_batched_tokens: Annotated[int, typer.Option(help="step scheduler: token budget of one step (vLLM's max_num_batched_tokens)", rich_help_panel="Engine and scheduler")] = SchedulerParams().max_num_batched_tokens,
    max_num_seqs: Annotated[int, typer.Option(help="step scheduler: most requests running at once (vLLM's max_num_seqs)", rich_help_panel="Engine and scheduler")] = SchedulerParams().max_num_seqs,
    no_chunked_prefill: Annotated[bool, typer.Option("--no-chunked-prefill", help="step scheduler: do not split long prompts under the token budget (chunked prefill is on by default, as in vLLM)", rich_help_panel="Engine and scheduler")] = False,
    step_param: Annotated[Optional[list[str]], typer.Option(help="step cost model parameter KEY=VALUE (ms)", rich_help_panel="Engine and scheduler")] = None,
    kv_groups: Annotated[str, typer.Option(help="step scheduler: the model's KV-cache groups in vLLM's order, as full,sliding:4096 (a hybrid-attention model: one pool, a sliding-window group frees blocks outside its window)", rich_help_panel="Engine and scheduler")] = "full",
    retention_interval: Annotated[str, typer.Option(help="--kv-groups: vLLM's prefix cache retention interval: 0 (its default) caches a sliding-window group's blocks only where a later request can resume, N (a multiple of the block size) also every N tokens, dense every full block", rich_help_panel="Engine and scheduler")] = "0",
    out: Annotated[Path, typer.Option("--out", "-o", help="output directory for receipt.json and ledgers", rich_help_panel="Trace, policies, output")] = Path("psgate-out"),
    force: Annotated[bool, typer.Option(help="replace existing outputs (a non-empty output directory, the --junit file)", rich_help_panel="Trace, policies, output")] = False,
    gate: Annotated[Optional[str], typer.Option(help="gate file (TOML) with extra checks", rich_help_panel="Trace, policies, output")] = None,
    contracts: Annotated[Optional[str], typer.Option(help="contracts file (TOML, psgate contracts suggest): each group's contract, whatever the trace's labels", rich_help_panel="Trace, policies, output")] = None,
    tolerance_hit: Annotated[float, typer.Option(help="non-regression: hit fraction the candidate may lose (absolute), overall and per group", rich_help_panel="Gate tolerances")] = Tolerances().hit,
    tolerance_tokens: Annotated[float, typer.Option(help="non-regression: fraction of the baseline's saved prefill tokens the candidate may lose", rich_help_panel="Gate tolerances")] = Tolerances().tokens,
    tolerance_ttft: Annotated[float, typer.Option(help="non-regression: fraction of the baseline's p95 TTFT the candidate may add", rich_help_panel="Gate tolerances")] = Tolerances().ttft,
    min_requests: Annotated[int, typer.Option(help="non-regression: scopes with fewer measured requests are not judged on hit fraction and saved tokens", rich_help_panel="Gate tolerances")] = Tolerances().min_requests,
    min_requests_ttft: Annotated[int, typer.Option(help="non-regression: scopes with fewer measured requests are not judged on p95 TTFT", rich_help_panel="Gate tolerances")] = Tolerances().min_requests_ttft,
    allow_unexercised: Annotated[bool, typer.Option("--allow-unexercised", help="pass the gate even if nothing was evicted", rich_help_panel="Gate tolerances")] = False,
    paranoid: Annotated[bool, typer.Option(help="recheck every invariant from scratch after each mutation (slow)", rich_help_panel="Ledger and checks")] = False,
    ledger_hits: Annotated[bool, typer.Option(help="add one ledger row per hit block", rich_help_panel="Ledger and checks")] = False,
    ledger_rows: Annotated[str, typer.Option(help="all (default) or evictions: only eviction rows, for long traces", rich_help_panel="Ledger and checks")] = "all",
    ledger_compression: Annotated[str, typer.Option(help="compact (default): ledger.compact.csv.gz, each row coded against the rows before it, then gzip (psgate ledger convert gives the CSV); none: ledger.csv; gzip: ledger.csv.gz", rich_help_panel="Ledger and checks")] = "compact",
    ledger_level: Annotated[int, typer.Option(help="zlib level of a gzip or compact ledger, 1 (fastest, the default) to 9 (smallest); the receipt records it", rich_help_panel="Ledger and checks")] = api.GZIP_LEVEL,
    baseline_param: Annotated[Optional[list[str]], typer.Option(help="baseline policy parameter KEY=VALUE", rich_help_panel="Trace, policies, output")] = None,
    candidate_param: Annotated[Optional[list[str]], typer.Option(help="candidate policy parameter KEY=VALUE", rich_help_panel="Trace, policies, output")] = None,
    cost_param: Annotated[Optional[list[str]], typer.Option(help="cost model parameter KEY=VALUE (ms)", rich_help_panel="Engine and scheduler")] = None,
    cost_model: Annotated[Optional[str], typer.Option(help="calibrated cost-model file (psgate calibrate)", rich_help_panel="Engine and scheduler")] = None,
    junit: Annotated[Optional[Path], typer.Option(help="also write the gate checks as JUnit XML", rich_help_panel="Trace, policies, output")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="print the receipt's gate and metrics as JSON on stdout", rich_help_panel="Trace, policies, output")] = False,
    quiet: Annotated[bool, typer.Option(help="no summary table on stderr (failing checks still are)", rich_help_panel="Trace, policies, output")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="every group and metric in the table, every check", rich_help_panel="Trace, policies, output")] = False,
    max_line_bytes: Annotated[int, typer.Option(help="cap on one trace line", rich_help_panel="Input limits")] = Limits().max_line_bytes,
    max_blocks_per_request: Annotated[int, typer.Option(help="cap on blocks in one request", rich_help_panel="Input limits")] = Limits().max_blocks_per_request,
    max_in_flight: Annotated[int, typer.Option(help="cap on requests admitted or waiting at once", rich_help_panel="Input limits")] = Limits().max_in_flight,
    replicas: Annotated[int, typer.Option(help="serving instances each run is spread over, each with --capacity blocks and its own policy instance (a trace captured from a cluster)", rich_help_panel="Engine and scheduler")] = 1,
    route: Annotated[str, typer.Option(help="--replicas: round-robin (by arrival) or session (a hash of the request's prefix label, else its group)", rich_help_panel="Engine and scheduler")] = "round-robin",
) -> None:
    """Replay one trace under a baseline and a candidate policy; write a receipt; gate."""
    _require_policies(baseline, candidate)
    if junit:       # a bad path is bad input before any work, not a failure after the receipt
        _output(junit, "--junit", force, out_dir=out, inputs=[
            ("the --trace input", trace), ("the --gate file", gate),
            ("the --cost-model file", cost_model), ("the --model-config", model_config),
            _spec_file(baseline), _spec_file(candidate)])
    cfg = api.ReplayConfig(
        trace=trace, baseline=baseline, candidate=candidate, capacity=capacity, engine=engine,
        model_config=model_config, time_compression=time_compression, pacing=pacing,
        scheduler=scheduler,
        step_cost=_step_cost(step_param, cost_model if (engine == "sim" and scheduler == "step")
                             or engine in ("vllm-sched", "vllm") else None),
        sched=SchedulerParams(max_num_batched_tokens=max_num_batched_tokens,
                              max_num_seqs=max_num_seqs, enable_chunked_prefill=not no_chunked_prefill,
                              kv_groups=kv_groups,
                              prefix_cache_retention_interval=parse_retention(
                                  retention_interval)),
        out=out, force=force, gate_file=gate, allow_unexercised=allow_unexercised,
        paranoid=paranoid, ledger_hits=ledger_hits, ledger_rows=ledger_rows,
        ledger_compression=ledger_compression, ledger_level=ledger_level,
        baseline_params=_params(baseline_param, "--baseline-param"),
        candidate_params=_params(candidate_param, "--candidate-param"),
        cost=_cost(cost_param, cost_model),
        tolerances=_tolerances(tolerance_hit, tolerance_tokens, tolerance_ttft, min_requests,
                               min_requests_ttft),
        limits=_limits(max_line_bytes, max_blocks_per_request, max_in_flight),
        replicas=replicas, route=route, contracts_file=contracts)
    check_replicas(replicas, route, engine)
    corpus = trace if trace_directory(trace) is not None else None
    if workload is not None and trace != api.DEFAULT_TRACE:
        raise InputError("give --workload or --trace, not both", path="--workload")
    if workload is None and corpus is None and runs != 1:
        raise InputError(f"--runs {runs} on one trace file would repeat one identical run "
                         f"(a zero-width interval); use --workload KIND or --trace DIR",
                         path="--runs")
    if workload is not None or corpus is not None:
        _replay_experiment(cfg, workload, corpus, runs, seed, resamples, bootstrap_seed, junit,
                           json_out, quiet, verbose)
        return
    result = api.replay(cfg, progress=None if quiet else _progress_factory())
    for note in result.notes:
        err.print(f"psgate: note: {note}", markup=False, highlight=False, soft_wrap=True)
    _warn_saturated(result.receipt)
    if junit:
        write_junit(junit, "replay", result.receipt["gate"]["checks"])
    if quiet:
        render.render_failures(err, result.receipt["gate"])
    else:
        render.render_replay(err, result.receipt, out, verbose)
    summary = {"gate": result.receipt["gate"]["result"], "receipt": str(out / "receipt.json"),
               "trace_canonical_sha256": result.receipt["trace"]["canonical_sha256"]}
    if json_out:
        r = result.receipt
        summary.update(checks=r["gate"]["checks"], comparison=r["comparison"],
                       metrics={k: v["metrics"] for k, v in r["runs"].items()})
    _emit(summary)
    raise typer.Exit(result.exit_code)


def _warn_saturated(receipt: dict) -> None:
    """One line per run whose modeled instances saturated: its hit fractions then measure
    the backlog pinning the cache, not the policy (psgate.stats.saturation)."""
    replicas = receipt["config"].get("replicas", 1)
    for label, run in receipt["runs"].items():
        sat = run.get("saturation") or {}
        if sat.get("verdict") != "saturated":
            continue
        where = ("the modeled instance is" if replicas == 1
                 else f"the {replicas} modeled instances are")
        err.print(f"psgate: warning: {label} run ({run['policy']['name']}): {where} "
                  f"saturated ({'; '.join(sat['reasons'])}), so its hit fractions "
                  f"measure the backlog, not the policy; replay a cluster's trace with "
                  f"--replicas {sat['suggested_replicas']}", markup=False, highlight=False,
                  soft_wrap=True)


def _warn_saturated_runs(receipt: dict) -> None:
    """One line for an experiment some of whose runs saturated (each run's receipt says
    which and why): the paired interval then mixes backlog with policy."""
    saturated = [run["id"] for run in receipt["runs"] if run.get("saturated")]
    if saturated:
        shown = ", ".join(saturated[:5]) + (", ..." if len(saturated) > 5 else "")
        err.print(f"psgate: warning: {len(saturated)} of {len(receipt['runs'])} runs saturated "
                  f"their modeled instance ({shown}; runs/<id>/receipt.json says why), so "
                  f"their hit fractions measure the backlog, not the policy",
                  markup=False, highlight=False, soft_wrap=True)


def _replay_experiment(cfg, workload, corpus, runs, seed, resamples, bootstrap_seed, junit,
                       json_out, quiet, verbose=False) -> None:
    from psgate.experiment import ExperimentConfig, run_experiment

    exp = ExperimentConfig(replay=cfg, workload=workload, corpus=corpus, runs=runs, seed=seed,
                           resamples=resamples, bootstrap_seed=bootstrap_seed)

    def progress(done: int, total: int, run_id: str) -> None:
        if not quiet and err.is_terminal and done < total:
            err.print(f"[{done + 1}/{total}] {run_id}", highlight=False, markup=False)
    result = run_experiment(exp, progress=progress)
    r = result.receipt
    _warn_saturated_runs(r)
    if junit:
        write_junit(junit, "replay", r["gate"]["checks"])
    if quiet:
        render.render_failures(err, r["gate"])
    else:
        render.render_experiment(err, r, cfg.out, verbose)
    summary = {"gate": r["gate"]["result"], "receipt": str(cfg.out / "receipt.json"),
               "runs": len(r["runs"])}
    if json_out:
        summary.update(checks=r["gate"]["checks"], summary=r["summary"])
    _emit(summary)
    raise typer.Exit(result.exit_code)


@app.command()
def verify(
    receipt_dir: Annotated[Path, typer.Argument(help="a directory written by psgate replay")],
    trace: Annotated[Optional[str], typer.Option(help="the trace, if not where the receipt says")] = None,
    gate: Annotated[Optional[str], typer.Option(help="the gate file, if not where the receipt says")] = None,
    contracts: Annotated[Optional[str], typer.Option(help="the contracts file, if not where the receipt says")] = None,
) -> None:
    """Re-run a receipt's replay and confirm identical bytes.

    Exit 1 names the first difference; exit 5: the receipt's policy code is not the code
    here."""
    res = verify_receipt(receipt_dir, trace=trace, gate=gate, contracts=contracts)
    for change in res.policy_changes:
        err.print(f"{receipt_dir}: NOT verified: {change}", markup=False, soft_wrap=True)
    if res.identical and res.policy_changes:
        err.print(f"{receipt_dir}: with the code here, {', '.join(res.compared)} are "
                  f"identical on replay", markup=False, soft_wrap=True)
    elif res.identical:
        err.print(f"{receipt_dir}: verified: {', '.join(res.compared)} identical on replay",
                  markup=False)
    else:
        err.print(f"{receipt_dir}: NOT verified: {res.first_difference}", markup=False,
                  soft_wrap=True)
    _emit({"verified": res.verified, "first_difference": res.first_difference,
           "compared": res.compared, "policy_changes": res.policy_changes})
    if res.policy_changes:
        raise typer.Exit(EXIT_POLICY_CHANGED)
    raise typer.Exit(0 if res.identical else 1)


@app.command()
def explain(
    receipt_dir: Annotated[Path, typer.Argument(help="a directory written by psgate replay")],
    decision: Annotated[Optional[int], typer.Option(help="ledger row (seq) of the run")] = None,
    request: Annotated[Optional[str], typer.Option(help="why this request missed: each missed block's last eviction, per evicting group, both runs")] = None,
    block: Annotated[Optional[str], typer.Option(help="a trace hash (or its first digits): who cached, hit and evicted that content, both runs")] = None,
    slot: Annotated[Optional[int], typer.Option(help="every eviction from this pool slot (block id)")] = None,
    run: Annotated[str, typer.Option(help="baseline or candidate (shown first with --request/--block)")] = "candidate",
    candidates: Annotated[bool, typer.Option(help="replay to the decision and list every candidate")] = False,
    trace: Annotated[Optional[str], typer.Option(help="the trace, if not where the receipt says")] = None,
    json: Annotated[bool, typer.Option("--json", help="one JSON object on stdout, the text on stderr")] = False,
) -> None:
    """A ledger decision in words; or why a request missed, or one content's history."""
    if sum(x is not None for x in (decision, request, block, slot)) > 1:
        raise InputError("name one of --decision, --request, --block, --slot", path="explain")
    if run not in ("baseline", "candidate"):
        raise InputError(f"expected baseline or candidate, found '{run}'", path="--run")
    if request is not None:
        res = explain_request(receipt_dir, request, trace=trace)
        lines = render_request(res, first=run)
    elif block is not None:
        res = explain_block(receipt_dir, block, trace=trace)
        lines = render_block(res, first=run)
    else:
        lines = explain_rows(receipt_dir, run=run, decision=decision, slot=slot,
                             candidates=candidates, trace=trace)
        res = {"lines": lines}
    for line in lines:
        typer.echo(line, err=json)
    if json:
        _emit(res)


@app.command()
def diff(
    a: Annotated[Path, typer.Argument(help="receipt directory A (e.g. the last release)")],
    b: Annotated[Path, typer.Argument(help="receipt directory B (e.g. this change)")],
    force: Annotated[bool, typer.Option(help="compare receipts of different traces")] = False,
    gate: Annotated[Optional[str], typer.Option(help="gate file; 'baseline' in it means A")] = None,
    junit: Annotated[Optional[Path], typer.Option(help="regressions as JUnit XML")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="every compared metric (A, B, B - A) in the JSON on stdout")] = False,
) -> None:
    """Two receipts side by side; exit 1 when B regresses beyond the gate's thresholds."""
    if junit:
        _output(junit, "--junit", None, inputs=[("the --gate file", gate)], receipts=[a, b])
    spec = load_gate_file(gate) if gate else None
    res = diff_receipts(str(a), str(b), force=force, spec=spec)
    render.render_diff(err, res, a, b)
    if junit:
        write_junit(junit, "diff", [{"name": r, "verdict": "fail"} for r in res.regressions]
                    or [{"name": "no regression", "verdict": "pass"}])
    _emit({"regressed": res.regressed, "regressions": res.regressions,
           "config_changes": res.config_changes, "gate_changes": res.gate_changes,
           **({"rows": res.rows} if json_out else {})})
    raise typer.Exit(1 if res.regressed else 0)


@app.command()
def report(
    receipt_dir: Annotated[Path, typer.Argument(help="a directory written by psgate replay")],
    output: Annotated[Path, typer.Option("-o", "--out", "--output", help="the HTML file to write")] = Path("report.html"),
    force: Annotated[bool, typer.Option(help="replace an existing output file")] = False,
    trace: Annotated[Optional[str], typer.Option(help="the trace, if not where the receipt says")] = None,
) -> None:
    """One self-contained HTML report (plots inline, no network) for a receipt."""
    _output(output, "--output", force, inputs=[("the --trace file", trace)],
            receipts=[receipt_dir])
    write_atomic(output, build_report(receipt_dir, trace).encode())
    err.print(f"report written to {output}", markup=False)
    _emit({"report": str(output)})


@app.command("summary")
def summary_cmd(
    receipt_dir: Annotated[Path, typer.Argument(help="a directory written by psgate replay (one run or matched runs)")],
    format: Annotated[str, typer.Option("--format", help="markdown (for $GITHUB_STEP_SUMMARY) or json")] = "markdown",
) -> None:
    """The gate, headline metrics (baseline, candidate, difference) and failing checks."""
    from psgate.report.summary import markdown, summarize

    if format not in ("markdown", "json"):
        raise InputError(f"expected markdown or json, found '{format}'", path="--format")
    doc = summarize(receipt_dir)
    if format == "json":
        _emit(doc)
    else:
        sys.stdout.write(markdown(doc))      # the Markdown is this command's product
        sys.stdout.flush()


@app.command()
def validate(
    trace: Annotated[str, typer.Argument(help="psgate-trace v1 file, or bundled:NAME")],
    max_line_bytes: Annotated[int, typer.Option(help="cap on one trace line (as replay's)")] = Limits().max_line_bytes,
    max_blocks_per_request: Annotated[int, typer.Option(help="cap on blocks in one request (as replay's)")] = Limits().max_blocks_per_request,
) -> None:
    """Check a trace line by line without replaying it."""
    summary = api.validate(trace, _limits(max_line_bytes, max_blocks_per_request,
                                          Limits().max_in_flight))
    for one in summary.get("traces", [summary]):
        err.print(f"{one['path']}: valid psgate-trace v1 ({one['requests']} requests, "
                  f"{one['distinct_blocks']} distinct blocks)", markup=False)
    _emit(summary)


@app.command()
def policies(
    specs: Annotated[Optional[list[str]], typer.Argument(help="also describe these policy specs (module:Class, path/to/file.py:Class)", show_default=False)] = None,
    json: Annotated[bool, typer.Option("--json", help="machine-readable list")] = False,
) -> None:
    """List every policy a name reaches (built-in, installed entry points) and any SPEC given."""
    rows = installed_policies() + [describe_policy(s, "SPEC") for s in specs or []]
    if json:
        _emit({"policies": rows, "api_version": API_VERSION})
        return
    t = Table(title=f"policies (policy API version {API_VERSION})")
    t.add_column("name")
    t.add_column("from")
    t.add_column("rule")
    t.add_column("parameters (defaults)")
    t.add_column("honours")
    for r in rows:
        origin = r["kind"] if r["kind"] == "builtin" else r["class"] + (
            f" ({r['distribution']} {r['version']})" if r.get("distribution") else "")
        rule = r.get("summary") or ""
        if r.get("shadowed_by"):
            rule = f"shadowed by the built-in '{r['name']}': name it as {r['class']}"
        elif r.get("error"):
            rule = f"does not load: {r['error']}"
        params = ", ".join(f"{k}={v}" for k, v in r.get("params", {}).items()) or "-"
        hints = "" if "hints" not in r else "hints: " + (", ".join(r["hints"]) or "none")
        t.add_row(*(Text(render.printable(x)) for x in (r["name"], origin, rule, params,
                                                          hints)))
    err.print(t)                       # stdout carries JSON only


@app.command("check-policy")
def check_policy_cmd(
    spec: Annotated[str, typer.Argument(help="the policy: a built-in name, an installed entry point, module:Class or path/to/file.py:Class")],
    param: Annotated[Optional[list[str]], typer.Option(help="policy parameter KEY=VALUE (JSON values)")] = None,
    seed: Annotated[int, typer.Option(help="seed of the generated traces and of hypothesis")] = 0,
    examples: Annotated[int, typer.Option(help="generated traces (each replayed under both schedulers) and hypothesis examples")] = DEFAULT_EXAMPLES,
    time_limit: Annotated[float, typer.Option(help="seconds each contract may run: a policy stuck in a hook fails it")] = DEFAULT_TIME_LIMIT_S,
    junit: Annotated[Optional[Path], typer.Option(help="also write one JUnit test case per contract")] = None,
    force: Annotated[bool, typer.Option(help="replace an existing --junit file")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="every contract's result as one JSON object on stdout")] = False,
) -> None:
    """Check a policy against the contract every built-in policy keeps.

    Exit 0 when every contract passed (skips allowed), 1 when any failed, 2 when the spec
    does not load."""
    if junit:       # a bad path is bad input before any work
        _output(junit, "--junit", force, inputs=[_spec_file(spec)])
    marks = {"pass": "PASS", "fail": "FAIL", "skip": "SKIP"}

    def show(r) -> None:
        sep = ":" if r.verdict == "fail" else " "
        err.print(f"{marks[r.verdict]} {r.name}{sep} {_one_line(r.detail)}", markup=False,
                  highlight=False, emoji=False, soft_wrap=True)

    started = time.monotonic()
    with contextlib.redirect_stdout(sys.stderr):     # a policy's prints: stdout is JSON only
        report = check_policy(spec, _params(param, "--param"), seed=seed, examples=examples,
                              time_limit_s=time_limit, on_result=show)
    n = report.counts()
    err.print(f"check-policy {_one_line(spec)} ({report.policy['name']}): {n['pass']} passed, "
              f"{n['fail']} failed, {n['skip']} skipped in {time.monotonic() - started:.1f} s",
              markup=False, highlight=False, emoji=False, soft_wrap=True)
    if junit:
        write_junit(junit, "check-policy", [
            {"name": r.name, "verdict": r.verdict, "observed": r.verdict, "op": "in",
             "threshold": "pass, skip", "note": r.detail}
            for r in report.results])
    if json_out:
        _emit(report.to_json())
    raise typer.Exit(0 if report.passed else 1)


ledger_app = typer.Typer(no_args_is_help=True, help="Work with a replay's ledger.")
app.add_typer(ledger_app, name="ledger")


@ledger_app.command("convert")
def ledger_convert(
    source: Annotated[Path, typer.Argument(help="a ledger.compact.csv.gz, or the directory psgate replay wrote it to")],
    out: Annotated[Optional[Path], typer.Option("-o", "--out", help="the CSV to write (default: ledger.csv beside it; .gz: gzip)")] = None,
    force: Annotated[bool, typer.Option("--force", help="replace an existing output file")] = False,
) -> None:
    """The CSV ledger a compact ledger codes, byte for byte as --ledger-compression none writes it."""
    src = source / "ledger.compact.csv.gz" if source.is_dir() else source
    dst = out if out is not None else src.with_name("ledger.csv")
    _output(dst, "--out", force, inputs=[("the compact ledger being converted", src)],
            receipts=[src.parent])
    n = api.convert_ledger(src, dst)
    err.print(f"{dst}: {n} ledger lines from {src}", markup=False)


trace_app = typer.Typer(no_args_is_help=True, help="Generate, import and redact traces.")
app.add_typer(trace_app, name="trace")


@trace_app.command("gen")
def trace_gen(
    kind: Annotated[str, typer.Argument(help="workload kind (see: psgate trace kinds)")],
    output: Annotated[Path, typer.Option("-o", "--out", "--output", help="trace file to write")],
    force: Annotated[bool, typer.Option(help="replace an existing output file")] = False,
    seed: Annotated[Optional[int], typer.Option(help="random seed (default: the kind's)")] = None,
    param: Annotated[Optional[list[str]], typer.Option(help="generator parameter KEY=VALUE")] = None,
    cost_model: Annotated[Optional[str], typer.Option(help="derive arrival rates (C_prefill) from this calibrated cost-model file")] = None,
) -> None:
    """Write a seeded, deterministic psgate-trace v1 of a registered workload."""
    require_utf8_name(str(output), "--output")
    _output(output, "--output", force, inputs=[("the --cost-model file", cost_model)])
    params = _params(param, "--param")
    if seed is not None:
        params["seed"] = seed
    cost = None
    if cost_model is not None:       # rates=step: the file's step fit sets the rates
        from psgate.workloads.common import StepRates
        cost = (StepRates(load_step_cost_model(cost_model)) if params.get("rates") == "step"
                else load_cost_model(cost_model))
    lines = generate_workload(kind, params, cost=cost)
    write_trace(output, lines)
    n = sum(1 for x in lines[1:] if x.get("op") == "request")
    err.print(f"{output}: {kind}, {n} requests", markup=False)
    _emit({"trace": str(output), "kind": kind, "requests": n})


@trace_app.command("import")
def trace_import(
    src: Annotated[str, typer.Argument(help="the source trace (file or directory)")],
    output: Annotated[Path, typer.Option("-o", "--out", "--output", help="trace file to write")],
    format: Annotated[str, typer.Option("--format", help="mooncake, weka or bailian")],
    group_by: Annotated[Optional[str], typer.Option(help="tenant rule (see the format's options)")] = None,
    block_size: Annotated[Optional[int], typer.Option(help="re-block to this many tokens")] = None,
    option: Annotated[Optional[list[str]], typer.Option(help="other importer option KEY=VALUE")] = None,
    force: Annotated[bool, typer.Option(help="replace an existing output file")] = False,
) -> None:
    """Import a public trace (Mooncake, WEKA sessions, Bailian) as psgate-trace v1."""
    require_utf8_name(str(output), "--output")
    require_utf8_name(src)
    _output(output, "--output", force, inputs=[("the source trace", src)])
    opts = _params(option, "--option")
    if group_by is not None:
        opts["group_by"] = group_by
    if block_size is not None:
        opts["block_size"] = block_size
    lines = import_trace(format, src, **opts)
    write_trace(output, lines)
    n = len(lines) - 1
    err.print(f"{output}: {n} requests imported from {src} ({format})", markup=False)
    _emit({"trace": str(output), "format": format, "requests": n,
           "import": lines[0].get("import")})


@trace_app.command("redact")
def trace_redact(
    raw: Annotated[str, typer.Argument(help="raw request log (JSON Lines with prompt_token_ids)")],
    output: Annotated[Path, typer.Option("-o", "--out", "--output", help="redacted trace to write")],
    force: Annotated[bool, typer.Option(help="replace an existing output file")] = False,
    key_file: Annotated[Optional[str], typer.Option(help="file holding the hash key as hex (16 to 64 bytes; $PSGATE_HASH_KEY takes the same)")] = None,
    unkeyed: Annotated[bool, typer.Option(help="hash without a key (weaker: prompts and tenant names can be guessed)")] = False,
    block_size: Annotated[int, typer.Option(help="tokens per block")] = 16,
) -> None:
    """Turn a raw request log into a psgate-trace v1: keyed chained hashes, nothing raw."""
    require_utf8_name(str(output), "--output")
    _output(output, "--output", force, inputs=[("the raw request log", raw),
                                               ("the --key-file", key_file)])
    if not 1 <= block_size <= MAX_BLOCK_SIZE:
        raise InputError(f"expected an integer in 1..{MAX_BLOCK_SIZE}, found {block_size}",
                         path="--block-size")
    key = load_key(key_file, unkeyed)
    write_trace(output, redact_lines(raw, block_size, key))
    err.print(f"{output}: redacted (key fingerprint {key_fingerprint(key)})", markup=False)
    if key is None:
        err.print(f"psgate: warning: {UNKEYED_WARNING}", markup=False, highlight=False)
    _emit({"trace": str(output), "key_fingerprint": key_fingerprint(key)})


@trace_app.command("stats")
def trace_stats_cmd(
    trace: Annotated[str, typer.Argument(help="psgate-trace v1 file, or bundled:NAME")],
    json: Annotated[bool, typer.Option("--json", help="the statistics as JSON on stdout")] = False,
) -> None:
    """Requests, blocks, reuse distances, infinite-cache hit ratio, creation pressure."""
    st = trace_stats(trace)
    for path, one in st.get("traces", {trace: st}).items():
        render.render_trace_stats(err, path, one)
    if json:
        _emit(st)


contracts_app = typer.Typer(no_args_is_help=True, help="Size PrefixShield's contracts from data.")
app.add_typer(contracts_app, name="contracts")


@contracts_app.command("suggest")
def contracts_suggest(
    trace: Annotated[str, typer.Option("--trace", help="psgate-trace v1 file, bundled:NAME, or a capture directory")],
    capacity: Annotated[int, typer.Option(help="configured KV blocks of one instance, as the replay will run")],
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="the contracts file (TOML) to write")] = None,
    history: Annotated[float, typer.Option(help="the first fraction of the trace's arrival span to learn from")] = SuggestConfig.history,
    until: Annotated[Optional[float], typer.Option(help="instead of --history: learn from requests arriving before this trace second")] = None,
    window: Annotated[float, typer.Option(help="seconds of the trailing window the creation rate is read over; the cache once per window is what all refills share")] = SuggestConfig.window_s,
    quantile: Annotated[float, typer.Option(help="quantile of the window rates a refill covers")] = SuggestConfig.quantile,
    headroom: Annotated[float, typer.Option(help="factor on each group's rate and burst need")] = SuggestConfig.headroom,
    max_burst_share: Annotated[float, typer.Option(help="largest burst, as a share of the cache")] = SuggestConfig.max_burst_share,
    min_refill: Annotated[float, typer.Option(help="least refill, blocks/s")] = SuggestConfig.min_refill,
    min_burst: Annotated[float, typer.Option(help="least burst, blocks")] = SuggestConfig.min_burst,
    default: Annotated[str, typer.Option(help="the class of every group the history does not show")] = SuggestConfig.default,
    scheduler: Annotated[str, typer.Option(help="step or service, as the replay will run")] = api.DEFAULT_SCHEDULER,
    replicas: Annotated[int, typer.Option(help="instances the trace is spread over (contracts are per instance)")] = 1,
    route: Annotated[str, typer.Option(help="--replicas: round-robin or session")] = "round-robin",
    force: Annotated[bool, typer.Option(help="replace an existing --output file")] = False,
    json: Annotated[bool, typer.Option("--json", help="the table as JSON on stdout")] = False,
) -> None:
    """Contracts sized from each group's own history: a contracts file and its table.

    Exit 0 when written, 2 on bad input. Replay with: psgate replay --contracts FILE."""
    if output is not None:
        _output(output, "--output", force, inputs=[("the --trace input", trace)])
    if scheduler not in api.SCHEDULERS:
        raise InputError(f"unknown scheduler '{scheduler}'; expected one of "
                         f"{', '.join(api.SCHEDULERS)}", path="--scheduler")
    found = suggest(SuggestConfig(
        trace=trace, capacity=capacity, history=history, until_s=until, window_s=window,
        quantile=quantile, headroom=headroom, max_burst_share=max_burst_share,
        min_refill=min_refill, min_burst=min_burst, default=default, scheduler=scheduler,
        replicas=replicas, route=route))
    doc = found.to_json()
    render.render_contracts_suggestion(err, trace, doc)
    if output is not None:
        write_atomic(output, found.text(trace).encode())
        err.print(f"{output}: contracts for {len(doc['groups'])} groups (replay with "
                  f"--contracts {output})", markup=False, highlight=False, soft_wrap=True)
    if json:
        _emit(doc)


@app.command()
def curve(
    trace: Annotated[str, typer.Option("--trace", help="psgate-trace v1 file, or bundled:NAME")],
    capacities: Annotated[str, typer.Option("--capacities", help="LO:HI (doubling), LO:HI:N (N geometric points) or A,B,C: configured blocks, increasing, each >= 2")],
    policy: Annotated[str, typer.Option("--policy", help="comma list of policies; lru is one exact pass")] = "lru",
    target: Annotated[float, typer.Option("--target", help="hit fraction whose smallest capacity is reported per group")] = 0.5,
    workers: Annotated[int, typer.Option("--workers", help="processes (or local Ray CPUs) for the per-capacity replays")] = 1,
    executor: Annotated[str, typer.Option(help="where the per-capacity replays run: local (process pool) or ray")] = "local",
    address: Annotated[Optional[str], typer.Option(help="Ray cluster address (default: start a local Ray)")] = None,
    json: Annotated[bool, typer.Option("--json", help="the curve as JSON on stdout")] = False,
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="write the curve as CSV")] = None,
    html: Annotated[Optional[Path], typer.Option("--html", help="write the curve as a self-contained HTML page with its plots (needs psgate[report])")] = None,
    force: Annotated[bool, typer.Option(help="replace an existing --output or --html file")] = False,
) -> None:
    """Hit fraction against capacity, and the smallest capacity reaching --target.

    Hit fraction for all requests, per group and per role. Replay model: --engine sim --scheduler service with every
    cost coefficient 0 (a request holds its blocks from arrival to its done_t, done or
    cancel). lru is one exact pass (equal to psgate replay at each capacity); a capacity
    below the peak pinned demand, and other policies, are replayed per capacity."""
    from psgate.curve import capacity_curve, check_target, csv_rows, parse_capacities, parse_policies
    from psgate.executors import check_executor
    from psgate.report.html import build_curve_report, require_plotting
    caps = parse_capacities(capacities)
    names = parse_policies(policy)
    check_target(target)
    check_executor(executor, workers)
    if output is not None:
        _output(output, "--output", force, inputs=[("the --trace file", trace)])
    if html is not None:
        _output(html, "--html", force, inputs=[("the --trace file", trace),
                                               ("the --output file", output)])
        require_plotting()
    doc = capacity_curve(trace, names, caps, target, workers, executor, address)
    t = Table(title=f"capacity curve: {trace} (target hit fraction {target:g})")
    for col in ("policy", "capacity", "method", "hit fraction", "token hit ratio"):
        t.add_column(col)
    for name, entry in doc["policies"].items():
        for p in entry["points"]:
            tot = p["totals"]
            t.add_row(name, str(p["capacity"]), p["method"], str(tot["hit_fraction"]),
                      str(tot["token_hit_ratio"]))
    err.print(t)
    for name, entry in doc["policies"].items():
        tc = entry["target_capacity"]
        groups = ", ".join(f"{g}: {c}" for g, c in tc["groups"].items())
        err.print(f"{name}: smallest capacity reaching {target:g}: all {tc['totals']}; "
                  f"{groups}", markup=False)
        if entry.get("min_one_pass_capacity") is not None and any(
                p["method"] == "replay" for p in entry["points"]):
            err.print(f"{name}: capacities below {entry['min_one_pass_capacity']} (the peak "
                      f"pinned demand) or holding duplicate copies were computed by replay",
                      markup=False)
    if output is not None:
        import csv
        import io
        buf = io.StringIO()
        csv.writer(buf, lineterminator="\n").writerows(csv_rows(doc))
        write_atomic(output, buf.getvalue().encode())
    if html is not None:
        write_atomic(html, build_curve_report(doc).encode())
        err.print(f"curve page written to {html}", markup=False)
    if json:
        _emit(doc)


@trace_app.command("kinds")
def trace_kinds(json: Annotated[bool, typer.Option("--json", help="machine-readable list")] = False) -> None:
    """List the workload generators and their default parameters."""
    gens = workload_generators()
    if json:
        _emit({"kinds": [{"kind": g.kind, "summary": g.summary, "defaults": g.defaults}
                         for g in gens.values()]})
        return
    t = Table(title="workload generators")
    t.add_column("kind")
    t.add_column("what")
    t.add_column("defaults")
    for g in gens.values():
        t.add_row(g.kind, g.summary, ", ".join(f"{k}={v}" for k, v in g.defaults.items()))
    err.print(t)                       # stdout carries JSON only


@app.command()
def sweep(
    workload: Annotated[str, typer.Option(help="KIND[:key=value,...]: the workload every cell generates")],
    out: Annotated[Path, typer.Option("--out", "-o", help="output directory (cells/, table.csv, table.json); rerun to resume")],
    axis: Annotated[Optional[list[str]], typer.Option(help="KEY=V1,V2,...: capacity, candidate or a workload parameter (repeat for more axes)")] = None,
    baseline: Annotated[Optional[str], typer.Option(help="policy every cell compares against (required)", show_default=False)] = None,
    candidate: Annotated[Optional[str], typer.Option(help="candidate (required unless 'candidate' is an axis)", show_default=False)] = None,
    capacity: Annotated[int, typer.Option(help="configured blocks when 'capacity' is not an axis")] = api.DEFAULT_CAPACITY,
    runs: Annotated[int, typer.Option(help="matched runs (seeds) per cell")] = 3,
    seed: Annotated[int, typer.Option(help="base seed of every cell's runs")] = 0,
    resamples: Annotated[int, typer.Option(help="bootstrap resamples per cell")] = DEFAULT_RESAMPLES,
    tolerance_hit: Annotated[float, typer.Option(help="non-regression: hit fraction the candidate may lose (absolute), overall and per group")] = Tolerances().hit,
    tolerance_tokens: Annotated[float, typer.Option(help="non-regression: fraction of the baseline's saved prefill tokens the candidate may lose")] = Tolerances().tokens,
    tolerance_ttft: Annotated[float, typer.Option(help="non-regression: fraction of the baseline's p95 TTFT the candidate may add")] = Tolerances().ttft,
    min_requests: Annotated[int, typer.Option(help="non-regression: scopes with fewer measured requests are not judged on hit fraction and saved tokens")] = Tolerances().min_requests,
    min_requests_ttft: Annotated[int, typer.Option(help="non-regression: scopes with fewer measured requests are not judged on p95 TTFT")] = Tolerances().min_requests_ttft,
    workers: Annotated[int, typer.Option(help="worker processes (local) or CPUs (ray)")] = 1,
    executor: Annotated[str, typer.Option(help="local (process pool) or ray")] = "local",
    address: Annotated[Optional[str], typer.Option(help="Ray cluster address (default: start a local Ray)")] = None,
    cost_param: Annotated[Optional[list[str]], typer.Option(help="cost model parameter KEY=VALUE (ms)")] = None,
    cost_model: Annotated[Optional[str], typer.Option(help="calibrated cost-model file")] = None,
    scheduler: Annotated[str, typer.Option(help="step or service (see psgate replay --help)")] = api.DEFAULT_SCHEDULER,
    step_param: Annotated[Optional[list[str]], typer.Option(help="step cost model parameter KEY=VALUE (ms)")] = None,
    contracts: Annotated[Optional[str], typer.Option(help="contracts file (TOML): each group's contract in every cell, whatever the traces' labels")] = None,
    junit: Annotated[Optional[Path], typer.Option(help="also write each cell's gate as a JUnit test case")] = None,
    quiet: Annotated[bool, typer.Option(help="no progress or summary on stderr")] = False,
) -> None:
    """Run one matched-run experiment per cell of a grid; write one table.

    Exit 1 when a cell's gate failed (an invariant broke, a run exercised nothing, or the
    candidate was worse than the baseline beyond the non-regression tolerances)."""
    from psgate.sweep import SweepConfig, parse_axis, sweep as run_sweep

    if junit:
        _output(junit, "--junit", None, inputs=[
            ("the --cost-model file", cost_model), _spec_file(baseline), _spec_file(candidate),
            *(("the sweep's output", out / n) for n in ("table.csv", "table.json", "sweep.json"))])
    axes: dict[str, list] = {}
    for a in axis or []:
        key, values = parse_axis(a)
        if key in axes:
            raise InputError(f"axis '{key}' given twice", path="--axis")
        axes[key] = values
    _require_policies(baseline, candidate, candidate_axis="candidate" in axes)
    for cap in axes.get("capacity", [capacity]):    # every cell's, before the first runs
        if type(cap) is int:
            api.check_capacity(cap, {})
    cfg = SweepConfig(workload=workload, out=out, axes=axes, baseline=baseline,
                      candidate=candidate or "", capacity=capacity, runs=runs, seed=seed,
                      resamples=resamples, workers=workers, executor=executor, address=address,
                      cost=_cost(cost_param, cost_model), scheduler=scheduler,
                      step_cost=_step_cost(step_param,
                                           cost_model if scheduler == "step" else None),
                      tolerances=_tolerances(tolerance_hit, tolerance_tokens, tolerance_ttft,
                                             min_requests, min_requests_ttft),
                      contracts_file=contracts)
    bar = None
    if not quiet and err.is_terminal:
        bar = Progress(TextColumn("cells"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                       TimeRemainingColumn(), console=err, transient=True)
        bar.start()
        task = bar.add_task("cells", total=None)

    def progress(done: int, total: int, row: dict) -> None:
        if bar is not None:
            bar.update(task, completed=done, total=total)
    try:
        rows = run_sweep(cfg, progress=progress)
    finally:
        if bar is not None:
            bar.stop()
    if not quiet:
        err.print(f"{len(rows)} cells ({sum(r['resumed'] for r in rows)} already complete); "
                  f"table in {out}/table.csv and {out}/table.json", markup=False)
    failed = sum(r["gate"] != "pass" for r in rows)
    if junit:
        write_junit(junit, "sweep", [
            {"name": f"{r['cell']} " + " ".join(f"{k}={r[k]}" for k in axes),
             "verdict": "pass" if r["gate"] == "pass" else "fail", "observed": r["gate"],
             "op": "==", "threshold": "pass",
             **({"note": f"see {out}/cells/{r['cell']}/receipt.json"}
                if r["gate"] != "pass" else {})} for r in rows])
    _emit({"cells": len(rows), "resumed": sum(r["resumed"] for r in rows),
           "table": str(out / "table.csv"), "failed_gates": failed})
    raise typer.Exit(1 if failed else 0)


def _int_list(text: str | None, option: str) -> list[int] | None:
    if text is None:
        return None
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise InputError(f"expected comma-separated integers, found '{text}'",
                         path=option) from None


@app.command()
def calibrate(
    output: Annotated[Path, typer.Option("-o", "--out", "--output", help="cost-model file to write")],
    model_config: Annotated[Optional[str], typer.Option(help="Hugging Face style config.json (or its directory); weights are random, nothing is downloaded")] = None,
    convert: Annotated[Optional[str], typer.Option(help="instead of measuring, rewrite this version-1 file as version 2 (the step model refitted to the timings it keeps)")] = None,
    from_receipt: Annotated[Optional[str], typer.Option(help="instead of measuring, fit the step model to the real engine's own steps in this receipt (directory or receipt.json) of --engine vllm --pacing lockstep")] = None,
    device: Annotated[str, typer.Option(help="cpu or cuda")] = "cpu",
    dtype: Annotated[Optional[str], typer.Option(help="float32 (cpu default), bfloat16 (cuda default) or float16")] = None,
    form: Annotated[str, typer.Option(help="the per-request fit: linear (docs/design.md section 3) or attention (adds u^2 and u*c terms)")] = "attention",
    cached: Annotated[Optional[str], typer.Option(help="cached tokens under a prefill chunk (C), e.g. 0,512,2048 (default: the device's grid)")] = None,
    uncached: Annotated[Optional[str], typer.Option(help="prefill chunk sizes (P), e.g. 64,256,1024")] = None,
    decodes: Annotated[Optional[str], typer.Option(help="decoding requests per step (D), starting at 1, e.g. 1,8,32")] = None,
    decode_context: Annotated[Optional[str], typer.Option(help="each decode's context length, e.g. 128,1024")] = None,
    warmup: Annotated[Optional[int], typer.Option(help="untimed passes per point")] = None,
    repeats: Annotated[Optional[int], typer.Option(help="timed passes per point (the median is kept)")] = None,
    threads: Annotated[Optional[int], typer.Option(help="CPU threads for torch (default: torch's)")] = None,
    name: Annotated[Optional[str], typer.Option(help="model name in the file (default: the config's directory)")] = None,
    notes: Annotated[Optional[str], typer.Option(help="free text kept in the file (e.g. how loaded the machine was)")] = None,
    force: Annotated[bool, typer.Option(help="replace an existing output file")] = False,
    quiet: Annotated[bool, typer.Option(help="no summary on stderr")] = False,
) -> None:
    """Fit a cost-model file (step and per-request) from timed steps.

    The steps are timed on this machine, or read from a real engine's lockstep receipt."""
    _output(output, "--output", force,        # before minutes of timing, not after
            inputs=[("the --model-config", model_config), ("the --convert file", convert)],
            receipts=[from_receipt])
    from psgate.calibrate.run import CalibrateConfig, calibrate as run_calibration, summary

    if sum(x is not None for x in (model_config, convert, from_receipt)) != 1:
        raise InputError("give exactly one of --model-config (measure), --convert "
                         "(rewrite a version-1 file) and --from-receipt (fit a lockstep "
                         "receipt's steps)", path="--model-config")
    if from_receipt is not None:
        from psgate.calibrate.from_receipt import receipt_document
        from psgate.calibrate.run import write_document
        from psgate.report.receipts import read_receipt_file
        from psgate.report.verify import recorded_outputs_difference
        doc = receipt_document(from_receipt, read_receipt=read_receipt_file,
                               outputs_difference=recorded_outputs_difference, notes=notes)
        write_document(doc, output, force)
    elif convert is not None:
        from psgate.calibrate.run import convert_v1, write_document
        doc = convert_v1(convert, notes=notes)
        write_document(doc, output, force)
    else:
        cfg = CalibrateConfig(model_config=model_config, device=device, dtype=dtype,
                              out=output, form=form, cached=_int_list(cached, "--cached"),
                              uncached=_int_list(uncached, "--uncached"),
                              decodes=_int_list(decodes, "--decodes"),
                              decode=_int_list(decode_context, "--decode-context"),
                              warmup=warmup, repeats=repeats, threads=threads, name=name,
                              notes=notes, force=force)
        doc = run_calibration(cfg, progress=_calibrate_progress(quiet))
    info = summary(doc)
    if not quiet:
        fit, req = doc["fit"], doc["request_fit"]
        err.print(f"{output}: {doc['model']['name']} {doc['dtype']} on {doc['device']['name']}: "
                  f"step = {fit['fixed_ms']:.3g} ms + {fit['per_prefill_token_ms']:.3g} ms/prefill "
                  f"token + {fit['per_context_token_ms']:.3g} ms/context token + "
                  f"{fit['per_decode_ms']:.3g} ms/decode + "
                  f"{fit['per_decode_context_token_ms']:.3g} ms/decode context token; "
                  f"held-out median relative error {fit['holdout_median_rel_error']:.1%} "
                  f"(max {fit['holdout_max_rel_error']:.1%}, {fit['num_holdout_points']} "
                  f"points)", markup=False)
        err.print(f"per-request ({req['form']}): prefill = {req['fixed_ms']:.3g} ms + "
                  f"{req['per_uncached_token_ms']:.3g} ms/uncached + "
                  f"{req['per_cached_token_ms']:.3g} ms/cached"
                  + (f" + {req['per_uncached_token_sq_ms']:.3g} u^2 + "
                     f"{req['per_uncached_cached_token_ms']:.3g} u*c"
                     if req["form"] == "attention" else "")
                  + f"; {req['per_output_token_ms']:.3g} ms per output token; held-out "
                  f"median relative error {req['holdout_median_rel_error']:.1%}; C_prefill at "
                  f"1,536 tokens: {info['c_prefill_1536_per_s']:.3g} requests/s", markup=False)
    _emit({"cost_model": str(output), **info})


def _calibrate_progress(quiet: bool):
    progress = None
    if err.is_terminal and not quiet:
        bar = Progress(TextColumn("timing"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                       console=err, transient=True)
        bar.start()
        task = bar.add_task("timing", total=None)

        def tick(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)
            if done == total:
                bar.stop()
        progress = tick
    return progress


@app.command()
def bench(
    quick: Annotated[bool, typer.Option(help="scaled-down traces (well under a minute)")] = False,
    json: Annotated[bool, typer.Option("--json", help="one JSON object on stdout")] = False,
    repeats: Annotated[Optional[int], typer.Option(help="runs per measurement (default 3)")] = None,
    vllm_python: Annotated[Optional[str], typer.Option(help="measure vLLM with this interpreter (a vLLM virtualenv with psgate installed)")] = None,
    mooncake: Annotated[Optional[Path], typer.Option(help="a Mooncake trace (JSONL): replay its first requests compiled and in Python (target core_vs_python_mooncake)")] = None,
    mooncake_requests: Annotated[int, typer.Option(help="how many of its requests")] = 6000,
    mooncake_block_size: Annotated[int, typer.Option(help="tokens per block, re-blocked from Mooncake's 512")] = 16,
    policy: Annotated[Optional[str], typer.Option(help="also time this policy (a spec: your own) beside lru on the reuse trace (target policy_lru_e2e)")] = None,
) -> None:
    """Measure replay throughput, victim selection and memory per block against the targets."""
    from psgate import bench as bench_lib

    if repeats is not None and repeats < 1:
        raise InputError(f"expected at least 1, found {repeats}", path="--repeats")
    if mooncake is not None and not mooncake.is_file():
        raise InputError("no such file", path=str(mooncake))
    if mooncake_requests < 1:
        raise InputError(f"expected at least 1, found {mooncake_requests}",
                         path="--mooncake-requests")
    result = bench_lib.run(bench_lib.BenchConfig(quick=quick, repeats=repeats,
                                                 vllm_python=vllm_python, mooncake=mooncake,
                                                 mooncake_requests=mooncake_requests,
                                                 mooncake_block_size=mooncake_block_size,
                                                 policy=policy),
                           progress=lambda msg: err.print(msg, markup=False, highlight=False))
    if json:
        _emit(result)
    else:
        sys.stderr.write(bench_lib.render(result))      # stdout carries JSON only


@app.command()
def version() -> None:
    """Print psgate's version."""
    typer.echo(__version__)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(__version__)
        raise typer.Exit()


@app.callback()
def _root(version: Annotated[bool, typer.Option("--version", callback=_print_version, is_eager=True, help="print psgate's version and exit")] = False) -> None:
    """Policy receipt and release gate for KV prefix-cache eviction."""


def _one_line(text: str) -> str:
    """``text`` with unprintable characters (newlines from a trace's ids, ...) escaped."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


class Interrupted(PsgateError):
    """Ctrl-C: raised from the signal handler so the framework cannot swallow it."""

    exit_code = EXIT_INTERRUPTED


class Terminated(Interrupted):
    """SIGTERM (a CI timeout, a scheduler): the same clean-up as Ctrl-C, exit 128 + 15."""

    exit_code = EXIT_TERMINATED


def _on_signal(signum, frame) -> None:
    # Outputs are staged, so stopping leaves the previous ones as they were. A second signal
    # would interrupt the clean-up of the staging directory itself, so it is ignored.
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, signal.SIG_IGN)
    if signum == signal.SIGTERM:
        raise Terminated("terminated; nothing was written")
    raise Interrupted("interrupted; nothing was written")


def _fail(message: str, code: int) -> None:
    err.print(f"psgate: {_one_line(message)}", markup=False, emoji=False, soft_wrap=True)
    sys.exit(code)


DEBUG_ENV = "PSGATE_DEBUG"
# What to lower when memory runs out, by command: the advice must name that command's own
# input, not replay's --capacity.
_MEMORY_ADVICE = {
    "replay": "lower --capacity or replay a smaller trace",
    "sweep": "lower --capacity (or its axis) or the workload's size",
    "verify": "the receipt's trace is too large for this machine",
    "explain": "the receipt's trace or ledger is too large for this machine",
    "report": "the receipt's trace or ledger is too large for this machine",
    "validate": "the trace is too large for this machine; lower --max-blocks-per-request",
    "trace stats": "the trace is too large for this machine",
    "trace gen": "lower the generator's sizes (duration, rates, requests, tokens)",
    "trace import": "import a smaller source trace",
    "trace redact": "redact a smaller raw log",
    "check-policy": "lower --examples",
    "calibrate": "lower the --cached/--uncached/--decodes grid",
}


def _command_name(argv: list[str]) -> str:
    """The (sub)command argv names, for advice: the first one or two words not options."""
    words = [a for a in argv if not a.startswith("-")][:2]
    if words and words[0] in ("trace", "ledger"):
        return " ".join(words)
    return words[0] if words else ""


def _internal_error(exc: BaseException) -> None:
    """An exception psgate did not expect is a psgate bug: exit 4 with one line naming it
    and where the traceback went, never 1, which CI would read as the candidate failing."""
    import tempfile
    import traceback

    tb = "".join(traceback.format_exception(exc))
    frames = traceback.extract_tb(exc.__traceback__)
    at = f" at {Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else ""
    what = f"{type(exc).__name__}: {exc}"[:300]
    if os.environ.get(DEBUG_ENV):
        sys.stderr.write(tb)
        where = "the traceback is above"
    else:
        try:
            fd, name = tempfile.mkstemp(prefix="psgate-traceback-", suffix=".txt")
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(f"psgate {__version__}: {' '.join(sys.argv)}\n{tb}")
            where = f"traceback in {name} (or rerun with {DEBUG_ENV}=1)"
        except OSError:
            where = f"rerun with {DEBUG_ENV}=1 for the traceback"
    _fail(f"internal error (a psgate bug, not a gate verdict): {what}{at}; {where}; "
          f"please report it", EXIT_INTERNAL)


# The click typer parses with: typer >= 0.22 vendors its own copy (typer._click), older
# releases use click itself; its exceptions are the ones to catch either way.
_clickx = importlib.import_module(typer.BadParameter.__module__)
_NoArgsIsHelp = getattr(_clickx, "NoArgsIsHelpError", ())
_Exits = (typer.Exit, getattr(_clickx, "Exit", typer.Exit))
_Aborts = (typer.Abort, getattr(_clickx, "Abort", typer.Abort))


def _usage_line(exc) -> str:
    """click's usage error as one line: the command, what was wrong, where help is."""
    ctx = getattr(exc, "ctx", None)
    cmd = f"{ctx.command_path}: " if ctx is not None else ""
    hint = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
    return f"{cmd}{' '.join(exc.format_message().split())}{hint}"


def _run_app() -> None:
    """The app without click's standalone handling, which prints usage errors as a box
    and exits 1 on a broken pipe or an EOF; main() decides every exit code instead."""
    command = typer.main.get_command(app)
    try:
        with command.make_context("psgate", sys.argv[1:]) as ctx:    # usage says "psgate"
            command.invoke(ctx)
    except _Exits as exc:
        if exc.exit_code:
            sys.exit(exc.exit_code)
    except _NoArgsIsHelp:
        sys.exit(EXIT_BAD_INPUT)       # the help is already printed, as before
    except _clickx.ClickException as exc:
        _fail(f"error: {_usage_line(exc)}", EXIT_BAD_INPUT)
    except _Aborts:
        raise Interrupted("interrupted; nothing was written") from None


def main() -> None:
    signal.signal(signal.SIGINT, _on_signal)
    signal.signal(signal.SIGTERM, _on_signal)
    try:
        _run_app()
    except PsgateError as exc:
        _fail(f"{'' if isinstance(exc, Interrupted) else 'error: '}{exc}", exc.exit_code)
    except BrokenPipeError:
        sys.exit(EXIT_BAD_INPUT)
    except OSError as exc:      # the file system refused: read-only, full, missing, ...
        where = f"{exc.filename}: " if exc.filename is not None else ""
        _fail(f"error: {where}{exc.strerror or exc}", EXIT_BAD_INPUT)
    except MemoryError:
        advice = _MEMORY_ADVICE.get(_command_name(sys.argv[1:]),
                                    "the input is too large for this machine")
        _fail(f"error: out of memory; {advice}", EXIT_BAD_INPUT)
    except Exception as exc:    # noqa: BLE001 - anything else is psgate's own bug
        _internal_error(exc)


if __name__ == "__main__":
    main()
