"""Hostile values: what the validator accepts replays; what it should refuse is refused.

Every refusal is exit 2 with one line on stderr naming the file, line or option and the
field; every value at an accepted limit replays cleanly under every policy. The command
line runs in-process (``psgate.cli.main``) so that the matrix stays fast.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import orjson
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from psgate import cli
from psgate.errors import InputError
from psgate.policies import policy_names
from psgate.trace import reader
from psgate.trace.reader import validate_trace
from psgate.trace.redact import pseudonym
from psgate.workloads import generate, generators

REPO = Path(__file__).resolve().parents[2]
BIG = 2**76
MAX_TIME_S = 4_000_000_000      # the stated limit on trace times (seconds)
HEADER = {"psgate_trace": 1, "block_size": 4}


@pytest.fixture
def run(capsys, monkeypatch):
    """``run(*args, env={})`` -> (exit code, stdout, stderr) of ``psgate ARGS``."""
    monkeypatch.setattr(cli.signal, "signal", lambda *a: None)

    def go(*args, env=None):
        for k, v in (env or {}).items():
            monkeypatch.setenv(k, v)
        if args[0] in ("replay", "sweep"):
            for option in ("--baseline", "--candidate"):
                if option not in args:
                    args = (*args, option, "lru")
        monkeypatch.setattr(sys, "argv", ["psgate", *map(str, args)])
        code = 0
        try:
            cli.main()
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        out, err = capsys.readouterr()
        return code, out, err
    return go


def refused(result, *needles):
    code, _, err = result
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2, (code, err)
    assert len(lines) == 1 and lines[0].startswith("psgate: error: "), err
    for n in needles:
        assert n in lines[0], (n, lines[0])


def req(i, t, **extra):
    return {"t": t, "op": "request", "id": f"r{i}", "group": f"g{i % 3}",
            "contract": "standard", "scope": "", "blocks": [f"{i % 4:x}a", f"{i:x}b"],
            "tail": 1, "out": 2, **extra}


def write(path: Path, lines) -> Path:
    path.write_bytes(b"".join((x if isinstance(x, bytes) else orjson.dumps(x)) + b"\n"
                              for x in lines))
    return path


# -- 4: times a replay can hold -----------------------------------------------------------

@pytest.mark.parametrize("field, line", [
    ("t", req(0, 9.3e9)),
    ("t", req(0, MAX_TIME_S + 1)),
    ("done_t", req(0, 1.0, done_t=9.3e9)),
    ("priority_until", req(0, 1.0, priority=1, priority_until=1e12)),
])
def test_times_beyond_the_limit_are_refused(run, tmp_path, field, line):
    p = write(tmp_path / "t.jsonl", [HEADER, line])
    refused(run("validate", p), f"{p}:2: field '{field}'", "4e+09")
    refused(run("replay", "--trace", p, "--out", tmp_path / "o"), f"{p}:2: field '{field}'")


def test_the_time_limit_is_stated_in_both_schemas():
    for p in (REPO / "schemas" / "trace.schema.json",
              REPO / "psgate" / "data" / "schemas" / "trace.schema.json"):
        time = json.loads(p.read_text())["$defs"]["time"]
        assert time["maximum"] == MAX_TIME_S == reader.MAX_TIME_S
    assert (REPO / "schemas" / "trace.schema.json").read_bytes() == (
        REPO / "psgate" / "data" / "schemas" / "trace.schema.json").read_bytes()


def test_times_at_the_limit_replay_under_every_policy(run, tmp_path):
    n = 30
    lines = [HEADER] + [req(i, MAX_TIME_S - n + i, priority=i % 3, priority_until=MAX_TIME_S,
                            **({"done_t": MAX_TIME_S} if i % 4 == 0 else {}))
                        for i in range(n)]
    lines.append({"t": MAX_TIME_S, "op": "cancel", "id": "r1"})
    p = write(tmp_path / "limit.jsonl", lines)
    assert run("validate", p)[0] == 0
    for policy in policy_names():
        code, out, err = run("replay", "--trace", p, "--candidate", policy, "--capacity", 5,
                             "--allow-unexercised", "--quiet", "--out", tmp_path / policy,
                             "--cost-param", "fixed_ms=1e6", "--cost-param",
                             "per_output_token_ms=1e6")
        assert code in (0, 1), (policy, err)
        assert "Traceback" not in err and "Error" not in err, (policy, err)
        receipt = json.loads((tmp_path / policy / "receipt.json").read_text())
        assert receipt["runs"]["candidate"]["aborted"] is None, policy


# -- 6: gate thresholds -------------------------------------------------------------------

@pytest.mark.parametrize("key, value, op", [
    ("ref", "nan", "!="), ("ref", "inf", "<"), ("ref", "-inf", ">"), ("ref", str(BIG), "!="),
    ("ref", "1e16", "<"), ("delta", "nan", "<"), ("delta", "inf", ">="),
])
def test_gate_thresholds_must_be_finite_and_sane(run, tmp_path, key, value, op):
    g = tmp_path / "g.toml"
    body = {"ref": "0.5", "delta": "0"} | {key: value}
    g.write_text(f'[[check]]\nmetric = "hit_fraction"\nop = "{op}"\nref = {body["ref"]}\n'
                 f'delta = {body["delta"]}\n')
    refused(run("replay", "--gate", g, "--out", tmp_path / "o", "--quiet"),
            f"{g}: field 'check[0].{key}'", "finite")
    assert not (tmp_path / "o" / "receipt.json").exists()


def test_gate_schemas_bound_the_thresholds():
    for p in (REPO / "schemas" / "gate.schema.json",
              REPO / "psgate" / "data" / "schemas" / "gate.schema.json"):
        props = json.loads(p.read_text())["properties"]["check"]["items"]["properties"]
        assert props["delta"]["maximum"] == 1e15 and props["delta"]["minimum"] == -1e15
        number = [x for x in props["ref"]["oneOf"] if x.get("type") == "number"][0]
        assert number["maximum"] == 1e15 and number["minimum"] == -1e15


# -- 7: corpus entries --------------------------------------------------------------------

def _corpus(tmp_path: Path) -> Path:
    d = tmp_path / "corpus"
    d.mkdir()
    for name in ("a.jsonl", "b.jsonl"):
        write(d / name, [HEADER] + [req(i, i * 0.1) for i in range(12)])
    return d


@pytest.mark.parametrize("kind", ["dangling", "loop", "directory"])
def test_corpus_entries_that_are_not_trace_files_are_errors(run, tmp_path, kind):
    from psgate.sweep import SweepConfig, cells

    d = _corpus(tmp_path)
    bad = d / "c-incident.jsonl"
    if kind == "dangling":
        bad.symlink_to(d / "gone.jsonl")
    elif kind == "loop":
        bad.symlink_to(bad)
    else:
        bad.mkdir()
    refused(run("replay", "--trace", d, "--out", tmp_path / "o", "--resamples", 100),
            str(bad), "corpus entry")
    assert not (tmp_path / "o").exists()
    with pytest.raises(InputError, match="corpus entry") as exc:     # a sweep's corpus too
        cells(SweepConfig(workload=None, corpus=d, out=tmp_path / "s"))
    assert str(bad) in str(exc.value)


# -- 10: writers write only what psgate reads ---------------------------------------------

@pytest.mark.parametrize("row, field, needle", [
    ({"timestamp": 1e300}, "timestamp", "4e+09"),
    ({"timestamp": 5e12}, "timestamp", "4e+09"),
    ({"output_length": 2**53 + 1}, "output_length", "2^53"),
])
def test_mooncake_import_refuses_what_a_trace_cannot_hold(run, tmp_path, row, field, needle):
    src = write(tmp_path / "mc.jsonl", [{"timestamp": 5, "input_length": 10,
                                         "output_length": 1, "hash_ids": [1]} | row])
    out = tmp_path / "out.jsonl"
    refused(run("trace", "import", src, "-o", out, "--format", "mooncake"),
            f"{src}:1: field '{field}'", needle)
    assert not out.exists()


def test_import_refuses_a_block_size_a_trace_cannot_hold(run, tmp_path):
    src = write(tmp_path / "mc.jsonl", [{"timestamp": 5, "input_length": 10,
                                         "output_length": 1, "hash_ids": [1]}])
    refused(run("trace", "import", src, "-o", tmp_path / "o.jsonl", "--format", "mooncake",
                "--option", "native_block_size=1000000"), "--native-block-size", "65536")


def test_bailian_and_weka_imports_refuse_huge_times(run, tmp_path):
    src = write(tmp_path / "bl.jsonl", [
        {"chat_id": 1, "timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]},
        {"chat_id": 2, "timestamp": 1e300, "input_length": 10, "output_length": 1,
         "hash_ids": [1]}])
    refused(run("trace", "import", src, "-o", tmp_path / "o.jsonl", "--format", "bailian"),
            f"{src}:2: field 'timestamp'")
    wk = tmp_path / "wk"
    wk.mkdir()
    (wk / "s.json").write_text(json.dumps({"block_size": 64, "requests": [
        {"t": 1e300, "model": "m", "in": 10, "out": 1, "hash_ids": []}]}))
    refused(run("trace", "import", wk, "-o", tmp_path / "o.jsonl", "--format", "weka"),
            "field 'requests[0].t'")


def test_redact_refuses_times_beyond_the_limit(run, tmp_path):
    raw = write(tmp_path / "raw.jsonl", [{"t": 5e9, "group": "a", "contract": "standard",
                                          "prompt_token_ids": [1, 2, 3]}])
    refused(run("trace", "redact", raw, "-o", tmp_path / "o.jsonl", "--unkeyed"),
            f"{raw}:1: field 't'")
    refused(run("trace", "redact", raw, "-o", tmp_path / "o.jsonl", "--unkeyed",
                "--block-size", 1_000_000), "--block-size", "65536")


@pytest.mark.parametrize("param, needle", [
    ("block_size=0", "block_size"), ("block_size=1000000", "block_size"),
    ("requests=-5", "'requests' must be >= 0"), ("groups=0", "give no trace"),
    ("cancel_fraction=-0.5", "'cancel_fraction' must be >= 0"),
])
def test_generator_params_that_give_no_valid_trace_are_refused(run, tmp_path, param, needle):
    out = tmp_path / "o.jsonl"
    refused(run("trace", "gen", "random", "-o", out, "--param", param), "--param", needle)
    assert not out.exists()


def test_a_generator_line_the_reader_refuses_is_never_written():
    lines = [HEADER, req(0, 1.0), req(1, 2e10)]
    with pytest.raises(InputError, match=r"^out:3: field 't': expected a time in 0\.\.4e\+09"):
        reader.check_lines(lines, "out")


def _in_range(default):
    """Values around a parameter's default: what a user tuning it would try."""
    if type(default) is bool:
        return st.booleans()
    if type(default) is int:
        return st.integers(max(0, default // 2), max(2, default * 2))
    if type(default) is float:
        return st.floats(default * 0.5, max(default * 2, 0.01), allow_nan=False)
    return st.just(default)


@st.composite
def _workload(draw):
    kind = draw(st.sampled_from(sorted(generators())))
    defaults = generators()[kind].defaults
    params = {"seed": draw(st.integers(0, 2**32))}
    for key, d in defaults.items():
        if key not in ("seed", "block_size") and draw(st.integers(0, 3)) == 0:
            params[key] = draw(_in_range(d))
    if draw(st.booleans()):
        params["block_size"] = draw(st.sampled_from([1, 4, 16, 32]))
    return kind, params


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_workload())
@example(("random", {"seed": 0, "block_size": 1}))      # once an empty prompt or a tail of 1
@example(("borrowing", {"seed": 0, "block_size": 1}))
def test_generated_traces_always_validate(tmp_path_factory, wl):
    kind, params = wl
    try:
        lines = generate(kind, params)
    except InputError as exc:          # a refusal is one clean line naming the parameter
        assert "\n" not in str(exc) and "--param" in str(exc), str(exc)
        return
    p = tmp_path_factory.mktemp("gen") / "t.jsonl"
    write(p, lines)
    validate_trace(str(p))


@settings(max_examples=20, deadline=None)
@given(kind=st.sampled_from(sorted(generators())), seed=st.integers(0, 2**53 - 1))
def test_every_seed_gives_a_valid_trace(tmp_path_factory, kind, seed):
    p = tmp_path_factory.mktemp("seed") / "t.jsonl"
    write(p, generate(kind, {"seed": seed}))
    validate_trace(str(p))


# -- 12: one key format -------------------------------------------------------------------

def _raw_log(tmp_path: Path) -> Path:
    return write(tmp_path / "raw.jsonl", [
        {"t": 0.5, "id": "a", "group": "acme-corp", "contract": "standard",
         "prompt_token_ids": list(range(40)), "out": 3}])


def test_key_file_and_environment_give_the_same_hashes(run, tmp_path):
    raw = _raw_log(tmp_path)
    key = bytes(range(32)).hex()
    (tmp_path / "k").write_text(f"  {key}\n")
    assert run("trace", "redact", raw, "-o", tmp_path / "f.jsonl", "--key-file",
               tmp_path / "k")[0] == 0
    assert run("trace", "redact", raw, "-o", tmp_path / "e.jsonl",
               env={"PSGATE_HASH_KEY": key})[0] == 0
    assert (tmp_path / "f.jsonl").read_bytes() == (tmp_path / "e.jsonl").read_bytes()


@pytest.mark.parametrize("content, needle", [
    (b"0123456789abcdef-raw-bytes-key", "not hex digits"),
    (b"00" * 15, "found 15 bytes"),
    (b"00" * 65, "found 65 bytes"),
    (b"\xff" * 40, "non-ASCII"),
])
def test_key_files_hold_hex_only(run, tmp_path, content, needle):
    (tmp_path / "k").write_bytes(content)
    refused(run("trace", "redact", _raw_log(tmp_path), "-o", tmp_path / "o.jsonl",
                "--key-file", tmp_path / "k"), str(tmp_path / "k"), needle)
    refused(run("trace", "redact", _raw_log(tmp_path), "-o", tmp_path / "o.jsonl",
                env={"PSGATE_HASH_KEY": content.decode("latin-1")}), "$PSGATE_HASH_KEY",
            needle if content.isascii() else "not hex digits")


def test_capture_key_file_uses_the_same_format(tmp_path, monkeypatch):
    from psgate import vllm_plugin

    key = bytes(range(16, 48))
    (tmp_path / "k").write_text(key.hex() + "\n")
    monkeypatch.delenv("PSGATE_HASH_KEY", raising=False)
    monkeypatch.setenv("PSGATE_CAPTURE_KEY_FILE", str(tmp_path / "k"))
    assert vllm_plugin._capture_key() == key
    (tmp_path / "k").write_bytes(key)
    with pytest.raises(InputError, match="hex"):
        vllm_plugin._capture_key()


def test_unkeyed_warns_that_tenant_names_are_guessable(run, tmp_path):
    code, _, err = run("trace", "redact", _raw_log(tmp_path), "-o", tmp_path / "o.jsonl",
                       "--unkeyed")
    assert code == 0
    assert "warning" in err and "tenant" in err, err
    group = json.loads((tmp_path / "o.jsonl").read_text().splitlines()[1])["group"]
    assert group == pseudonym("g", "acme-corp", None) == "g-33f6b2a834a4"


# -- 13: other values ---------------------------------------------------------------------

def test_cost_params_must_be_finite_and_sane(run, tmp_path):
    refused(run("replay", "--out", tmp_path / "o", "--cost-param", "fixed_ms=1e308"),
            "--cost-param", "fixed_ms")
    refused(run("replay", "--out", tmp_path / "o", "--cost-param", "origin=1"),
            "--cost-param", "origin")


@pytest.mark.parametrize("args, needle", [
    (["trace", "gen", "random", "--seed", BIG], "--seed"),
    (["replay", "--workload", "random", "--runs", 2, "--seed", BIG], "--seed"),
    (["replay", "--workload", "random", "--runs", 2, "--bootstrap-seed", BIG],
     "--bootstrap-seed"),
    (["sweep", "--workload", "random", "--runs", 2, "--seed", BIG], "--seed"),
])
def test_seeds_beyond_json_numbers_are_refused(run, tmp_path, args, needle):
    out = ["-o", tmp_path / "t.jsonl"] if args[0] == "trace" else ["--out", tmp_path / "o"]
    refused(run(*args, *out), needle, "2^53")


def test_non_utf8_file_names_are_refused(run, tmp_path):
    bad = os.fsdecode(bytes(tmp_path) + b"/bad\xff.jsonl")
    write(Path(bad), [HEADER, req(0, 0.0)])
    refused(run("validate", bad), "not valid UTF-8")
    refused(run("replay", "--trace", bad, "--out", tmp_path / "o"), "not valid UTF-8")
    refused(run("trace", "gen", "random", "-o", os.fsdecode(bytes(tmp_path) + b"/o\xff")),
            "--output", "not valid UTF-8")
    refused(run("replay", "--out", os.fsdecode(bytes(tmp_path) + b"/out\xff")), "--out",
            "not valid UTF-8")


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity", "nan"])
def test_policy_params_must_be_finite_numbers(run, tmp_path, value):
    refused(run("replay", "--candidate", "prefixshield", "--candidate-param", f"eps={value}",
                "--out", tmp_path / "o"), "prefixshield", "eps")


@pytest.mark.parametrize("lines, line, field", [
    ([b'{"psgate_trace": 1, "block_size": 4, "block_size": 8}'], 1, "block_size"),
    ([orjson.dumps(HEADER),
      b'{"t": 0, "op": "request", "id": "a", "group": "g", "contract": "c", "scope": "",'
      b' "blocks": ["ab"], "tail": 0, "out": 1, "out": 7}'], 2, "out"),
    ([b'{"psgate_trace": 1, "block_size": 4, "groups": {"g": {"contracts": ["c"],'
      b' "contracts": ["d"]}}}'], 1, "contracts"),
])
def test_duplicate_keys_are_refused(run, tmp_path, lines, line, field):
    p = write(tmp_path / "d.jsonl", lines)
    refused(run("validate", p), f"{p}:{line}: field '{field}'", "duplicate key")


def test_duplicate_keys_in_a_receipt_are_refused(run, tmp_path):
    out = tmp_path / "o"
    assert run("replay", "--out", out, "--quiet")[0] in (0, 1)
    p = out / "receipt.json"
    text = p.read_text()
    p.write_text(text.replace("{", '{"psgate_receipt": 1, ', 1))
    refused(run("verify", out), f"{p}: field 'psgate_receipt'", "duplicate key")


def test_validate_takes_the_replay_caps(run, tmp_path):
    p = write(tmp_path / "t.jsonl", [HEADER, req(0, 0.0)])
    refused(run("validate", p, "--max-line-bytes", 40), f"{p}:2", "--max-line-bytes")
    refused(run("validate", p, "--max-blocks-per-request", 1), f"{p}:2: field 'blocks'")
    refused(run("validate", p, "--max-line-bytes", BIG), "--max-line-bytes")
    assert run("validate", p, "--max-line-bytes", 4096)[0] == 0


def test_integers_beyond_json_numbers_are_refused(run, tmp_path):
    p = write(tmp_path / "t.jsonl", [HEADER, req(0, 0.0, priority=2**53)])
    refused(run("validate", p), f"{p}:2: field 'priority'")


# -- issue 52: crashes and unbounded reads become one line, exit 2 ---------------------------

INCIDENT = REPO / "examples" / "ci" / "incident.jsonl"
GATE = REPO / "examples" / "ci" / "gate.toml"


def psgate_proc(*args, cwd=None, env=None, timeout=60):
    """``psgate ARGS`` in a subprocess with a deadline: for what could hang or fill memory
    if the check it tests were gone."""
    import subprocess
    e = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-m", "psgate.cli", *map(str, args)],
                          capture_output=True, text=True, cwd=cwd, env=e, timeout=timeout)


def replay_args(tmp_path, *extra):
    return ("replay", "--trace", INCIDENT, "--baseline", "lru", "--candidate", "prefixshield",
            "--quiet", "--out", tmp_path / "o", *extra)


@pytest.mark.parametrize("extra, needles", [
    (("--capacity", 2**63), ("--capacity", "at most 2147483647")),
    (("--capacity", 2**31), ("--capacity", "at most 2147483647")),
    (("--capacity", 4194305), ("--capacity", "'prefixshield'", "at most 4194303")),
    (("--capacity", 4194305, "--candidate", "s3fifo"), ("--capacity", "'s3fifo'", "4194303")),
    (("--capacity", 4194305, "--baseline", "leaf-lru"), ("--capacity", "'leaf-lru'")),
    (("--min-requests", 10**20), ("--min-requests", "9007199254740991")),
    (("--min-requests-ttft", 10**20), ("--min-requests-ttft",)),
    (("--tolerance-hit", 2), ("--tolerance-hit", "0..1", "[defaults] tolerance_hit")),
    (("--tolerance-ttft", 1e7), ("--tolerance-ttft",)),
    (("--candidate-param", "eps=-1"), ("--candidate", "'eps' must be >= 0")),
    (("--candidate", "static-quota", "--candidate-param", "shares=[1]"),
     ("--candidate", "'shares' must map")),
    (("--candidate", "static-quota", "--candidate-param", 'shares={"tenant-a": -1}'),
     ("--candidate", "'shares' must map")),
    (("--candidate", "static-quota", "--candidate-param", 'shares={"tenant-a": 5000}'),
     ("'shares' add up to 5000 blocks",)),
])
def test_replay_values_past_a_limit_are_one_line(tmp_path, extra, needles):
    # In a subprocess: before the fix a capacity of 2^31 allocated for 20 s and more.
    proc = psgate_proc(*replay_args(tmp_path, *extra))
    refused((proc.returncode, proc.stdout, proc.stderr), *needles)
    assert not (tmp_path / "o").exists()


def test_the_gate_file_and_the_options_share_their_bounds(run, tmp_path):
    gate = tmp_path / "g.toml"
    gate.write_text("[defaults]\nmin_requests = 99999999999999999999\n")
    refused(run(*replay_args(tmp_path, "--gate", gate)), str(gate),
            "defaults.min_requests", "9007199254740991")
    gate.write_text("[defaults]\ntolerance_hit = 2\n")
    refused(run(*replay_args(tmp_path, "--gate", gate)), "defaults.tolerance_hit")
    assert run(*replay_args(tmp_path, "--tolerance-hit", 1, "--min-requests",
                            2**53 - 1))[0] in (0, 1)


def test_a_deeply_nested_gate_file_is_bad_input(run, tmp_path):
    gate = tmp_path / "deep.toml"
    gate.write_text("a = " + "[" * 5000 + "]" * 5000 + "\n")
    refused(run(*replay_args(tmp_path, "--gate", gate)), str(gate), "nested too deeply")


def test_an_output_directory_in_a_symlink_loop_is_bad_input(run, tmp_path):
    (tmp_path / "l1").symlink_to(tmp_path / "l2")
    (tmp_path / "l2").symlink_to(tmp_path / "l1")
    refused(run("replay", "--trace", INCIDENT, "--quiet", "--out", tmp_path / "l1"),
            "l1", "symbolic link loop")


@pytest.mark.parametrize("what", ["gate", "key", "cost-model"])
def test_small_input_files_have_a_size_cap(run, tmp_path, what):
    big = tmp_path / "big"
    with open(big, "wb") as fh:          # sparse: the cap is read from the size, not the bytes
        fh.truncate(64 << 20)
    if what == "gate":
        result = run(*replay_args(tmp_path, "--gate", big))
        cap = "1048576"
    elif what == "key":
        result = run("trace", "redact", INCIDENT, "-o", tmp_path / "r.jsonl", "--key-file", big)
        cap = "4096"
    else:
        result = run(*replay_args(tmp_path, "--cost-model", big))
        cap = str(16 << 20)
    refused(result, str(big), f"at most {cap} bytes")


def test_redact_reads_its_log_line_by_line_with_the_trace_cap(tmp_path):
    log = tmp_path / "raw.jsonl"
    with open(log, "wb") as fh:          # one line of 40 MB, no newline
        fh.truncate(40 << 20)
    proc = psgate_proc("trace", "redact", log, "-o", tmp_path / "r.jsonl", "--unkeyed")
    refused((proc.returncode, proc.stdout, proc.stderr), f"{log}:1", "line longer than 8388608")


@pytest.mark.parametrize("param, needles", [
    ("attack_gap_s=1e-9", ("'attack_gap_s'", "at most 2000000")),
    ("attack_blocks=10000000", ("'attack_blocks'", "1048576")),
    ("attack_blocks=1000000", ("33554432",)),
    ("duration_s=1e12", ("duration_s",)),
])
def test_generator_parameters_are_bounded_by_what_a_trace_holds(tmp_path, param, needles):
    proc = psgate_proc("trace", "gen", "example", "-o", tmp_path / "x.jsonl", "--param", param)
    refused((proc.returncode, proc.stdout, proc.stderr), "--param", *needles)
    assert not (tmp_path / "x.jsonl").exists()


def test_out_of_memory_advice_fits_the_command(run, tmp_path, monkeypatch):
    import psgate.workloads as workloads

    def boom(*a, **k):
        raise MemoryError
    monkeypatch.setattr(workloads, "_check_size", boom)
    code, _, err = run("trace", "gen", "example", "-o", tmp_path / "x.jsonl")
    assert code == 2 and "out of memory" in err and "--capacity" not in err, err
    assert "generator" in err
    monkeypatch.setattr(cli.api, "replay", boom)
    code, _, err = run(*replay_args(tmp_path))
    assert code == 2 and "out of memory; lower --capacity" in err, err


@pytest.mark.parametrize("args, needles", [
    (("replay", "--bogus"), ("psgate replay", "No such option: --bogus")),
    (("replay", "--capacity", "abc"), ("psgate replay", "'--capacity'")),
    (("trace", "gen"), ("psgate trace gen", "Missing argument")),
    (("no-such-command",), ("No such command",)),
])
def test_usage_errors_are_one_line(run, args, needles):
    refused(run(*args), *needles)


def test_help_is_still_help(run):
    code, out, _ = run("replay", "--help")
    assert code == 0 and "Usage:" in out and "replay [OPTIONS]" in out and "--capacity" in out


def test_a_crash_is_exit_4_never_1(run, tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", None)

    def boom(*a, **k):
        raise RuntimeError("injected")
    monkeypatch.setattr(cli.api, "replay", boom)
    code, _, err = run(*replay_args(tmp_path))
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 4 and len(lines) == 1, err
    assert "psgate bug" in lines[0] and "RuntimeError: injected" in lines[0]
    (tb,) = tmp_path.glob("psgate-traceback-*.txt")
    assert str(tb) in lines[0] and "RuntimeError: injected" in tb.read_text()
    code, _, err = run(*replay_args(tmp_path), env={"PSGATE_DEBUG": "1"})
    assert code == 4 and "Traceback (most recent call last)" in err
    assert err.strip().splitlines()[-1].startswith("psgate: internal error")


def test_a_capacity_the_machine_cannot_hold_is_refused_before_any_work(tmp_path, monkeypatch):
    """lru at 2,000,000,000 blocks was killed by the kernel's OOM killer after 57 s at
    24 GB (SIGKILL: no message, no exit code of psgate's). The floor of about 100 bytes a
    configured block against the machine's memory refuses it at once."""
    from psgate import api
    from psgate.policies import resolve
    sources = {"baseline": resolve("lru", "--baseline"),
               "candidate": resolve("lru", "--candidate")}
    monkeypatch.setattr(api, "physical_memory", lambda: 2**30)          # a 1 GiB machine
    with pytest.raises(InputError) as exc:
        api.check_capacity(20_000_000, sources)                         # about 1.9 GiB
    assert "--capacity" in str(exc.value) and "1.0 GiB" in str(exc.value)
    api.check_capacity(5_000_000, sources)                              # about 0.5 GiB: fits
    monkeypatch.setattr(api, "physical_memory", lambda: None)           # the platform won't say
    api.check_capacity(20_000_000, sources)
