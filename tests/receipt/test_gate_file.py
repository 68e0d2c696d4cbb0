"""Gate files (TOML) and the gate's verdicts."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from psgate.errors import InputError
from psgate.receipt.gate import GateSpec, evaluate, load_gate_file

VALID = """\
# extra performance checks
[[check]]
metric = "hit_fraction"
op = ">="
ref = "baseline"
delta = -0.02

[[check]]
name = "victim p95 TTFT"
metric = "ttft_p95_ms"
select = "role:victim"
op = "<="
ref = 250
"""


def write(tmp_path: Path, text: str | bytes, name: str = "gate.toml") -> str:
    p = tmp_path / name
    if isinstance(text, str):
        text = text.encode("utf-8")
    p.write_bytes(text)
    return str(p)


# -- load_gate_file ---------------------------------------------------------------------------

def test_valid_file_loads_with_defaults(tmp_path):
    path = write(tmp_path, VALID)
    spec = load_gate_file(path)
    assert spec.path == path
    assert spec.checks == (
        {"select": "run", "run": "candidate", "delta": -0.02, "metric": "hit_fraction",
         "op": ">=", "ref": "baseline",
         "name": "check[0] hit_fraction >= baseline -0.02 (run)"},
        {"select": "role:victim", "run": "candidate", "delta": 0, "metric": "ttft_p95_ms",
         "op": "<=", "ref": 250, "name": "victim p95 TTFT"},
    )


def test_syntax_error_names_path_and_line(tmp_path):
    path = write(tmp_path, '[[check]]\nmetric = "hit_fraction"\nop = >=\nref = 1\n')
    with pytest.raises(InputError) as info:
        load_gate_file(path)
    assert str(info.value) == f"{path}:3: invalid TOML: Invalid value (column 6)"
    assert info.value.line == 3
    assert info.value.exit_code == 2


def test_unterminated_table_header_names_line(tmp_path):
    path = write(tmp_path, '[[check]]\nmetric = "hit_fraction"\nop = ">="\nref = 1\n\n[[check\n')
    with pytest.raises(InputError) as info:
        load_gate_file(path)
    assert str(info.value).startswith(f"{path}:6: invalid TOML: Expected ']]' ")
    assert str(info.value).endswith(" (column 8)")


def test_syntax_error_at_end_of_document(tmp_path):
    path = write(tmp_path, '[[check]]\nmetric = "hit_fraction"\nop = ')
    with pytest.raises(InputError) as info:
        load_gate_file(path)
    assert str(info.value).startswith(f"{path}: invalid TOML: Invalid value")
    assert "end of document" in str(info.value)


def test_unknown_metric_names_field_path(tmp_path):
    path = write(tmp_path, VALID + '\n[[check]]\nmetric = "hit_ratio"\nop = ">"\nref = 0\n')
    with pytest.raises(InputError) as info:
        load_gate_file(path)
    msg = str(info.value)
    assert msg.startswith(f"{path}: field 'check[2].metric': ")
    assert "'hit_ratio' is not one of" in msg
    assert info.value.field == "check[2].metric"


def test_unknown_metric_in_first_check(tmp_path):
    path = write(tmp_path, '[[check]]\nmetric = "latency"\nop = "<"\nref = 1\n')
    with pytest.raises(InputError, match=r": field 'check\[0\]\.metric': 'latency' is not one"):
        load_gate_file(path)


@pytest.mark.parametrize("value", ['"0.01"', "true", "[0.1]"])
def test_wrong_type_for_delta(tmp_path, value):
    path = write(tmp_path, f'[[check]]\nmetric = "hit_fraction"\nop = ">="\nref = "baseline"\n'
                           f'delta = {value}\n')
    with pytest.raises(InputError) as info:
        load_gate_file(path)
    assert str(info.value).startswith(f"{path}: field 'check[0].delta': ")
    assert "is not of type 'number'" in str(info.value)


@pytest.mark.parametrize("op", ["=>", "=", "in", ""])
def test_op_not_allowed(tmp_path, op):
    path = write(tmp_path, f'[[check]]\nmetric = "evictions"\nop = "{op}"\nref = 0\n')
    with pytest.raises(InputError) as info:
        load_gate_file(path)
    assert str(info.value).startswith(f"{path}: field 'check[0].op': ")
    assert info.value.field == "check[0].op"


@pytest.mark.parametrize("text, field", [
    ('[[check]]\nmetric = "evictions"\nop = ">"\n', "check[0]"),            # no ref
    ('[[check]]\nmetric = "evictions"\nop = ">"\nref = "cand"\n', "check[0].ref"),
    ('[[check]]\nmetric = "evictions"\nop = ">"\nref = 0\nrun = "other"\n', "check[0].run"),
    ('[[check]]\nmetric = "evictions"\nop = ">"\nref = 0\nselect = "tenant:a"\n',
     "check[0].select"),
    ('[[check]]\nmetric = "evictions"\nop = ">"\nref = 0\nthreshold = 1\n', "check[0]"),
    ('top = 1\n[[check]]\nmetric = "evictions"\nop = ">"\nref = 0\n', "(top level)"),
])
def test_other_schema_errors_name_the_field(tmp_path, text, field):
    path = write(tmp_path, text)
    with pytest.raises(InputError) as info:
        load_gate_file(path)
    assert str(info.value).startswith(f"{path}: field '{field}': ")


@pytest.mark.parametrize("text", ["", "# only a comment\n", "title = 'x'\n", "check = []\n"],
                         ids=["empty", "comment", "no-check-key", "empty-check-array"])
def test_no_checks_is_an_error(tmp_path, text):
    path = write(tmp_path, text)
    with pytest.raises(InputError) as info:
        load_gate_file(path)
    assert str(info.value) == (f"{path}: a gate file needs at least one [[check]] table or "
                               f"a [defaults] table; found neither")


def test_non_utf8_is_an_error(tmp_path):
    path = write(tmp_path, b'[[check]]\nmetric = "evictions"\nop = ">"\nref = 0\nname = "\xff"\n')
    with pytest.raises(InputError) as info:
        load_gate_file(path)
    assert str(info.value) == f"{path}: not valid UTF-8"


def test_missing_file_is_an_error(tmp_path):
    path = str(tmp_path / "nope.toml")
    with pytest.raises(InputError) as info:
        load_gate_file(path)
    assert str(info.value).startswith(f"{path}: cannot read gate file: ")


# -- evaluate ---------------------------------------------------------------------------------

def _metrics(evictions=10, hit_fraction=0.5, victim_p95=100.0):
    return {"totals": {"evictions": evictions, "hit_fraction": hit_fraction,
                       "ttft_p95_ms": 80.0},
            "groups": {"tenant-a": {"hit_fraction": hit_fraction}},
            "roles": {"victim": {"ttft_p95_ms": victim_p95, "evictions_suffered": 3}}}


def _run(**metrics):
    return {"aborted": None,
            "invariants": {"refcount": {"hard": True, "violations": 0, "checks": 50},
                           "soft_thing": {"hard": False, "violations": 4, "checks": 50}},
            "metrics": _metrics(**metrics)}


def _runs(base=None, cand=None):
    return {"baseline": base if base is not None else _run(),
            "candidate": cand if cand is not None else _run()}


def _check(gate: dict, name: str) -> dict:
    matches = [c for c in gate["checks"] if c["name"] == name]
    assert len(matches) == 1, [c["name"] for c in gate["checks"]]
    return matches[0]


def _failed(gate: dict) -> list[str]:
    return [c["name"] for c in gate["checks"] if c["verdict"] == "fail"]


def _spec(*checks, path="g.toml") -> GateSpec:
    full = []
    for i, c in enumerate(checks):
        c = {"select": "run", "run": "candidate", "delta": 0, **c}
        c.setdefault("name", f"check[{i}]")
        full.append(c)
    return GateSpec(path=path, checks=tuple(full))


def test_default_gate_passes():
    gate = evaluate(_runs(), None, allow_unexercised=False)
    assert gate["result"] == "pass"
    assert gate["num_failed"] == 0
    assert gate["gate_file"] is None
    # completed + one hard invariant + exercised, for each run; soft invariants are not checks
    assert [c["name"] for c in gate["checks"]] == [
        "baseline run completed", "baseline invariant refcount", "baseline exercised eviction",
        "candidate run completed", "candidate invariant refcount",
        "candidate exercised eviction"]
    assert gate["num_checks"] == 6


def test_hard_invariant_violation_fails():
    cand = _run()
    cand["invariants"]["refcount"]["violations"] = 2
    gate = evaluate(_runs(cand=cand), None, allow_unexercised=False)
    assert gate["result"] == "fail"
    assert _failed(gate) == ["candidate invariant refcount"]
    c = _check(gate, "candidate invariant refcount")
    assert (c["observed"], c["threshold"], c["op"], c["run"]) == (2, 0, "==", "candidate")
    assert gate["num_failed"] == 1


def test_soft_invariant_violation_does_not_fail():
    cand = _run()
    cand["invariants"]["soft_thing"]["violations"] = 100
    assert evaluate(_runs(cand=cand), None, allow_unexercised=False)["result"] == "pass"


def test_aborted_run_fails():
    base = _run()
    base["aborted"] = "out of blocks at line 7"
    gate = evaluate(_runs(base=base), None, allow_unexercised=False)
    assert gate["result"] == "fail"
    assert _failed(gate) == ["baseline run completed"]
    assert _check(gate, "baseline run completed")["observed"] == "out of blocks at line 7"


def test_no_eviction_fails_closed():
    gate = evaluate(_runs(cand=_run(evictions=0)), None, allow_unexercised=False)
    assert gate["result"] == "fail"
    assert _failed(gate) == ["candidate exercised eviction"]
    c = _check(gate, "candidate exercised eviction")
    assert c["observed"] == 0
    assert "does not exercise" in c["note"]


def test_no_eviction_allowed_when_asked():
    runs = _runs(base=_run(evictions=0), cand=_run(evictions=0))
    gate = evaluate(runs, None, allow_unexercised=True)
    assert gate["result"] == "pass"
    c = _check(gate, "candidate exercised eviction")
    assert c["verdict"] == "pass"
    assert "--allow-unexercised" in c["note"]


def test_allow_unexercised_does_not_hide_other_failures():
    cand = _run(evictions=0)
    cand["invariants"]["refcount"]["violations"] = 1
    gate = evaluate(_runs(cand=cand), None, allow_unexercised=True)
    assert _failed(gate) == ["candidate invariant refcount"]


def test_invariant_never_checked_fails_closed():
    base = _run()
    base["invariants"]["refcount"]["checks"] = 0
    gate = evaluate(_runs(base=base), None, allow_unexercised=False)
    assert gate["result"] == "fail"
    assert _failed(gate) == ["baseline invariant refcount"]
    c = _check(gate, "baseline invariant refcount")
    assert c["observed"] == 0
    assert c["note"] == "never checked: fails closed"


def test_invariant_never_checked_allowed_only_with_allow_unexercised():
    runs = _runs(base=_run(evictions=0), cand=_run(evictions=0))
    for r in runs.values():
        r["invariants"]["refcount"]["checks"] = 0
    gate = evaluate(runs, None, allow_unexercised=True)
    assert gate["result"] == "pass"
    c = _check(gate, "candidate invariant refcount")
    assert (c["verdict"], c["note"]) == ("pass", "never checked: allowed by --allow-unexercised")
    # a violation still fails, allowed or not
    runs["candidate"]["invariants"]["refcount"]["violations"] = 1
    gate = evaluate(runs, None, allow_unexercised=True)
    assert _failed(gate) == ["candidate invariant refcount"]


@pytest.mark.parametrize("cand_hit, delta, op, verdict", [
    (0.49, -0.02, ">=", "pass"),    # 0.49 >= 0.50 - 0.02
    (0.48, -0.02, ">=", "pass"),    # boundary: 0.48 >= 0.48 (rounded threshold)
    (0.47, -0.02, ">=", "fail"),
    (0.55, 0.05, ">=", "pass"),
    (0.54, 0.05, ">=", "fail"),
    (0.50, 0, "==", "pass"),
    (0.50, 0, ">", "fail"),
    (0.51, 0, "!=", "pass"),
])
def test_check_against_baseline_plus_delta(cand_hit, delta, op, verdict):
    runs = _runs(base=_run(hit_fraction=0.50), cand=_run(hit_fraction=cand_hit))
    spec = _spec({"metric": "hit_fraction", "op": op, "ref": "baseline", "delta": delta,
                  "name": "hit"})
    gate = evaluate(runs, spec, allow_unexercised=False)
    c = _check(gate, "hit")
    assert c["threshold"] == round(0.50 + delta, 9)
    assert c["observed"] == cand_hit
    assert c["verdict"] == verdict
    assert gate["result"] == ("pass" if verdict == "pass" else "fail")
    assert gate["gate_file"] == "g.toml"
    assert gate["num_checks"] == 7


def test_check_uses_the_selected_scope_of_both_runs():
    runs = _runs(base=_run(victim_p95=100.0), cand=_run(victim_p95=130.0))
    spec = _spec({"metric": "ttft_p95_ms", "select": "role:victim", "op": "<=",
                  "ref": "baseline", "delta": 20, "name": "victim"},
                 {"metric": "ttft_p95_ms", "op": "<=", "ref": "baseline", "delta": 0,
                  "name": "all"})
    gate = evaluate(runs, spec, allow_unexercised=False)
    v = _check(gate, "victim")
    assert (v["threshold"], v["observed"], v["verdict"]) == (120.0, 130.0, "fail")
    a = _check(gate, "all")
    assert (a["threshold"], a["observed"], a["verdict"]) == (80.0, 80.0, "pass")


def test_check_with_constant_ref_and_run_baseline():
    spec = _spec({"metric": "evictions", "run": "baseline", "op": "<", "ref": 10,
                  "name": "base evictions"})
    c = _check(evaluate(_runs(), spec, allow_unexercised=False), "base evictions")
    assert (c["run"], c["threshold"], c["observed"], c["verdict"]) == ("baseline", 10, 10,
                                                                       "fail")


@pytest.mark.parametrize("check", [
    {"metric": "hit_fraction", "select": "group:tenant-z", "op": ">=", "ref": "baseline"},
    {"metric": "occupancy_max", "op": "<=", "ref": 100},        # metric absent from totals
], ids=["missing-group", "missing-metric"])
def test_check_on_missing_value_fails_closed(check):
    gate = evaluate(_runs(), _spec({**check, "name": "x"}), allow_unexercised=False)
    c = _check(gate, "x")
    assert c["verdict"] == "fail"
    assert c["observed"] is None
    assert c["note"] == f"no value for {check.get('select', 'run')}: fails closed"
    assert gate["result"] == "fail"
    assert _failed(gate) == ["x"]


def test_missing_role_in_baseline_only_fails_closed():
    base = _run()
    del base["metrics"]["roles"]["victim"]
    spec = _spec({"metric": "ttft_p95_ms", "select": "role:victim", "op": "<=",
                  "ref": "baseline", "name": "x"})
    c = _check(evaluate(_runs(base=base), spec, allow_unexercised=False), "x")
    assert (c["observed"], c["threshold"], c["verdict"]) == (100.0, None, "fail")


def test_gate_file_round_trip(tmp_path):
    spec = load_gate_file(write(tmp_path, VALID))
    runs = _runs(base=_run(hit_fraction=0.60), cand=_run(hit_fraction=0.59, victim_p95=251.0))
    gate = evaluate(runs, spec, allow_unexercised=False)
    assert _failed(gate) == ["victim p95 TTFT"]
    assert _check(gate, "check[0] hit_fraction >= baseline -0.02 (run)")["threshold"] == 0.58


def test_evaluate_does_not_mutate_inputs():
    runs = _runs()
    spec = _spec({"metric": "hit_fraction", "op": ">=", "ref": "baseline", "name": "h"})
    before = (copy.deepcopy(runs), copy.deepcopy(spec.checks))
    evaluate(runs, spec, allow_unexercised=False)
    assert (runs, spec.checks) == before
