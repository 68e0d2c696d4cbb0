"""Fuzzing the trace reader and the gate-file parser, resource limits, and a soak slice.

Run at length:  PSGATE_FUZZ_EXAMPLES=20000 python -m pytest tests/system/test_fuzz_soak.py -k fuzz -s
                python tools/fuzz_atheris.py trace -max_total_time=600   (and gate)
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from psgate.errors import InputError
from psgate.receipt.gate import GateSpec, load_gate_file
from psgate.trace import validate_trace
from psgate.trace.reader import Limits

from test_cli import assert_one_line_error, psgate

EXAMPLES = int(os.environ.get("PSGATE_FUZZ_EXAMPLES", "300"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=not os.environ.get(
    "PSGATE_FUZZ_EXAMPLES"), suppress_health_check=list(HealthCheck))
TRIED = {"trace": 0, "gate": 0}

# The seed trace tools/fuzz_atheris.py starts from too.
VALID_TEXT = (Path(__file__).resolve().parents[1] / "data" / "fuzz_seed.jsonl").read_bytes()
VALID = [json.loads(line) for line in VALID_TEXT.splitlines()]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=True) |
    st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner,
                                                                 max_size=4), max_leaves=8)


@st.composite
def mutated_traces(draw):
    kind = draw(st.integers(0, 3))
    if kind == 0:       # byte-level mutation of a valid trace
        data = bytearray(VALID_TEXT)
        for _ in range(draw(st.integers(1, 6))):
            op = draw(st.integers(0, 2))
            pos = draw(st.integers(0, len(data)))
            if op == 0:
                data[pos:pos] = draw(st.binary(min_size=1, max_size=4))
            elif op == 1 and len(data) > 1:
                del data[pos:pos + draw(st.integers(1, 8))]
            elif data:
                data[min(pos, len(data) - 1)] = draw(st.integers(0, 255))
        return bytes(data)
    lines = [dict(x) for x in VALID]
    i = draw(st.integers(0, len(lines) - 1))
    key = draw(st.sampled_from(sorted(lines[i]) + ["extra", "t", "blocks", "tail"]))
    if kind == 1:       # one field gets an arbitrary JSON value
        lines[i][key] = draw(json_values)
    elif kind == 2:     # one field removed
        lines[i].pop(key, None)
    else:               # a whole line replaced by arbitrary JSON
        lines[i] = draw(json_values)
    return "".join(json.dumps(x) + "\n" for x in lines).encode()


@FUZZ
@given(data=mutated_traces())
def test_fuzz_trace_reader(tmp_path_factory, data):
    p = tmp_path_factory.mktemp("f") / "t.jsonl"
    p.write_bytes(data)
    TRIED["trace"] += 1
    try:
        validate_trace(str(p))
    except InputError as exc:
        msg = str(exc)
        assert msg.startswith(str(p)) and "\n" not in msg.strip()


@FUZZ
@given(text=st.one_of(
    st.text(max_size=200),
    st.builds(lambda m, op, ref, d: f'[[check]]\nmetric = {m}\nop = {op}\nref = {ref}\n'
              f'delta = {d}\n', st.sampled_from(['"hit_fraction"', '"nope"', "3", "[1]"]),
              st.sampled_from(['">="', '"=>"', "1"]), st.sampled_from(['"baseline"', "0.5",
                                                                      '"x"', "true"]),
              st.sampled_from(["0", "-1e9", '"a"', "nan", "inf"]))))
def test_fuzz_gate_parser(tmp_path_factory, text):
    p = tmp_path_factory.mktemp("g") / "g.toml"
    p.write_text(text)
    TRIED["gate"] += 1
    try:
        spec = load_gate_file(str(p))
        assert isinstance(spec, GateSpec) and spec.checks
    except InputError as exc:
        assert str(exc).startswith(str(p))


def test_fuzz_counts_reported():
    """Printed with -s, for the record of how many inputs were tried."""
    print(f"\nfuzz inputs tried: trace reader {TRIED['trace']}, gate parser {TRIED['gate']}")
    assert TRIED["trace"] >= min(EXAMPLES, 100) and TRIED["gate"] >= min(EXAMPLES, 100)


def test_atheris_targets_run(tmp_path):
    """The coverage-guided targets (tools/fuzz_atheris.py) run briefly here; at length by
    hand. atheris comes with the test extra on Linux."""
    import importlib.util
    import subprocess
    if importlib.util.find_spec("atheris") is None:
        if os.environ.get("CI"):
            raise AssertionError("atheris is in the test extra but not installed")
        import pytest
        pytest.skip("atheris not installed (pip install atheris)")
    runs = max(500, EXAMPLES * 5)
    for kind in ("trace", "gate"):
        proc = subprocess.run([sys.executable, str(Path(__file__).resolve().parents[2] / "tools" /
                                                   "fuzz_atheris.py"), kind, f"-runs={runs}",
                               "-seed=1"], capture_output=True, text=True, cwd=tmp_path,
                              timeout=600)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert f"Done {runs} runs" in proc.stderr, proc.stderr[-500:]
        assert not list(tmp_path.glob("crash-*"))


def test_huge_times_are_input_errors(tmp_path):
    """Found by the long fuzz run: 1.8e299 s overflowed the nanosecond conversion."""
    for field in ("t", "done_t", "priority_until"):
        lines = [dict(x) for x in VALID[:2]]
        lines[1][field] = 1.797693134862316e+299
        p = tmp_path / f"{field}.jsonl"
        p.write_text("".join(json.dumps(x) + "\n" for x in lines))
        try:
            validate_trace(str(p))
        except InputError as exc:
            assert f"{field}.jsonl:2: field '{field}'" in str(exc)
        else:
            raise AssertionError(f"{field} accepted")


def test_limits_are_clear_errors(tmp_path):
    for opt, val, needle in (("--max-blocks-per-request", 40, "more than the cap of 40"),
                             ("--max-in-flight", 2, "more than 2 requests admitted or waiting"),
                             ("--max-line-bytes", 1000, "line longer than 1000 bytes")):
        proc = psgate("replay", "--baseline", "lru", "--candidate", "lru",
                      "--out", tmp_path / "o", opt, val)
        assert_one_line_error(proc, 2, needle, opt)
        assert not (tmp_path / "o").exists()
    p = tmp_path / "t.jsonl"
    p.write_bytes(VALID_TEXT)
    try:
        validate_trace(str(p), limits=Limits(max_blocks_per_request=1))
    except InputError as exc:
        assert "t.jsonl:2: field 'blocks': 2 blocks in one request" in str(exc)
    else:
        raise AssertionError("the cap was not applied")


def test_soak_slice_every_policy_paranoid():
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
    from soak import soak
    from psgate.policies import policy_names
    counts = soak(60, seed=1000, policies=[n for n in policy_names()
                                           if not n.startswith("test-")], quiet=True)
    assert counts["traces"] == 60 and counts["violations"] == 0
    assert counts["evictions"] > 1000
