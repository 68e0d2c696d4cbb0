"""verify, explain, diff, --junit/--json/--quiet, and crash safety of replay outputs."""

from __future__ import annotations

import gzip
import json
import shutil
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET

import pytest

from psgate.trace.writer import write_trace
from psgate.workloads.paper import one_touch

from helpers import ledger_csv
from test_cli import assert_one_line_error, psgate


@pytest.fixture(scope="module")
def receipts(tmp_path_factory):
    d = tmp_path_factory.mktemp("r")
    for name, cand, extra in (("ps", "prefixshield", ()), ("lru", "lru", ()),
                              ("ps-service", "prefixshield", ("--scheduler", "service"))):
        proc = psgate("replay", "--baseline", "lru",
                      "--candidate", cand, "--out", d / name, "--quiet",
                      "--junit", d / f"{name}.xml", *extra)
        assert proc.returncode == 0, proc.stderr
    return d


def test_quiet_prints_no_table_and_junit_lists_every_check(receipts):
    tree = ET.parse(receipts / "ps.xml")
    cases = tree.getroot().findall(".//testcase")
    receipt = json.loads((receipts / "ps" / "receipt.json").read_text())
    assert [c.get("name") for c in cases] == [c["name"] for c in receipt["gate"]["checks"]]
    assert tree.getroot().get("failures") == "0"


def test_verify_identical_then_tampered(receipts, tmp_path):
    proc = psgate("verify", receipts / "ps")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["verified"] is True
    bad = tmp_path / "bad"
    shutil.copytree(receipts / "ps", bad)
    # an edit to the (default, compact) ledger, gzipped again as a forger would
    name = "ledger.compact.csv.gz"
    text = gzip.decompress((bad / name).read_bytes()).decode()
    assert "tenant-x" in text
    (bad / name).write_bytes(gzip.compress(text.replace("tenant-x", "tenant-a", 1).encode()))
    proc = psgate("verify", bad)
    assert proc.returncode == 1
    # the recorded SHA-256 names the changed file before any replay
    assert json.loads(proc.stdout)["first_difference"].startswith(f"{name}: SHA-256")
    shutil.copy(receipts / "ps" / name, bad / name)
    r = json.loads((bad / "receipt.json").read_text())
    r["runs"]["candidate"]["metrics"]["totals"]["evictions"] += 1
    (bad / "receipt.json").write_text(json.dumps(r))
    proc = psgate("verify", bad)
    assert proc.returncode == 1
    assert "/runs/candidate/metrics/totals/evictions" in json.loads(proc.stdout)["first_difference"]


def test_the_step_scheduler_is_the_default_and_a_service_receipt_verifies_as_recorded(
        receipts):
    """A receipt without config.scheduler was made under the service model: verify (and
    every re-simulation) runs it so, whatever the default; the default records its steps."""
    step = json.loads((receipts / "ps" / "receipt.json").read_text())["config"]
    service = json.loads((receipts / "ps-service" / "receipt.json").read_text())["config"]
    assert step["replay_model"].startswith("psgate replay model v2") and "scheduler" in step
    assert service["replay_model"].startswith("psgate replay model v1")
    assert "scheduler" not in service and "step_cost_model" not in service
    proc = psgate("verify", receipts / "ps-service")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads(proc.stdout)["verified"] is True


def test_verify_needs_the_same_trace(tmp_path):
    t = tmp_path / "ot.jsonl"
    write_trace(t, one_touch(attack_requests=20, warmup_s=1.0, cooldown_s=0.5))
    assert psgate("replay", "--baseline", "lru", "--candidate", "lru",
                  "--trace", t, "--out", tmp_path / "o", "--quiet").returncode == 0
    assert psgate("verify", tmp_path / "o").returncode == 0
    t.write_text(t.read_text().replace('"out":32', '"out":33', 1))
    proc = psgate("verify", tmp_path / "o")
    assert_one_line_error(proc, 2, "canonical digest", "--trace")
    proc = psgate("verify", tmp_path / "nothing")
    assert_one_line_error(proc, 2, "not a receipt directory")


def test_explain_eviction_and_request(receipts):
    # decision 223: the candidate run's first eviction, a cached output block (no trace hash)
    proc = psgate("explain", receipts / "ps", "--decision", "223", "--candidates")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "decision 223 (candidate run, policy prefixshield)" in out
    assert "(an output block, no trace hash, owned by tenant-x)" in out
    assert "largest projected normalized creation debt" in out
    assert "segments are emptied Probationary, then Normal, then Reuse" in out
    (victim,) = [ln for ln in out.splitlines() if ln.endswith("<- victim")]
    assert victim.split() == ["298", "block", "363", "tenant-x", "(output)", "<-", "victim"]
    n = int(out.split("All ")[1].split(" candidates")[0])
    ledger = ledger_csv(receipts / "ps").decode().splitlines()
    row = next(r for r in ledger if r.startswith("candidate,prefixshield,223,"))
    assert row.split(",")[11] == str(n)     # num_candidates column
    proc = psgate("explain", receipts / "lru", "--run", "baseline", "--request", "x5")
    assert proc.returncode == 0
    assert "least recently freed candidate" in proc.stdout
    assert "admission" in proc.stdout
    proc = psgate("explain", receipts / "ps", "--decision", "999999")
    assert_one_line_error(proc, 2, "--decision", "has no ledger row 999999")


def _relabelled(receipts, tmp_path, engine, name="ps"):
    """The prefixshield receipt as if another engine had made it (no recorded digest
    covers receipt.json itself)."""
    d = tmp_path / engine
    shutil.copytree(receipts / name, d)
    r = json.loads((d / "receipt.json").read_text())
    r["config"]["engine"] = engine
    (d / "receipt.json").write_text(json.dumps(r))
    return d


def test_a_real_engine_receipt_is_never_re_simulated_with_sim(receipts, tmp_path):
    real = _relabelled(receipts, tmp_path, "vllm")
    proc = psgate("explain", real, "--decision", "223", "--candidates")
    assert_one_line_error(proc, 2, "explain --candidates re-simulates", "engine 'vllm'",
                          "vllm-pool is proven equal to")
    proc = psgate("explain", real, "--decision", "223")     # the ledger alone: no replay
    assert proc.returncode == 0, proc.stderr
    proc = psgate("report", real, "-o", tmp_path / "real.html")
    assert proc.returncode == 0, proc.stderr
    page = (tmp_path / "real.html").read_text()
    assert "Times are observed on the real vLLM runtime, not modeled." in page
    assert "Times are modeled" not in page and "TTFT (ms, modeled)" not in page
    assert "No time series: drawing the time series re-simulates" in page
    assert 'id="plot-occupancy"' not in page
    pool = _relabelled(receipts, tmp_path, "vllm-pool", "ps-service")   # pool: service model
    proc = psgate("explain", pool, "--decision", "47", "--candidates")
    assert proc.returncode == 0 and "<- victim" in proc.stdout, proc.stderr
    proc = psgate("report", pool, "-o", tmp_path / "pool.html")
    assert proc.returncode == 0, proc.stderr
    page = (tmp_path / "pool.html").read_text()
    assert "Times are modeled by the cost model, not observed." in page
    assert "re-simulated with sim, which the conformance suite proves equal to vllm-pool" in page
    assert 'id="plot-occupancy"' in page


def test_diff_exit_codes(receipts, tmp_path):
    proc = psgate("diff", receipts / "ps", receipts / "ps")
    assert proc.returncode == 0 and json.loads(proc.stdout)["regressed"] is False
    gate = tmp_path / "g.toml"
    gate.write_text('[[check]]\nmetric = "hit_fraction"\nselect = "role:victim"\nop = ">="\n'
                    'ref = "baseline"\n')
    proc = psgate("diff", receipts / "ps", receipts / "lru", "--gate", gate,
                  "--junit", tmp_path / "d.xml")
    assert proc.returncode == 1, proc.stderr
    out = json.loads(proc.stdout)
    assert out["regressed"] and "config.candidate.name: 'prefixshield' -> 'lru'" in \
        out["config_changes"]
    assert ET.parse(tmp_path / "d.xml").getroot().get("failures") == "1"
    proc = psgate("diff", receipts / "lru", receipts / "ps", "--gate", gate)
    assert proc.returncode == 0


def test_diff_refuses_different_traces(receipts, tmp_path):
    t = tmp_path / "ot.jsonl"
    write_trace(t, one_touch(attack_requests=20, warmup_s=1.0, cooldown_s=0.5))
    assert psgate("replay", "--baseline", "lru", "--candidate", "lru",
                  "--trace", t, "--out", tmp_path / "o", "--quiet").returncode == 0
    proc = psgate("diff", receipts / "ps", tmp_path / "o")
    assert_one_line_error(proc, 2, "different traces", "--force")
    assert psgate("diff", receipts / "ps", tmp_path / "o", "--force").returncode == 0


def _big_trace(tmp_path):
    t = tmp_path / "big.jsonl"
    write_trace(t, one_touch(attack_requests=2000))
    return t


def test_sigkill_leaves_no_half_written_outputs(tmp_path):
    t = _big_trace(tmp_path)
    out = tmp_path / "o"
    proc = subprocess.Popen([sys.executable, "-m", "psgate.cli", "replay", "--trace", str(t),
                             "--out", str(out), "--baseline", "lru", "--candidate",
                             "prefixshield", "--quiet"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.time() + 60
    while time.time() < deadline and not any(out.glob(".psgate-staging-*/ledger*")):
        time.sleep(0.05)
    time.sleep(0.3)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    visible = [p.name for p in out.iterdir() if not p.name.startswith(".psgate")]
    assert visible == []      # no receipt, no ledger under their real names
    # and the next replay into it is not fooled by the leftovers
    proc = psgate("replay", "--baseline", "lru", "--candidate", "lru", "--out", out, "--quiet")
    assert proc.returncode == 0, proc.stderr


def test_sigint_exits_130_and_concurrent_writer_refused(tmp_path):
    t = _big_trace(tmp_path)
    out = tmp_path / "o"
    first = subprocess.Popen([sys.executable, "-m", "psgate.cli", "replay", "--trace", str(t),
                              "--out", str(out), "--quiet", "--baseline", "lru",
                              "--candidate", "lru"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while time.time() < deadline and not any(out.glob(".psgate-staging-*/ledger*")):
        time.sleep(0.05)
    second = psgate("replay", "--baseline", "lru", "--candidate", "lru",
                    "--trace", t, "--out", out, "--quiet")
    assert_one_line_error(second, 2, "another psgate is writing to this output directory")
    first.send_signal(signal.SIGINT)
    _, err = first.communicate(timeout=60)
    assert first.returncode == 130
    assert "interrupted; nothing was written" in err and "Traceback" not in err
    assert not out.exists()       # it created the directory, and removed it on the way out
