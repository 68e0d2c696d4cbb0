"""diff: two receipts side by side (last release vs this change, one trace under two versions).

Receipts of different traces are refused unless forced: their numbers are not
comparable. B regresses when its gate fails where A's passed, when a check that
passed in A fails in B, or, with a gate file, when a file check that A meets B
misses: a value check with ref "baseline" compares B's candidate with A's (A
itself is held to A's own value), a ``stat`` check reads each receipt's own
candidate-minus-baseline difference. So a receipt never regresses against itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from psgate.errors import InputError
from psgate.receipt.gate import OPS, GateSpec, expand_select, select_scope
from psgate.stats.bootstrap import paired_summary
from psgate.report.receipts import load_receipt

HEADLINE = ("hit_fraction", "token_hit_ratio", "saved_prefill_tokens", "ttft_p95_ms",
            "evictions", "evictions_suffered", "admission_waits", "recompute_tokens")


@dataclass
class DiffResult:
    a: dict
    b: dict
    rows: list[dict]                       # metric comparisons
    config_changes: list[str]
    gate_changes: list[str]
    regressions: list[str] = field(default_factory=list)

    @property
    def regressed(self) -> bool:
        return bool(self.regressions)


def _flatten(obj, prefix=""):
    if isinstance(obj, dict):
        for k in sorted(obj):
            yield from _flatten(obj[k], f"{prefix}.{k}" if prefix else k)
    else:
        yield prefix, obj


def _delta(x, y):
    if isinstance(x, (int, float)) and isinstance(y, (int, float)) and \
            not isinstance(x, bool) and not isinstance(y, bool):
        return round(y - x, 9)
    return None


def diff(dir_a: str, dir_b: str, force: bool = False, spec: GateSpec | None = None
         ) -> DiffResult:
    a, b = load_receipt(dir_a), load_receipt(dir_b)
    ta, tb = a["trace"]["canonical_sha256"], b["trace"]["canonical_sha256"]
    if ta != tb and not force:
        raise InputError(f"the receipts replay different traces ({a['trace']['path']} "
                         f"{ta[:12]}... vs {b['trace']['path']} {tb[:12]}...): their numbers "
                         f"are not comparable; pass --force to compare anyway", path=str(dir_b))
    rows = []
    for run in ("baseline", "candidate"):
        ma, mb = a["runs"][run]["metrics"], b["runs"][run]["metrics"]
        scopes = [("run", ma["totals"], mb["totals"])]
        for kind in ("roles", "groups"):
            for name in sorted(set(ma[kind]) | set(mb[kind])):
                scopes.append((f"{kind[:-1]}:{name}", ma[kind].get(name, {}),
                               mb[kind].get(name, {})))
        for scope, xa, xb in scopes:
            for m in HEADLINE:
                if m in xa or m in xb:
                    rows.append({"run": run, "select": scope, "metric": m, "a": xa.get(m),
                                 "b": xb.get(m), "delta": _delta(xa.get(m), xb.get(m))})
    conf_a = dict(_flatten({"config": a["config"], "tool": a["tool"]}))
    conf_b = dict(_flatten({"config": b["config"], "tool": b["tool"]}))
    config_changes = [f"{k}: {conf_a.get(k)!r} -> {conf_b.get(k)!r}"
                      for k in sorted(set(conf_a) | set(conf_b)) if conf_a.get(k) != conf_b.get(k)]
    if ta != tb:
        config_changes.insert(0, f"trace.canonical_sha256: {ta} -> {tb}")
    checks_a = {c["name"]: c["verdict"] for c in a["gate"]["checks"]}
    gate_changes, regressions = [], []
    for c in b["gate"]["checks"]:
        before = checks_a.get(c["name"])
        if before != c["verdict"]:
            gate_changes.append(f"{c['name']}: {before or 'absent'} -> {c['verdict']}")
            if c["verdict"] == "fail" and before == "pass":
                regressions.append(f"gate check '{c['name']}' passed in A and fails in B "
                                   f"(observed {c['observed']}, required {c['op']} "
                                   f"{c['threshold']})")
    if a["gate"]["result"] == "pass" and b["gate"]["result"] == "fail" and not regressions:
        regressions.append("B's gate fails where A's passed")
    regressions += _file_regressions(a, b, spec)
    return DiffResult(a, b, rows, config_changes, gate_changes, regressions)


def _own_paired(receipt: dict) -> dict:
    """A receipt's candidate minus its baseline, as a one-run paired summary."""
    return paired_summary([receipt["runs"]["baseline"]["metrics"]],
                          [receipt["runs"]["candidate"]["metrics"]], resamples=100, seed=0)


def _file_regressions(a: dict, b: dict, spec: GateSpec | None) -> list[str]:
    """The gate file's checks on A and on B; a regression is a check A meets and B
    misses (or has no value for). A check that A itself misses is not B's doing."""
    out: list[str] = []
    paired = {}
    for i, c in enumerate(spec.checks if spec else ()):
        stat, run = c.get("stat", "value"), c["run"]
        if stat != "value" and "ci" in stat:
            raise InputError(f"stat '{stat}' needs matched runs; diff compares two single "
                             f"receipts: use diff_mean or rel_diff_mean", path=spec.path,
                             field=f"check[{i}].stat")
        if stat != "value" and not paired:
            paired = {"a": _own_paired(a), "b": _own_paired(b)}
        scopes = paired["b"] if stat != "value" else b["runs"][run]["metrics"]
        for sel in expand_select(c["select"], spec, scopes, f"check[{i}].select"):
            name = c["name"] if sel == c["select"] else f"{c['name']} [{sel}]"
            if stat != "value":
                got = {}
                for k in ("a", "b"):
                    entry = select_scope(paired[k], sel)
                    entry = None if entry is None else entry.get(c["metric"])
                    got[k] = None if entry is None else entry.get(stat)
                threshold = round(c["ref"] + c["delta"], 9)
                ref_a = ref_b = threshold
            else:
                got = {}
                for k, r in (("a", a), ("b", b)):
                    scope = select_scope(r["runs"][run]["metrics"], sel)
                    got[k] = None if scope is None else scope.get(c["metric"])
                if c["ref"] == "baseline":       # A's value is the reference of both
                    ref_a = ref_b = (None if got["a"] is None
                                     else round(got["a"] + c["delta"], 9))
                else:
                    ref_a = ref_b = round(c["ref"] + c["delta"], 9)
            a_ok = got["a"] is not None and ref_a is not None and OPS[c["op"]](got["a"], ref_a)
            if not a_ok:
                continue
            if got["b"] is None or ref_b is None:
                out.append(f"{name}: no value in B to compare (fails closed)")
            elif not OPS[c["op"]](got["b"], ref_b):
                what = c["metric"] if stat == "value" else f"{stat}({c['metric']})"
                out.append(f"{name}: A has {got['a']}, B has {got['b']} for {what}; "
                           f"A-relative threshold {c['op']} {ref_b}")
    return out
