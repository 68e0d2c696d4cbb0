"""The CLI end to end: every exit code, outputs, determinism, the golden receipt."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from psgate.receipt.receipt import deterministic_part, dumps, validate_receipt

from helpers import ledger_csv, write_lines

ROOT = Path(__file__).resolve().parents[1]
GOLDEN_DIR = ROOT / "receipts" / "example"
GOLDEN_ARGS = ["--baseline", "lru", "--candidate", "prefixshield"]


def psgate(*args, cwd=None, env=None):
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "psgate.cli", *map(str, args)],
                          capture_output=True, text=True, cwd=cwd, env=e, timeout=300)


def assert_one_line_error(proc, code, *needles):
    assert proc.returncode == code, (proc.returncode, proc.stderr)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("psgate: error:"), lines[0]
    assert "Traceback" not in proc.stderr
    for n in needles:
        assert n in lines[0], lines[0]


def small_trace(tmp_path, name="t.jsonl", n=40, gap=0.01):
    lines = [{"psgate_trace": 1, "block_size": 4}]
    for i in range(n):
        lines.append({"t": round(i * gap, 3), "op": "request", "id": f"r{i}",
                      "group": "g" if i % 3 else "h", "contract": "standard", "scope": "m",
                      "blocks": [f"{i % 5:x}a", f"{i % 5:x}b", f"{i:x}c"], "tail": 1, "out": 2,
                      "role": "victim" if i % 3 else "attacker"})
    return write_lines(tmp_path, lines, name)


def test_exit_0_default_replay_writes_valid_receipt(tmp_path):
    proc = psgate("replay", "--baseline", "lru", "--candidate", "lru", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = tmp_path / "psgate-out"
    assert sorted(p.name for p in out.iterdir()) == ["ledger.compact.csv.gz", "receipt.json",
                                                     "requests.csv"]
    receipt = json.loads((out / "receipt.json").read_text())
    validate_receipt(receipt)
    assert receipt["trace"]["path"] == "bundled:example"
    assert receipt["config"]["usable_blocks"] == 511
    assert receipt["gate"]["result"] == "pass"
    assert receipt["runs"]["baseline"]["metrics"]["totals"]["evictions"] > 0
    summary = json.loads(proc.stdout)
    assert summary["gate"] == "pass"
    # ledger: eviction rows precede their admission row; a request's allocations (its
    # prompt, then each decode block) are its admit rows, so every admitted request has some
    assert receipt["config"]["ledger"] == {"rows": "all", "compression": "compact",
                                           "file": "ledger.compact.csv.gz", "level": 1}
    rows = ledger_csv(out).decode().splitlines()
    kinds = [r.split(",")[4] for r in rows[1:]]
    for run in ("baseline", "candidate"):
        admitted = {r.split(",")[5] for r in rows[1:]
                    if r.split(",")[0] == run and r.split(",")[4] == "admit"}
        assert len(admitted) == receipt["runs"][run]["counts"]["admitted"], run
    first_evict = kinds.index("evict")
    assert kinds[first_evict - 1] == "admit" and "admit" in kinds[first_evict:]


def test_exit_1_unexercised_trace_fails_closed(tmp_path):
    t = small_trace(tmp_path)
    proc = psgate("replay", "--baseline", "lru", "--candidate", "lru",
                  "--trace", t, "--capacity", 10000, "--out", tmp_path / "o")
    assert proc.returncode == 1, proc.stderr
    receipt = json.loads((tmp_path / "o" / "receipt.json").read_text())
    failed = [c["name"] for c in receipt["gate"]["checks"] if c["verdict"] == "fail"]
    assert failed == ["baseline invariant no_pinned_eviction", "baseline exercised eviction",
                      "candidate invariant no_pinned_eviction", "candidate exercised eviction"]
    proc = psgate("replay", "--baseline", "lru", "--candidate", "lru",
                  "--trace", t, "--capacity", 10000, "--out", tmp_path / "o2",
                  "--allow-unexercised")
    assert proc.returncode == 0, proc.stderr


def test_exit_1_gate_file_threshold(tmp_path):
    t = small_trace(tmp_path)
    gate = tmp_path / "gate.toml"
    gate.write_text('[[check]]\nmetric = "hit_fraction"\nselect = "role:victim"\nop = ">="\n'
                    'ref = "baseline"\ndelta = 0.05\n')
    proc = psgate("replay", "--baseline", "lru", "--candidate", "lru",
                  "--trace", t, "--capacity", 12, "--out", tmp_path / "o",
                  "--gate", gate)
    assert proc.returncode == 1, proc.stderr
    receipt = json.loads((tmp_path / "o" / "receipt.json").read_text())
    check = receipt["gate"]["checks"][-1]
    base = receipt["runs"]["baseline"]["metrics"]["roles"]["victim"]["hit_fraction"]
    assert check["threshold"] == pytest.approx(base + 0.05)
    assert check["observed"] == base and check["verdict"] == "fail"
    gate.write_text('[[check]]\nmetric = "hit_fraction"\nselect = "role:victim"\nop = ">="\n'
                    'ref = "baseline"\ndelta = -0.01\n')
    proc = psgate("replay", "--baseline", "lru", "--candidate", "lru",
                  "--trace", t, "--capacity", 12, "--out", tmp_path / "o2",
                  "--gate", gate)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("args, needles", [
    (["--baseline", "nope"], ["--baseline: policy 'nope': no such policy"]),
    (["--capacity", "1"], ["--capacity", "at least 2"]),
    (["--trace", "missing.jsonl"], ["missing.jsonl", "no such file"]),
    (["--trace", "bundled:nothing"], ["no bundled trace named 'nothing'"]),
    (["--engine", "tpu"], ["unknown engine 'tpu'"]),
    (["--cost-param", "fixed_ms"], ["--cost-param", "KEY=VALUE"]),
    (["--cost-param", "speed=3"], ["unknown cost-model parameter 'speed'"]),
    (["--cost-param", "fixed_ms=-1"], ["'fixed_ms' must be a number >= 0"]),
    (["--baseline-param", "x=1"], ["unknown parameter(s) for policy 'lru': x"]),
    (["--gate", "nope.toml"], ["nope.toml", "cannot read gate file"]),
])
def test_exit_2_bad_options(tmp_path, args, needles):
    proc = psgate("replay", "--baseline", "lru", "--candidate", "lru",
                  *args, "--out", tmp_path / "o", cwd=tmp_path)
    assert_one_line_error(proc, 2, *needles)
    assert not (tmp_path / "o").exists()


def test_exit_2_bad_trace_writes_nothing(tmp_path):
    t = small_trace(tmp_path)
    lines = t.read_text().splitlines()
    lines[30] = lines[30].replace('"tail": 1', '"tail": 9')
    t.write_text("\n".join(lines) + "\n")
    proc = psgate("replay", "--baseline", "lru", "--candidate", "lru",
                  "--trace", t, "--out", tmp_path / "o")
    assert_one_line_error(proc, 2, f"{t}:31: field 'tail'", "0..3")
    assert not (tmp_path / "o").exists()


def test_exit_2_bad_gate_file(tmp_path):
    gate = tmp_path / "g.toml"
    gate.write_text('[[check]]\nmetric = "speed"\nop = ">="\nref = 1\n')
    proc = psgate("replay", "--baseline", "lru", "--candidate", "lru",
                  "--gate", gate, "--out", tmp_path / "o")
    assert_one_line_error(proc, 2, "g.toml", "check[0].metric")
    gate.write_text("")
    proc = psgate("replay", "--baseline", "lru", "--candidate", "lru",
                  "--gate", gate, "--out", tmp_path / "o")
    assert_one_line_error(proc, 2, "at least one [[check]]")
    assert not (tmp_path / "o").exists()


def test_exit_2_usage_error():
    proc = psgate("replay", "--no-such-option")
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr


def test_exit_2_refuses_non_empty_out_dir(tmp_path):
    out = tmp_path / "o"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    proc = psgate("replay", "--baseline", "lru", "--candidate", "lru", "--out", out)
    assert_one_line_error(proc, 2, "not empty", "--force")
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]
    proc = psgate("replay", "--baseline", "lru", "--candidate", "lru", "--out", out, "--force")
    assert proc.returncode == 0
    assert (out / "notes.txt").read_text() == "keep me"
    assert (out / "receipt.json").exists()
    assert not [p for p in out.iterdir() if p.name.startswith(".psgate-staging")]


def test_validate_and_policies_commands(tmp_path):
    t = small_trace(tmp_path)
    proc = psgate("validate", t)
    assert proc.returncode == 0, proc.stderr
    s = json.loads(proc.stdout)
    assert s["requests"] == 40 and s["block_size"] == 4 and s["lines"] == 41
    assert s["distinct_blocks"] == 10 + 40
    proc = psgate("policies", "--json")
    assert proc.returncode == 0
    names = [p["name"] for p in json.loads(proc.stdout)["policies"]]
    assert "lru" in names


def test_deterministic_across_runs_and_hash_seeds(tmp_path):
    outs = []
    for i, seed in enumerate(["0", "12345"]):
        out = tmp_path / f"o{i}"
        proc = psgate("replay", "--baseline", "lru", "--candidate", "lru",
                      "--out", out, env={"PYTHONHASHSEED": seed})
        assert proc.returncode == 0, proc.stderr
        outs.append(out)
    for name in ("ledger.compact.csv.gz", "requests.csv"):
        assert (outs[0] / name).read_bytes() == (outs[1] / name).read_bytes()
    r0, r1 = (json.loads((o / "receipt.json").read_text()) for o in outs)
    assert r0["environment"]["out_dir"] != r1["environment"]["out_dir"]
    assert dumps(deterministic_part(r0)) == dumps(deterministic_part(r1))


def test_equivalent_trace_gives_identical_receipt_and_ledgers(tmp_path):
    """The same trace re-serialized (keys in reverse order, other spacing) is the same
    evidence: same canonical digest, byte-identical ledgers and receipt outside
    `environment` (which alone records the file's own SHA-256), and verify accepts
    either file for the other's receipt."""
    src = ROOT / "examples" / "example.jsonl"
    lines = [json.loads(x) for x in src.read_text().splitlines() if x.strip()]
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    shutil.copy(src, tmp_path / "a" / "t.jsonl")
    (tmp_path / "b" / "t.jsonl").write_text("".join(
        json.dumps(dict(reversed(list(obj.items()))), indent=None, separators=(" , ", " : "))
        + "\n" for obj in lines))
    assert (tmp_path / "a" / "t.jsonl").read_bytes() != (tmp_path / "b" / "t.jsonl").read_bytes()
    for d in ("a", "b"):
        proc = psgate("replay", *GOLDEN_ARGS, "--trace", "t.jsonl", "--out", "o", cwd=tmp_path / d)
        assert proc.returncode == 0, proc.stderr
    oa, ob = tmp_path / "a" / "o", tmp_path / "b" / "o"
    for name in ("ledger.compact.csv.gz", "requests.csv"):
        assert (oa / name).read_bytes() == (ob / name).read_bytes()
    ra, rb = (json.loads((o / "receipt.json").read_text()) for o in (oa, ob))
    assert ra["environment"]["trace_sha256"] != rb["environment"]["trace_sha256"]
    assert dumps(deterministic_part(ra)) == dumps(deterministic_part(rb))
    ver = psgate("verify", oa, "--trace", tmp_path / "b" / "t.jsonl")
    assert ver.returncode == 0, ver.stderr + ver.stdout
    other = tmp_path / "other.jsonl"
    other.write_text("".join(json.dumps(o) + "\n" for o in lines[:-1]))
    ver = psgate("verify", oa, "--trace", other)
    assert_one_line_error(ver, 2, "canonical digest")


def test_golden_receipt(request, tmp_path):
    """receipts/example is the committed example receipt; regenerate with --update-golden."""
    out = tmp_path / "o"
    proc = psgate("replay", *GOLDEN_ARGS, "--out", out, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    if request.config.getoption("--update-golden"):
        if GOLDEN_DIR.exists():
            shutil.rmtree(GOLDEN_DIR)
        shutil.copytree(out, GOLDEN_DIR)
        pytest.skip("golden receipt rewritten")
    got = json.loads((out / "receipt.json").read_text())
    want = json.loads((GOLDEN_DIR / "receipt.json").read_text())
    assert dumps(deterministic_part(got)) == dumps(deterministic_part(want))
    assert sorted(got["outputs"]) == ["ledger.compact.csv.gz", "requests.csv"]
    for name in got["outputs"]:
        assert (out / name).read_bytes() == (GOLDEN_DIR / name).read_bytes(), name


def test_ledger_level_option(tmp_path):
    """--ledger-level sets the zlib level of the ledger (the receipt records it, verify
    re-writes at it); outside 1..9 it is bad input."""
    out = tmp_path / "l9"
    proc = psgate("replay", *GOLDEN_ARGS, "--out", out, "--quiet", "--ledger-level", "9")
    assert proc.returncode == 0, proc.stderr
    ledger = json.loads((out / "receipt.json").read_text())["config"]["ledger"]
    assert ledger["level"] == 9
    assert (out / ledger["file"]).read_bytes()[8] == 2        # gzip's XFL: zlib's best
    ver = psgate("verify", out)
    assert ver.returncode == 0, ver.stdout + ver.stderr
    assert_one_line_error(psgate("replay", *GOLDEN_ARGS, "--out", tmp_path / "l0",
                                 "--ledger-level", "0"), 2, "--ledger-level")
    assert not (tmp_path / "l0").exists()


def test_ledger_volume_options(tmp_path):
    """--ledger-rows evictions keeps the eviction rows with their numbers; gzip output is
    deterministic and verify reads it; the receipt says which ledger it has."""
    import gzip
    full, small, gz = tmp_path / "full", tmp_path / "small", tmp_path / "gz"
    assert psgate("replay", *GOLDEN_ARGS, "--out", full, "--quiet", "--ledger-compression",
                  "none").returncode == 0
    assert psgate("replay", *GOLDEN_ARGS, "--out", small, "--quiet", "--ledger-rows",
                  "evictions", "--ledger-compression", "none").returncode == 0
    assert psgate("replay", *GOLDEN_ARGS, "--out", gz, "--quiet", "--ledger-compression",
                  "gzip").returncode == 0
    rows = (full / "ledger.csv").read_text().splitlines()
    evictions = [rows[0]] + [r for r in rows[1:] if r.split(",")[4] == "evict"]
    assert (small / "ledger.csv").read_text().splitlines() == evictions
    assert len(evictions) < len(rows)
    assert gzip.decompress((gz / "ledger.csv.gz").read_bytes()) == (full / "ledger.csv").read_bytes()
    assert not (gz / "ledger.csv").exists()
    r = json.loads((gz / "receipt.json").read_text())
    assert r["config"]["ledger"] == {"rows": "all", "compression": "gzip", "file": "ledger.csv.gz",
                                     "level": 1}
    assert json.loads((full / "receipt.json").read_text())["config"]["ledger"] == {
        "rows": "all", "compression": "none", "file": "ledger.csv"}
    assert "ledger.csv.gz" in r["outputs"]
    for d in (small, gz):
        ver = psgate("verify", d)
        assert ver.returncode == 0, ver.stdout + ver.stderr
    assert psgate("explain", gz, "--decision", "5").returncode == 0
    assert (psgate("explain", small, "--request", "a37").stdout
            == psgate("explain", full, "--request", "a37").stdout != "")
    again = tmp_path / "gz2"
    assert psgate("replay", *GOLDEN_ARGS, "--out", again, "--quiet", "--ledger-compression",
                  "gzip").returncode == 0
    assert (again / "ledger.csv.gz").read_bytes() == (gz / "ledger.csv.gz").read_bytes()
    # --force into a directory with the other format leaves no stale ledger behind.
    assert psgate("replay", *GOLDEN_ARGS, "--out", full, "--quiet", "--force",
                  "--ledger-compression", "gzip").returncode == 0
    assert not (full / "ledger.csv").exists()
    assert_one_line_error(psgate("replay", "--baseline", "lru", "--candidate", "lru",
                                 "--out", tmp_path / "x", "--ledger-rows", "some"),
                          2, "--ledger-rows")


# -- contracts files ----------------------------------------------------------------------
CONTRACTS_TOML = """version = 1
default = "best-effort"

[[groups]]
name = "g"
refill = 20.0
burst = 300.0
"""


def test_contracts_suggest_writes_a_file_that_replay_and_verify_use(tmp_path):
    trace = small_trace(tmp_path, n=120)
    first = psgate("contracts", "suggest", "--trace", trace, "--capacity", 16, "-o", "c.toml",
                   "--json", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    doc = json.loads(first.stdout)
    assert [g["group"] for g in doc["groups"]] == ["g", "h"]
    text = (tmp_path / "c.toml").read_text()
    again = psgate("contracts", "suggest", "--trace", trace, "--capacity", 16, "-o", "c.toml",
                   cwd=tmp_path)
    assert_one_line_error(again, 2, "c.toml", "--force")
    again = psgate("contracts", "suggest", "--trace", trace, "--capacity", 16, "-o", "c.toml",
                   "--force", cwd=tmp_path)
    assert again.returncode == 0 and (tmp_path / "c.toml").read_text() == text
    rep = psgate("replay", "--trace", trace, "--baseline", "lru", "--candidate",
                 "prefixshield", "--capacity", 16, "--contracts", "c.toml", "-o", "out",
                 "--allow-unexercised", cwd=tmp_path)
    assert rep.returncode in (0, 1), rep.stderr
    receipt = json.loads((tmp_path / "out" / "receipt.json").read_text())
    validate_receipt(receipt)
    assert receipt["config"]["contracts_file"]["path"] == "c.toml"
    assert receipt["config"]["contracts"] == ["@g", "@h", "best-effort", "critical", "standard"]
    with open(tmp_path / "out" / "requests.csv") as fh:
        assert {line.split(",")[4] for line in list(fh)[1:]} == {"@g", "@h"}
    ok = psgate("verify", "out", cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    # a receipt cannot be verified against another table
    shutil.copy(tmp_path / "c.toml", tmp_path / "orig.toml")
    (tmp_path / "c.toml").write_text(text.replace("version = 1", "version = 1\n# edited"))
    bad = psgate("verify", "out", cwd=tmp_path)
    assert_one_line_error(bad, 2, "c.toml", "SHA-256", "--contracts")
    ok = psgate("verify", "out", "--contracts", "orig.toml", cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr


@pytest.mark.parametrize("body, needle", [
    (CONTRACTS_TOML + '\n[[groups]]\nname = "g"\nrefill = 1.0\nburst = 2.0\n',
     "field 'groups[1].name': group 'g' is named twice (first in groups[0])"),
    (CONTRACTS_TOML.replace("20.0", "-1.0"), "field 'groups[0].refill': expected a finite"),
    (CONTRACTS_TOML.replace("20.0", "nan"), "found nan"),
    (CONTRACTS_TOML.replace("300.0", "0.5"), "field 'groups[0].burst': expected a finite burst"),
    (CONTRACTS_TOML.replace('"best-effort"', '"gold"'), "field 'default'"),
])
def test_a_bad_contracts_file_is_one_line_exit_2_and_nothing_written(tmp_path, body, needle):
    trace = small_trace(tmp_path)
    (tmp_path / "c.toml").write_text(body)
    proc = psgate("replay", "--trace", trace, "--baseline", "lru", "--candidate",
                  "prefixshield", "--contracts", "c.toml", "-o", "out", cwd=tmp_path)
    assert_one_line_error(proc, 2, "c.toml", needle)
    assert not (tmp_path / "out").exists()


def test_a_contracts_parameter_and_a_different_file_are_refused(tmp_path):
    trace = small_trace(tmp_path)
    (tmp_path / "c.toml").write_text(CONTRACTS_TOML)
    proc = psgate("replay", "--trace", trace, "--baseline", "lru", "--candidate",
                  "prefixshield", "--contracts", "c.toml", "--candidate-param",
                  'contracts={"standard": [1, 2]}', "-o", "out", cwd=tmp_path)
    assert_one_line_error(proc, 2, "--candidate-param", "disagree")


def test_matched_runs_carry_the_contracts_file_and_verify(tmp_path):
    (tmp_path / "c.toml").write_text(CONTRACTS_TOML.replace('"g"', '"victim"'))
    proc = psgate("replay", "--workload", "one-touch:attack_requests=40", "--runs", 2,
                  "--baseline", "lru", "--candidate", "prefixshield-b", "--contracts",
                  "c.toml", "-o", "exp", cwd=tmp_path)
    assert proc.returncode in (0, 1), proc.stderr
    top = json.loads((tmp_path / "exp" / "receipt.json").read_text())
    assert top["config"]["contracts_file"]["path"] == "c.toml"
    run = json.loads((tmp_path / "exp" / "runs" / "run-000" / "receipt.json").read_text())
    assert run["runs"]["candidate"]["metrics"]["groups"]
    assert run["config"]["candidate"]["params"]["contracts"]["@victim"] == [20.0, 300.0]
    ok = psgate("verify", "exp", cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr


@pytest.mark.parametrize("args, needle", [
    (["--history", "0"], "--history: expected a fraction in (0, 1]"),
    (["--window", "-1"], "--window: expected a finite number > 0"),
    (["--default", "gold"], "--default: expected one of best-effort, critical, standard"),
    (["--scheduler", "fifo"], "--scheduler"),
])
def test_contracts_suggest_bad_settings_are_one_line_exit_2(tmp_path, args, needle):
    trace = small_trace(tmp_path)
    proc = psgate("contracts", "suggest", "--trace", trace, "--capacity", 16, *args,
                  cwd=tmp_path)
    assert_one_line_error(proc, 2, needle)
