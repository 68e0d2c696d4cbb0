"""examples/paper/reproduce.py: the whole pipeline on shrunken workloads (--tiny).

The committed examples/paper/REPORT.md comes from the full command; here the same code
runs on small traces so every table, figure and lookup is exercised, and the report's
numbers are checked against the cell receipts they were read from.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_tiny_reproduction_end_to_end(tmp_path):
    out = tmp_path / "paper"
    cmd = [sys.executable, str(ROOT / "examples" / "paper" / "reproduce.py"), "--tiny",
           "--workers", "2", "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = (out / "REPORT.md").read_text()
    assert report.startswith("# The PrefixShield paper's evaluation")
    assert "Pipeline check only (--tiny)" in report
    for heading in ("## Table I", "## Table II", "## Table III", "## Fig. 2", "## Fig. 3a",
                    "## Fig. 3b", "## Beyond the paper: prefixshield-b",
                    "## prefixshield-b (default, adaptive) vs PrefixShield",
                    "## Benign traces at several capacities", "## Where prefixshield-b"):
        assert heading in report, heading
    assert "has no counterpart yet" not in report
    for png in ("fig2.png", "fig3.png", "fig4.png", "fig5.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # The one-touch PrefixShield row is the cell receipt's numbers, not a copy of the paper's.
    row = re.search(r"^\| one-touch \| prefixshield \| ([0-9.]+) \| ([+-][0-9.]+) ", report, re.M)
    cell = next(p for p in (out / "cells").iterdir()
                if p.name.startswith("table1-one-touch-") and json.loads(
                    (p / "cell.json").read_text())["candidate"] == "prefixshield"
                and not json.loads((p / "cell.json").read_text())["candidate_params"])
    v = json.loads((cell / "receipt.json").read_text())["summary"]["roles"]["victim"]["hit_fraction"]
    assert float(row[1]) == round(v["candidate_mean"] * 100, 2)
    assert float(row[2]) == round(v["diff_mean"] * 100, 2)
    # Creation-pressure rows: one per ratio, the gain read off its cell's receipt, the
    # observed ratio off its traces' headers.
    for ratio in ("0.54", "1.02", "2.14", "4.23"):
        row = re.search(rf"^\| {ratio} \| ([0-9.]+) \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \| "
                        rf"([+-][0-9.]+) ", report, re.M)
        assert row, ratio
        cid = _cell(out, "fig2-pressure-one-touch-", lambda c: c["params"].get(
            "creation_pressure") == float(ratio) and c["candidate"] == "prefixshield")
        v = _victim(cid)
        assert float(row[2]) == round(v["diff_mean"] * 100, 2)
        heads = [json.loads(p.read_text().splitlines()[0]) for p in (cid / "traces").iterdir()]
        obs = sum(h["generator"]["derived"]["creation_pressure"]["observed"] for h in heads)
        assert float(row[1]) == round(obs / len(heads), 2)
    # prefixshield-b against PrefixShield itself: the paired row is that cell's receipt
    for kind in ("one-touch", "low-and-slow", "two-pass-replay", "delayed-replay"):
        row = re.search(rf"^\| {kind} \| 2 \| ([0-9.]+) \| ([0-9.]+) \| ([+-][0-9.]+) ",
                        report, re.M)
        cid = _cell(out, f"psb-vs-ps-{kind}-", lambda c: True)
        spec = json.loads((cid / "cell.json").read_text())
        assert (spec["baseline"], spec["candidate"]) == ("prefixshield", "prefixshield-b")
        v = _victim(cid)
        assert float(row[1]) == round(v["baseline_mean"] * 100, 2)
        assert float(row[3]) == round(v["diff_mean"] * 100, 3)
    # real benign rows from the imported samples: one run per window / bundle of sessions
    for name, n in (("mooncake", 2), ("weka", 2)):
        assert re.search(rf"^\| {name} \| 1024 \([0-9]+\) \| {n} \| ", report, re.M), name
        traces = sorted((out / "cells" / f"corpus-{name}").glob("*.jsonl"))
        assert len(traces) == n
        head = json.loads(traces[0].read_text().splitlines()[0])
        assert head["import"]["format"] == name and "hold" in head["paper_reproduction"]
        assert all("done_t" in json.loads(x) for x in traces[0].read_text().splitlines()[1:])
    # Interrupted or repeated: every cell resumes from its receipt, the report is the same.
    first = report.split("cells in")[1]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    cells = [p for p in (out / "cells").iterdir() if (p / "cell.json").exists()]
    assert proc.stderr.count("(resumed)") == len(cells)
    again = (out / "REPORT.md").read_text()
    assert again.split("cells in")[1].split("\n", 1)[1] == first.split("\n", 1)[1]


def _cell(out, prefix, pick):
    found = [p for p in (out / "cells").iterdir() if p.name.startswith(prefix)
             and pick(json.loads((p / "cell.json").read_text()))]
    assert len(found) == 1, (prefix, found)
    return found[0]


def _victim(cell):
    return json.loads((cell / "receipt.json").read_text())["summary"]["roles"]["victim"][
        "hit_fraction"]
