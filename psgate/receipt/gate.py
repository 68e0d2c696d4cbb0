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
        delta = f" {c['delta']:+g}" if c["delta"] else ""
        c.setdefault("name", f"check[{i}] {c['metric']} {c['op']} {c['ref']}{delta} "
                     f"({c['select']})")
        checks.append(c)
    return GateSpec(path=path, checks=tuple(checks))


def _select(run_metrics: dict, select: str) -> dict | None:
    if select == "run":
        return run_metrics["totals"]
    kind, _, name = select.partition(":")
    return run_metrics["groups" if kind == "group" else "roles"].get(name)


def evaluate(runs: dict[str, dict], spec: GateSpec | None, allow_unexercised: bool) -> dict:
    """``runs``: label -> {"metrics": ..., "invariants": ..., "aborted": ...}."""
    checks: list[dict] = []

    def add(name, run, select, metric, op, threshold, observed, ok, note=None):
        checks.append({"name": name, "run": run, "select": select, "metric": metric, "op": op,
                       "threshold": threshold, "observed": observed,
                       "verdict": "pass" if ok else "fail", **({"note": note} if note else {})})

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

    for c in (spec.checks if spec else ()):
        target = _select(runs[c["run"]]["metrics"], c["select"])
        observed = None if target is None else target.get(c["metric"])
        if c["ref"] == "baseline":
            base = _select(runs["baseline"]["metrics"], c["select"])
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

    ok = bool(checks) and all(c["verdict"] == "pass" for c in checks)
    return {"result": "pass" if ok else "fail",
            "num_checks": len(checks),
            "num_failed": sum(c["verdict"] == "fail" for c in checks),
            "gate_file": spec.path if spec else None,
            "checks": checks}
