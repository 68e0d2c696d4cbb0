"""psgate's command line: parse options, call psgate.api, render. No logic here.

Exit codes: 0 gate passed, 1 gate failed, 2 bad input or usage, 3 engine unavailable.
Humans read stderr (rich); machines read stdout (one JSON object) and the files.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Annotated, Optional

import orjson
import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from psgate import __version__, api
from psgate.engines.cost import CostModel
from psgate.errors import EXIT_BAD_INPUT, InputError, PsgateError
from psgate.policies import policy_class, policy_names

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
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


def _cost(items: list[str] | None) -> CostModel:
    params = _params(items, "--cost-param")
    known = {f.name for f in dataclasses.fields(CostModel)}
    for k, v in params.items():
        if k not in known:
            raise InputError(f"unknown cost-model parameter '{k}'; known: "
                             f"{', '.join(sorted(known))}", path="--cost-param")
        if type(v) not in (int, float) or v < 0:
            raise InputError(f"'{k}' must be a number >= 0, found {v!r}", path="--cost-param")
    return CostModel(**{k: float(v) for k, v in params.items()})


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


@app.command()
def replay(
    trace: Annotated[str, typer.Option(help="psgate-trace v1 file, or bundled:NAME")] = api.DEFAULT_TRACE,
    baseline: Annotated[str, typer.Option(help="policy the serving engine runs today")] = "lru",
    candidate: Annotated[str, typer.Option(help="policy proposed to replace it")] = "lru",
    capacity: Annotated[int, typer.Option(help="configured KV blocks (one is the null block)")] = api.DEFAULT_CAPACITY,
    engine: Annotated[str, typer.Option(help="sim (default), vllm-pool or vllm")] = "sim",
    out: Annotated[Path, typer.Option(help="output directory for receipt.json and ledgers")] = Path("psgate-out"),
    force: Annotated[bool, typer.Option(help="overwrite a non-empty output directory")] = False,
    gate: Annotated[Optional[str], typer.Option(help="gate file (TOML) with extra checks")] = None,
    allow_unexercised: Annotated[bool, typer.Option(help="pass the gate even if nothing was evicted")] = False,
    paranoid: Annotated[bool, typer.Option(help="recheck every invariant from scratch after each mutation (slow)")] = False,
    ledger_hits: Annotated[bool, typer.Option(help="add one ledger row per hit block")] = False,
    baseline_param: Annotated[Optional[list[str]], typer.Option(help="baseline policy parameter KEY=VALUE")] = None,
    candidate_param: Annotated[Optional[list[str]], typer.Option(help="candidate policy parameter KEY=VALUE")] = None,
    cost_param: Annotated[Optional[list[str]], typer.Option(help="cost model parameter KEY=VALUE (ms)")] = None,
) -> None:
    """Replay one trace under a baseline and a candidate policy; write a receipt; gate."""
    cfg = api.ReplayConfig(
        trace=trace, baseline=baseline, candidate=candidate, capacity=capacity, engine=engine,
        out=out, force=force, gate_file=gate, allow_unexercised=allow_unexercised,
        paranoid=paranoid, ledger_hits=ledger_hits,
        baseline_params=_params(baseline_param, "--baseline-param"),
        candidate_params=_params(candidate_param, "--candidate-param"), cost=_cost(cost_param))
    result = api.replay(cfg, progress=_progress_factory())
    _render_replay(result.receipt, out)
    _emit({"gate": result.receipt["gate"]["result"], "receipt": str(out / "receipt.json"),
           "trace_canonical_sha256": result.receipt["trace"]["canonical_sha256"]})
    raise typer.Exit(result.exit_code)


def _fmt(x) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.4f}" if abs(x) < 10 else f"{x:.1f}"
    return str(x)


def _render_replay(receipt: dict, out: Path) -> None:
    runs = receipt["runs"]
    t = Table(title=f"psgate replay of {receipt['trace']['path']} "
                    f"({receipt['config']['usable_blocks']} usable blocks, times modeled)")
    t.add_column("scope")
    for label in ("baseline", "candidate"):
        t.add_column(f"{label}: {runs[label]['policy']['name']}\nhit frac / p95 TTFT ms / evicted",
                     justify="right")
    rows = [("all", "totals")]
    rows += [(f"role {r}", ("roles", r)) for r in runs["candidate"]["metrics"]["roles"]]
    rows += [(f"group {g}", ("groups", g)) for g in runs["candidate"]["metrics"]["groups"]]
    for name, sel in rows:
        cells = []
        for label in ("baseline", "candidate"):
            m = runs[label]["metrics"]
            mm = m["totals"] if sel == "totals" else m[sel[0]].get(sel[1], {})
            ev = mm.get("evictions", mm.get("evictions_suffered"))
            cells.append(f"{_fmt(mm.get('hit_fraction'))} / {_fmt(mm.get('ttft_p95_ms'))} / "
                         f"{_fmt(ev)}")
        t.add_row(name, *cells)
    err.print(t)
    gate = receipt["gate"]
    for c in gate["checks"]:
        if c["verdict"] == "fail":
            err.print(f"[red]FAIL[/red] {c['name']}: observed {_fmt(c['observed'])}, "
                      f"required {c['op']} {_fmt(c['threshold'])}"
                      + (f" ({c['note']})" if c.get("note") else ""))
    colour = "green" if gate["result"] == "pass" else "red"
    err.print(f"gate: [{colour}]{gate['result'].upper()}[/{colour}] "
              f"({gate['num_checks'] - gate['num_failed']}/{gate['num_checks']} checks passed); "
              f"receipt in {out}/")


@app.command()
def validate(trace: Annotated[str, typer.Argument(help="psgate-trace v1 file, or bundled:NAME")]) -> None:
    """Check a trace line by line without replaying it."""
    summary = api.validate(trace)
    err.print(f"{trace}: valid psgate-trace v1 ({summary['requests']} requests, "
              f"{summary['distinct_blocks']} distinct blocks)")
    _emit(summary)


@app.command()
def policies(json: Annotated[bool, typer.Option("--json", help="machine-readable list")] = False) -> None:
    """List the registered eviction policies and their parameters."""
    rows = []
    for name in policy_names():
        cls = policy_class(name)
        rows.append({"name": name, "summary": cls.summary, "params": dict(cls.defaults)})
    if json:
        _emit({"policies": rows})
        return
    t = Table(title="registered policies")
    t.add_column("name")
    t.add_column("rule")
    t.add_column("parameters (defaults)")
    for r in rows:
        t.add_row(r["name"], r["summary"],
                  ", ".join(f"{k}={v}" for k, v in r["params"].items()) or "-")
    Console().print(t)


@app.command()
def version() -> None:
    """Print psgate's version."""
    typer.echo(__version__)


def _one_line(text: str) -> str:
    """``text`` with unprintable characters (newlines from a trace's ids, ...) escaped."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def main() -> None:
    try:
        app()
    except PsgateError as exc:
        err.print(f"psgate: error: {_one_line(str(exc))}", markup=False, emoji=False,
                  soft_wrap=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        err.print("psgate: interrupted; nothing was written", markup=False)
        sys.exit(130)
    except BrokenPipeError:
        sys.exit(EXIT_BAD_INPUT)


if __name__ == "__main__":
    main()
