"""An experiment whose runs saturate their modeled instance says so: in its receipt (which
runs, per trace) and in one warning line, as a single replay does per run."""

from __future__ import annotations

import orjson

from test_cli import psgate

# The cold workload at 40 requests/s is about 1.5 times what one instance serves under the
# service model's prefill server; at its default rate it never queues.
HEAVY = "cold:rate=40,duration_s=10"
LIGHT = "cold:duration_s=10"


def _experiment(tmp_path, workload: str, name: str):
    out = tmp_path / name
    proc = psgate("replay", "--workload", workload, "--runs", "2", "--baseline", "lru",
                  "--candidate", "prefixshield", "--scheduler", "service", "--out", out,
                  "--quiet", "--allow-unexercised")
    return proc, orjson.loads((out / "receipt.json").read_bytes())


def test_saturated_runs_are_recorded_and_warned_once(tmp_path):
    proc, receipt = _experiment(tmp_path, HEAVY, "h")
    assert [run.get("saturated") for run in receipt["runs"]] == [["baseline", "candidate"]] * 2
    for run in receipt["runs"]:
        one = orjson.loads((tmp_path / "h" / run["receipt"]).read_bytes())
        assert one["runs"]["baseline"]["saturation"]["verdict"] == "saturated"
    warnings = [ln for ln in proc.stderr.splitlines() if "warning" in ln]
    assert len(warnings) == 1, proc.stderr
    assert warnings[0].startswith("psgate: warning: 2 of 2 runs saturated their modeled "
                                  "instance (")


def test_unsaturated_runs_carry_no_mark_and_no_warning(tmp_path):
    proc, receipt = _experiment(tmp_path, LIGHT, "l")
    assert all("saturated" not in run for run in receipt["runs"])
    assert "warning" not in proc.stderr, proc.stderr
