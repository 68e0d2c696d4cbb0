"""psgate bench --quick --json: the output's format only (no timing is asserted)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from psgate.bench import render

TARGETS = ["e2e_vs_vllm", "hot_vs_vllm", "core_vs_python", "core_vs_python_mooncake",
           "step_vs_service_hot", "ps_lru_hot", "ps_lru_e2e", "select_4096",
           "select_growth", "mem_lru", "mem_ps", "cold_hot", "cold_e2e", "policy_lru_e2e",
           "mem_groups", "mem_requests"]


@pytest.fixture(scope="module")
def bench_run():
    proc = subprocess.run([sys.executable, "-m", "psgate.cli", "bench", "--quick", "--json",
                           "--policy", "leaf-lru"],
                          capture_output=True, text=True, timeout=600, env=dict(os.environ))
    assert proc.returncode == 0, proc.stderr
    return proc


def test_json_is_one_object_on_stdout(bench_run):
    lines = [ln for ln in bench_run.stdout.splitlines() if ln.strip()]
    assert len(lines) == 1
    result = json.loads(lines[0])
    assert result["psgate_bench"] == 1 and result["quick"] is True
    assert result["repeats"] >= 1


def _result(bench_run) -> dict:
    return json.loads(bench_run.stdout)


def test_targets(bench_run):
    result = _result(bench_run)
    targets = result["targets"]
    assert [t["id"] for t in targets] == TARGETS
    for t in targets:
        assert t["op"] in (">=", "<=") and t["threshold"] > 0
        assert t["result"] in ("PASS", "MISS", "SKIP")
        if t["result"] == "SKIP":
            assert t["ratio_min"] is None and t["note"]
        else:
            assert t["ratio_min"] > 0 and t["ratio_median"] > 0
            ok = (t["ratio_min"] >= t["threshold"] if t["op"] == ">="
                  else t["ratio_min"] <= t["threshold"])
            assert t["result"] == ("PASS" if ok else "MISS")
    by_id = {t["id"]: t for t in targets}
    assert by_id["select_growth"]["result"] == "SKIP"      # full run only
    assert by_id["core_vs_python_mooncake"]["result"] == "SKIP"     # needs --mooncake
    assert by_id["policy_lru_e2e"]["result"] != "SKIP"             # --policy was given
    assert "us per eviction over lru's" in by_id["policy_lru_e2e"]["note"]
    assert result["details"]["policy"]["spec"] == "leaf-lru"
    assert result["replay_code"] in ("compiled", "python")
    # the compiled core measured against the Python engine whenever it is built
    assert (by_id["core_vs_python"]["result"] == "SKIP") == (result["replay_code"] == "python")
    if result["vllm"]["version"] is None:
        assert result["vllm"]["note"]
        assert by_id["e2e_vs_vllm"]["note"] == result["vllm"]["note"]
        assert by_id["hot_vs_vllm"]["result"] == "SKIP"


def test_measurements(bench_run):
    result = _result(bench_run)
    m = result["measurements"]
    for key in ("reuse_hot_lru", "reuse_e2e_lru", "reuse_hot_prefixshield",
                "reuse_e2e_prefixshield", "cold_hot_lru", "cold_e2e_prefixshield",
                "select_4096_lru", "select_4096_prefixshield"):
        x = m[key]
        assert x["unit"] in ("s", "us") and x["what"]
        assert len(x["values"]) == x["n"] == result["repeats"]
        assert 0 < x["min"] == min(x["values"]) <= x["median"] <= max(x["values"])
    for pol in ("lru", "prefixshield"):
        d = result["details"][f"select_4096_{pol}"]
        assert d["victims"] > 0 and d["invariants_hold"]
        assert result["details"][f"reuse_{pol}"]["waits"] == 0   # traces never wait
    assert result["details"]["select_4096_prefixshield"]["groups_in_debt_on_2_contracts"] == 32
    assert set(result["blocks_per_s"]) >= {"sim_e2e_lru", "sim_hot_lru", "sim_hot_prefixshield"}


def test_table_renders_every_target(bench_run):
    text = render(_result(bench_run))
    for tid in TARGETS:
        assert tid in text
    assert "min" in text and "median" in text
    assert any(word in text for word in ("PASS", "MISS"))
    assert ("vLLM not installed" in text) == (_result(bench_run)["vllm"]["version"] is None
                                              and "not installed" in
                                              _result(bench_run)["vllm"]["note"])


def test_a_clairvoyant_policy_is_refused_before_any_timing():
    """belady needs the trace's future, which the timed replays do not give: exit 2 with
    one line, not a crash half-way through the bench."""
    proc = subprocess.run([sys.executable, "-m", "psgate", "bench", "--quick", "--policy",
                           "belady"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "--policy: expected a deployable policy" in \
        proc.stderr and "Traceback" not in proc.stderr
