"""diff: two receipts side by side (last release vs this change, one trace under two versions).

Receipts of different traces are refused unless forced: their numbers are not
comparable. B regresses when its gate fails where A's passed, when a check that
passed in A fails in B, or, with a gate file, when B's candidate misses a
threshold taken relative to A's candidate ("baseline" in the file means A).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from psgate.errors import InputError
from psgate.receipt.gate import OPS, GateSpec, _select
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
    for c in (spec.checks if spec else ()):
        run = c["run"]
        tgt_b = _select(b["runs"][run]["metrics"], c["select"])
        observed = None if tgt_b is None else tgt_b.get(c["metric"])
        if c["ref"] == "baseline":
            tgt_a = _select(a["runs"][run]["metrics"], c["select"])
            ref = None if tgt_a is None else tgt_a.get(c["metric"])
        else:
            ref = c["ref"]
        if observed is None or ref is None:
            regressions.append(f"{c['name']}: no value to compare (fails closed)")
        elif not OPS[c["op"]](observed, round(ref + c["delta"], 9)):
            regressions.append(f"{c['name']}: B has {observed}, A-relative threshold "
                               f"{c['op']} {round(ref + c['delta'], 9)}")
    return DiffResult(a, b, rows, config_changes, gate_changes, regressions)
