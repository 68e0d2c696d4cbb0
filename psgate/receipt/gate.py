"""The gate: every check, its threshold, the observed value and a verdict.

The default checks are fixed: every hard invariant holds in both runs, both
runs finished, and the trace exercised eviction (a replay with no eviction
proves nothing about an eviction policy, so it fails closed unless allowed).
A gate file adds performance checks. An empty set of checks fails closed.
"""

from __future__ import annotations

import operator
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path


from psgate.errors import InputError
from psgate.resources import first_schema_error

OPS = {">=": operator.ge, "<=": operator.le, ">": operator.gt, "<": operator.lt,
       "==": operator.eq, "!=": operator.ne}
RUNS = ("baseline", "candidate")
_TOML_POS = re.compile(r" \(at line (\d+), column (\d+)\)$")


@dataclass(frozen=True, slots=True)
class GateSpec:
    path: str | None
    checks: tuple[dict, ...]


def load_gate_file(path: str) -> GateSpec:
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise InputError(f"cannot read gate file: {exc.strerror}", path=path) from None
    try:
        doc = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise InputError("not valid UTF-8", path=path) from None
    except tomllib.TOMLDecodeError as exc:
        msg = getattr(exc, "msg", str(exc))
        line, col = getattr(exc, "lineno", None), getattr(exc, "colno", None)
        pos = _TOML_POS.search(msg) if line is None else None
        if pos:  # before Python 3.14 the position is only in the message text
            msg, line, col = msg[:pos.start()], int(pos[1]), pos[2]
        raise InputError(f"invalid TOML: {msg}" + (f" (column {col})" if col else ""),
                         path=path, line=line) from None
    if not doc.get("check"):
        raise InputError("a gate file needs at least one [[check]] table; found none",
                         path=path)
    found = first_schema_error(doc, "gate")
    if found:
        raise InputError(found[1], path=path, field=found[0])
    checks = []
    for i, c in enumerate(doc["check"]):
        c = {"select": "run", "run": "candidate", "delta": 0, **c}
        stat = c.get("stat", "value")
        if stat != "value" and c["ref"] == "baseline":
            raise InputError(f"with stat '{stat}' (a statistic of candidate minus baseline) "
                             f"ref must be a number, found 'baseline'", path=path,
                             field=f"check[{i}].ref")
        delta = f" {c['delta']:+g}" if c["delta"] else ""
        what = c["metric"] if stat == "value" else f"{stat}({c['metric']})"
        c.setdefault("name", f"check[{i}] {what} {c['op']} {c['ref']}{delta} "
                     f"({c['select']})")
        checks.append(c)
    return GateSpec(path=path, checks=tuple(checks))


def _select(run_metrics: dict, select: str) -> dict | None:
    if select == "run":
        return run_metrics["totals"]
    kind, _, name = select.partition(":")
    return run_metrics["groups" if kind == "group" else "roles"].get(name)


def _adder(checks: list[dict]):
    def add(name, run, select, metric, op, threshold, observed, ok, note=None, stat=None):
        checks.append({"name": name, "run": run, "select": select, "metric": metric, "op": op,
                       "threshold": threshold, "observed": observed,
                       "verdict": "pass" if ok else "fail", **({"stat": stat} if stat else {}),
                       **({"note": note} if note else {})})
    return add


def _result(checks: list[dict], spec: GateSpec | None) -> dict:
    ok = bool(checks) and all(c["verdict"] == "pass" for c in checks)
    return {"result": "pass" if ok else "fail",
            "num_checks": len(checks),
            "num_failed": sum(c["verdict"] == "fail" for c in checks),
            "gate_file": spec.path if spec else None,
            "checks": checks}


def _file_checks(add, metrics: dict[str, dict], spec: GateSpec | None,
                 paired: dict | None) -> None:
    """The gate file's checks. Without ``stat``, a check compares one policy's metric (in an
    experiment, its mean over runs) with the baseline's or a constant. With ``stat``, it reads
    the paired summary: the mean difference, or a bound of its bootstrap interval, which
    needs at least two matched runs and otherwise fails closed."""
    for c in (spec.checks if spec else ()):
        stat = c.get("stat", "value")
        if stat != "value":
            kind, _, name = c["select"].partition(":")
            scope = (None if paired is None else paired["totals"] if kind == "run"
                     else paired["groups" if kind == "group" else "roles"].get(name))
            entry = None if scope is None else scope.get(c["metric"])
            observed = None if entry is None else entry.get(stat)
            threshold = round(c["ref"] + c["delta"], 9)
            if observed is None:
                n = 0 if entry is None else entry["n"]
                note = (f"needs a confidence interval: at least 2 matched runs, found {n}: "
                        f"fails closed" if entry is not None and "ci" in stat
                        else f"no value for {c['select']}: fails closed")
                add(c["name"], "paired", c["select"], c["metric"], c["op"], threshold, None,
                    False, note, stat=stat)
            else:
                add(c["name"], "paired", c["select"], c["metric"], c["op"], threshold, observed,
                    OPS[c["op"]](observed, threshold), stat=stat)
            continue
        target = _select(metrics[c["run"]], c["select"])
        observed = None if target is None else target.get(c["metric"])
        if c["ref"] == "baseline":
            base = _select(metrics["baseline"], c["select"])
            ref_value = None if base is None else base.get(c["metric"])
        else:
            ref_value = c["ref"]
        threshold = None if ref_value is None else round(ref_value + c["delta"], 9)
        if observed is None or threshold is None:
            add(c["name"], c["run"], c["select"], c["metric"], c["op"], threshold, observed,
                False, f"no value for {c['select']}: fails closed")
        else:
            add(c["name"], c["run"], c["select"], c["metric"], c["op"], threshold, observed,
                OPS[c["op"]](observed, threshold))


def needs_paired(spec: GateSpec | None) -> bool:
    return spec is not None and any(c.get("stat", "value") != "value" for c in spec.checks)


def evaluate_experiment(run_gates: list[tuple[str, dict]], paired: dict,
                        spec: GateSpec | None) -> dict:
    """One gate over matched runs: each run's own default gate (invariants, completion,
    eviction exercised) must have passed, then the gate file's checks on the means and
    the paired summary. No runs: fails closed."""
    checks: list[dict] = []
    add = _adder(checks)
    for run_id, gate in run_gates:
        add(f"{run_id}: every default check passed", run_id, "run", "failed_checks", "==", 0,
            gate["num_failed"], gate["num_failed"] == 0 and gate["num_checks"] > 0)
    means = {label: {"totals": {m: v[f"{label}_mean"] for m, v in paired["totals"].items()},
                     "groups": {g: {m: v[f"{label}_mean"] for m, v in ms.items()}
                                for g, ms in paired["groups"].items()},
                     "roles": {r: {m: v[f"{label}_mean"] for m, v in ms.items()}
                               for r, ms in paired["roles"].items()}}
             for label in RUNS}
    _file_checks(add, means, spec, paired)
    return _result(checks, spec)


def evaluate(runs: dict[str, dict], spec: GateSpec | None, allow_unexercised: bool,
             paired: dict | None = None) -> dict:
    """``runs``: label -> {"metrics": ..., "invariants": ..., "aborted": ...}."""
    checks: list[dict] = []
    add = _adder(checks)

    for label in RUNS:
        run = runs[label]
        add(f"{label} run completed", label, "run", "aborted", "==", None, run["aborted"],
            run["aborted"] is None)
        for name, v in run["invariants"].items():
            if v["hard"]:
                # An invariant never checked proved nothing: it fails closed, unless
                # the operator accepted a replay that exercised nothing.
                never = v["checks"] == 0
                add(f"{label} invariant {name}", label, "run", f"invariant:{name}", "==", 0,
                    v["violations"], v["violations"] == 0 and (not never or allow_unexercised),
                    ("never checked: allowed by --allow-unexercised" if allow_unexercised
                     else "never checked: fails closed") if never else None)
        ev = run["metrics"]["totals"]["evictions"]
        add(f"{label} exercised eviction", label, "run", "evictions", ">", 0, ev,
            ev > 0 or allow_unexercised,
            "no eviction: allowed by --allow-unexercised" if ev == 0 and allow_unexercised
            else ("no eviction: the trace does not exercise the policy" if ev == 0 else None))

    _file_checks(add, {label: runs[label]["metrics"] for label in RUNS}, spec, paired)
    return _result(checks, spec)
