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
                    "## Fig. 3b", "## Beyond the paper: prefixshield-b"):
        assert heading in report, heading
    for png in ("fig2.png", "fig3.png", "fig4.png"):
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
    # Interrupted or repeated: every cell resumes from its receipt, the report is the same.
    first = report.split("cells in")[1]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr.count("(resumed)") == len(list((out / "cells").iterdir()))
    assert (out / "REPORT.md").read_text().split("cells in")[1].split("\n", 1)[1] == \
        first.split("\n", 1)[1]
