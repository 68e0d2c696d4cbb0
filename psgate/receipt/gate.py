"""The gate: every check, its threshold, the observed value and a verdict.

The default checks: every hard invariant holds in both runs, both runs
finished, the trace exercised eviction (a replay with no eviction proves
nothing about an eviction policy, so it fails closed unless allowed), and the
candidate is no worse than the baseline beyond a tolerance (non-regression):
overall and for every group, on hit fraction, saved prefill tokens and p95
TTFT. A gate that passed a worse candidate would approve exactly the change it
exists to stop, so this comparison is on unless a gate file turns it off. A
gate file adds performance checks. An empty set of checks fails closed.
"""

from __future__ import annotations

import math
import operator
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path


from psgate.errors import InputError
from psgate.inputs import read_capped
from psgate.resources import first_schema_error, load_schema
from psgate.trace.reader import require_utf8_name

OPS = {">=": operator.ge, "<=": operator.le, ">": operator.gt, "<": operator.lt,
       "==": operator.eq, "!=": operator.ne}
RUNS = ("baseline", "candidate")
_TOML_POS = re.compile(r" \(at line (\d+), column (\d+)\)$")
# A threshold is ref + delta, recorded in the receipt: both finite (a NaN or an infinity
# would make a comparison that decides nothing) and small enough to stay a JSON number.
MAX_THRESHOLD = 1e15
# A gate file is a few checks: a larger one is a wrong path (a trace, /dev/zero), refused
# before it is read into memory.
MAX_GATE_FILE_BYTES = 1 << 20


# The non-regression checks: metric -> (direction, tolerance kind). "higher" metrics
# may lose at most the tolerance, "lower" ones may grow at most by it.
NON_REGRESSION = (("hit_fraction", "higher", "absolute"),
                  ("saved_prefill_tokens", "higher", "relative"),
                  ("ttft_p95_ms", "lower", "relative"))


@dataclass(frozen=True, slots=True)
class Tolerances:
    """How much worse than the baseline the candidate may be before the default gate
    fails: ``hit`` in absolute hit fraction, ``tokens`` and ``ttft`` relative to the
    baseline's value. Small scopes are reported but not judged, because there a request
    or two decides the number: hit fraction and saved tokens need ``min_requests``
    measured requests in both runs (and never fail on one request's worth, 1/n, of
    loss), p95 TTFT needs ``min_requests_ttft`` (its slowest 5% is then at least ten
    requests). ``enabled`` False leaves only the structural checks."""
    hit: float = 0.01
    tokens: float = 0.02
    ttft: float = 0.05
    min_requests: int = 30
    min_requests_ttft: int = 200
    enabled: bool = True

    def to_json(self) -> dict:
        return {"enabled": self.enabled, "tolerance_hit": self.hit,
                "tolerance_tokens": self.tokens, "tolerance_ttft": self.ttft,
                "min_requests": self.min_requests,
                "min_requests_ttft": self.min_requests_ttft}

    @classmethod
    def from_json(cls, doc: dict | None) -> "Tolerances":
        """A receipt's recorded setting; a receipt from before the comparison existed
        records none and is re-run without it."""
        if not doc:
            return cls(enabled=False)
        return cls(hit=doc["tolerance_hit"], tokens=doc["tolerance_tokens"],
                   ttft=doc["tolerance_ttft"], min_requests=doc["min_requests"],
                   min_requests_ttft=doc["min_requests_ttft"], enabled=doc["enabled"])

    def validated(self) -> "Tolerances":
        """The command's options held to the bounds a gate file's [defaults] table has
        (schemas/gate.schema.json, the one source of both), so an option cannot pass
        what the same value in a gate file is refused for."""
        bounds = load_schema("gate")["properties"]["defaults"]["properties"]
        for opt, key, v in (("--tolerance-hit", "tolerance_hit", self.hit),
                            ("--tolerance-tokens", "tolerance_tokens", self.tokens),
                            ("--tolerance-ttft", "tolerance_ttft", self.ttft),
                            ("--min-requests", "min_requests", self.min_requests),
                            ("--min-requests-ttft", "min_requests_ttft",
                             self.min_requests_ttft)):
            b = bounds[key]
            lo, hi = b["minimum"], b["maximum"]
            integer = b["type"] == "integer"
            ok = (type(v) is int if integer else type(v) in (int, float) and math.isfinite(v))
            if not (ok and lo <= v <= hi):
                what = "an integer" if integer else "a finite number"
                raise InputError(f"expected {what} in {lo!r}..{hi!r}, found {v!r:.40} (the "
                                 f"bound of a gate file's [defaults] {key})", path=opt)
        return self


@dataclass(frozen=True, slots=True)
class GateSpec:
    path: str | None
    checks: tuple[dict, ...]
    # role -> groups: roles for traces that label none (captures, imports)
    roles: dict = field(default_factory=dict)
    # the file's [defaults] table: replaces the command's tolerances where given
    defaults: dict = field(default_factory=dict)

    def tolerances(self, given: Tolerances) -> Tolerances:
        """``given`` with what the file's [defaults] table sets in its place."""
        d = self.defaults
        for key, v in d.items():    # the schema bounds them; NaN compares false to bounds
            if isinstance(v, float) and not math.isfinite(v):
                raise InputError(f"expected a finite number, found {v}", path=self.path,
                                 field=f"defaults.{key}")
        return Tolerances(hit=d.get("tolerance_hit", given.hit),
                          tokens=d.get("tolerance_tokens", given.tokens),
                          ttft=d.get("tolerance_ttft", given.ttft),
                          min_requests=d.get("min_requests", given.min_requests),
                          min_requests_ttft=d.get("min_requests_ttft",
                                                  given.min_requests_ttft),
                          enabled=d.get("non_regression", given.enabled))


def effective_tolerances(spec: "GateSpec | None", given: Tolerances) -> Tolerances:
    return given if spec is None else spec.tolerances(given)


def load_gate_file(path: str) -> GateSpec:
    require_utf8_name(path)
    p = Path(path)
    try:
        raw = read_capped(p, "gate file", MAX_GATE_FILE_BYTES)
    except OSError as exc:
        raise InputError(f"cannot read gate file: {exc.strerror}", path=path) from None
    try:
        doc = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise InputError("not valid UTF-8", path=path) from None
    except RecursionError:      # tomllib parses nested arrays and tables recursively
        raise InputError("arrays or inline tables nested too deeply for a gate file",
                         path=path) from None
    except tomllib.TOMLDecodeError as exc:
        msg = getattr(exc, "msg", str(exc))
        line, col = getattr(exc, "lineno", None), getattr(exc, "colno", None)
        pos = _TOML_POS.search(msg) if line is None else None
        if pos:  # before Python 3.14 the position is only in the message text
            msg, line, col = msg[:pos.start()], int(pos[1]), pos[2]
        raise InputError(f"invalid TOML: {msg}" + (f" (column {col})" if col else ""),
                         path=path, line=line) from None
    if not doc.get("check") and not doc.get("defaults"):
        raise InputError("a gate file needs at least one [[check]] table or a [defaults] "
                         "table; found neither", path=path)
    checks_in = doc.get("check")
    for i, c in enumerate(checks_in if type(checks_in) is list else ()):
        for key in ("ref", "delta"):
            v = c.get(key) if type(c) is dict else None
            if type(v) in (int, float) and not (math.isfinite(v) and abs(v) <= MAX_THRESHOLD):
                raise InputError(f"expected a finite number of magnitude at most "
                                 f"{MAX_THRESHOLD:g}, found {v!r:.40}", path=path,
                                 field=f"check[{i}].{key}")
    found = first_schema_error(doc, "gate")
    if found:
        raise InputError(found[1], path=path, field=found[0])
    checks = []
    for i, c in enumerate(doc.get("check", ())):
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
    return GateSpec(path=path, checks=tuple(checks), roles=doc.get("roles", {}),
                    defaults=doc.get("defaults", {}))


def select_scope(scopes: dict, select: str) -> dict | None:
    """One scope of a run's metrics or of the paired summary: ``run``, ``group:NAME`` or
    ``role:NAME`` (a role the trace labels)."""
    if select == "run":
        return scopes["totals"]
    kind, _, name = select.partition(":")
    return scopes["groups" if kind == "group" else "roles"].get(name)


def _measured(scope: dict) -> bool:
    n = scope.get("measured_requests")
    if isinstance(n, dict):         # a paired summary's entry
        n = n.get("candidate_mean")
    return n is None or n > 0


def expand_select(select: str, spec: GateSpec | None, scopes: dict,
                  where: str | None = None) -> list[str]:
    """The concrete scopes one selector names. ``each:group`` is every group of the trace;
    ``role:NAME`` the groups the gate file's [roles] table maps to it, else the trace's own
    role label. Roles are hand labels that captured and imported traces do not carry, so a
    role neither names is a gate file that cannot apply to this trace: bad input (exit 2)
    naming the fix, rather than a check that fails closed on every such trace."""
    if select == "each:group":      # a group that measured nothing has nothing to compare
        return [f"group:{g}" for g, v in sorted(scopes["groups"].items()) if _measured(v)]
    kind, _, name = select.partition(":")
    if kind != "role":
        return [select]
    mapped = (spec.roles if spec else {}).get(name)
    if mapped is not None:
        return [f"group:{g}" for g in mapped]
    if name not in scopes["roles"]:
        have = ", ".join(sorted(scopes["roles"])) or "none"
        groups = ", ".join(sorted(scopes["groups"])[:3]) or "GROUP"
        raise InputError(f"'{select}': this trace labels no requests with role '{name}' "
                         f"(its roles: {have}); map groups to the role in the gate file "
                         f"([roles] {name} = [\"{groups.split(', ')[0]}\"]; groups here: "
                         f"{groups}{', ...' if len(scopes['groups']) > 3 else ''}) or select "
                         f"group:NAME or each:group",
                         path=spec.path if spec else None, field=where)
    return [select]


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
    """The gate file's checks, one per scope its selector names. Without ``stat``, a check
    compares one policy's metric (in an experiment, its mean over runs) with the
    baseline's or a constant. With ``stat``, it reads the paired summary: the mean
    difference, or a bound of its bootstrap interval, which needs at least two matched
    runs and otherwise fails closed."""
    for i, c in enumerate(spec.checks if spec else ()):
        stat = c.get("stat", "value")
        scopes = metrics[c["run"]] if stat == "value" or paired is None else paired
        targets = expand_select(c["select"], spec, scopes, f"check[{i}].select")
        if not targets:
            add(c["name"], c["run"], c["select"], c["metric"], c["op"], None, None, False,
                f"{c['select']} names no scope here: fails closed")
        for sel in targets:
            name = c["name"] if sel == c["select"] else f"{c['name']} [{sel}]"
            if stat != "value":
                scope = None if paired is None else select_scope(paired, sel)
                entry = None if scope is None else scope.get(c["metric"])
                observed = None if entry is None else entry.get(stat)
                threshold = round(c["ref"] + c["delta"], 9)
                if observed is None:
                    n = 0 if entry is None else entry["n"]
                    note = (f"needs a confidence interval: at least 2 matched runs, found "
                            f"{n}: fails closed" if entry is not None and "ci" in stat
                            else f"no value for {sel}: fails closed")
                    add(name, "paired", sel, c["metric"], c["op"], threshold, None,
                        False, note, stat=stat)
                else:
                    add(name, "paired", sel, c["metric"], c["op"], threshold, observed,
                        OPS[c["op"]](observed, threshold), stat=stat)
                continue
            target = select_scope(metrics[c["run"]], sel)
            observed = None if target is None else target.get(c["metric"])
            if c["ref"] == "baseline":
                base = select_scope(metrics["baseline"], sel)
                ref_value = None if base is None else base.get(c["metric"])
            else:
                ref_value = c["ref"]
            threshold = None if ref_value is None else round(ref_value + c["delta"], 9)
            if observed is None or threshold is None:
                add(name, c["run"], sel, c["metric"], c["op"], threshold, observed,
                    False, f"no value for {sel}: fails closed")
            else:
                add(name, c["run"], sel, c["metric"], c["op"], threshold, observed,
                    OPS[c["op"]](observed, threshold))


def _g(x) -> str:
    return "-" if x is None else f"{x:.6g}" if isinstance(x, float) else str(x)


def _rule(metric: str, n: float, tol: Tolerances) -> tuple[int, float, str]:
    """(requests needed to judge, allowed loss, its wording) of one metric at a scope of
    ``n`` measured requests. Losses are absolute for hit fraction and relative to the
    baseline otherwise; a hit-fraction or saved-token loss of one request's worth (1/n)
    never fails on its own."""
    if metric == "ttft_p95_ms":
        return tol.min_requests_ttft, tol.ttft, f"{tol.ttft:g}x baseline"
    given = tol.hit if metric == "hit_fraction" else tol.tokens
    allowed = max(given, 1 / n) if n else given
    said = f"{allowed:.4g}" + (" absolute" if metric == "hit_fraction" else "x baseline")
    return tol.min_requests, allowed, said + (f" (1/{_g(n)} requests)" if allowed > given
                                              else "")


def _nr_scopes(*scopes: dict) -> list[str]:
    groups = sorted(set().union(*(s["groups"] for s in scopes)))
    return ["run"] + [f"group:{g}" for g in groups]


def _nr_name(metric: str, sel: str) -> str:
    return f"non-regression {metric} ({sel})"


def _non_regression(add, metrics: dict[str, dict], tol: Tolerances) -> None:
    """Candidate no worse than baseline beyond ``tol``, overall and per group, on one
    replay: candidate >= baseline - allowed loss (hit fraction, saved tokens), candidate
    <= baseline + allowed growth (p95 TTFT). The note carries both values and their
    difference, so a failing group reads as the evidence against it."""
    if not tol.enabled:
        return
    b, c = metrics["baseline"], metrics["candidate"]
    for sel in _nr_scopes(b, c):
        sb, sc = select_scope(b, sel) or {}, select_scope(c, sel) or {}
        n = min(sb.get("measured_requests") or 0, sc.get("measured_requests") or 0)
        for metric, direction, kind in NON_REGRESSION:
            op = ">=" if direction == "higher" else "<="
            x, y = sb.get(metric), sc.get(metric)
            need, t, said = _rule(metric, n, tol)
            if n < need:
                add(_nr_name(metric, sel), "candidate", sel, metric, op, None, y, True,
                    f"{n} measured requests, fewer than {need}: not judged")
                continue
            if x is None or y is None:
                add(_nr_name(metric, sel), "candidate", sel, metric, op, None, y, False,
                    f"no value (baseline {_g(x)}, candidate {_g(y)}): fails closed")
                continue
            if kind == "absolute":
                threshold = x - t
            else:
                threshold = x * (1 - t) if direction == "higher" else x * (1 + t)
            threshold = round(threshold, 9)
            ok = y >= threshold if direction == "higher" else y <= threshold
            add(_nr_name(metric, sel), "candidate", sel, metric, op, threshold, y, ok,
                f"baseline {_g(x)}, candidate {_g(y)}, difference {_g(round(y - x, 9))}; "
                f"allowed {said}")


def _non_regression_paired(add, paired: dict, tol: Tolerances) -> None:
    """The same comparison over matched runs, on the paired bootstrap interval of
    candidate minus baseline: it fails when the interval's worse end (the upper bound of
    the loss) is beyond the allowed loss, so a loss the runs cannot tell from zero passes
    and a consistent one fails. Relative allowances scale with the baseline's mean; n is
    the scope's mean of measured requests per run. One run has no interval: its
    difference is judged as it is."""
    if not tol.enabled:
        return
    for sel in _nr_scopes(paired):
        scope = select_scope(paired, sel) or {}
        nm = scope.get("measured_requests")
        n = 0 if nm is None else min(nm["baseline_mean"], nm["candidate_mean"])
        for metric, direction, kind in NON_REGRESSION:
            op = ">=" if direction == "higher" else "<="
            stat = "diff_ci_low" if direction == "higher" else "diff_ci_high"
            e = scope.get(metric)
            need, t, said = _rule(metric, n, tol)
            name = _nr_name(metric, sel)
            if n < need:
                add(name, "paired", sel, metric, op, None,
                    None if e is None else e[stat], True,
                    f"{_g(n)} measured requests (mean over runs), fewer than {need}: "
                    f"not judged", stat=stat)
                continue
            if e is None:
                add(name, "paired", sel, metric, op, None, None, False,
                    f"no paired value for {sel}: fails closed", stat=stat)
                continue
            note = ""
            observed = e[stat]
            if observed is None:
                stat, observed = "diff_mean", e["diff_mean"]
                note = "one run, no interval: the difference itself is judged; "
            scale = 1.0 if kind == "absolute" else e["baseline_mean"]
            threshold = round(-t * scale if direction == "higher" else t * scale, 9)
            ok = observed >= threshold if direction == "higher" else observed <= threshold
            ci = ("" if e["diff_ci_low"] is None
                  else f" [95% CI {_g(e['diff_ci_low'])}, {_g(e['diff_ci_high'])}]")
            add(name, "paired", sel, metric, op, threshold, observed, ok,
                f"{note}baseline mean {_g(e['baseline_mean'])}, candidate mean "
                f"{_g(e['candidate_mean'])}, difference {_g(e['diff_mean'])}{ci} over "
                f"{e['n']} run(s); allowed {said}", stat=stat)


def needs_paired(spec: GateSpec | None) -> bool:
    return spec is not None and any(c.get("stat", "value") != "value" for c in spec.checks)


def evaluate_experiment(run_gates: list[tuple[str, dict]], paired: dict,
                        spec: GateSpec | None, tolerances: Tolerances | None = None) -> dict:
    """One gate over matched runs: each run's own structural checks (invariants,
    completion, eviction exercised) must have passed, then non-regression on the paired
    intervals, then the gate file's checks on the means and the paired summary. No runs:
    fails closed."""
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
    if run_gates and tolerances is not None:
        _non_regression_paired(add, paired, tolerances)
    _file_checks(add, means, spec, paired)
    return _result(checks, spec)


def evaluate(runs: dict[str, dict], spec: GateSpec | None, allow_unexercised: bool,
             paired: dict | None = None, tolerances: Tolerances | None = None) -> dict:
    """``runs``: label -> {"metrics": ..., "invariants": ..., "aborted": ...};
    ``tolerances``: the non-regression setting in effect (the gate file's [defaults]
    already applied); None leaves the structural and file checks alone (replay and
    experiments always pass theirs)."""
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

    metrics = {label: runs[label]["metrics"] for label in RUNS}
    if tolerances is not None:
        _non_regression(add, metrics, tolerances)
    _file_checks(add, metrics, spec, paired)
    return _result(checks, spec)
