"""docs/tutorial.md, followed as a newcomer would: its commands run in order as written, and
every answer the page states (who was hurt, by whom, by how much, the verdict) is what those
commands print or write. An edit that changes an answer fails here until the page says the
new one."""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "tutorial.md"


def _commands(text: str) -> list[str]:
    """The page's commands: indented lines starting with ``psgate``, in page order."""
    return [ln.strip() for ln in text.splitlines()
            if ln.startswith("    psgate ") and not ln.startswith("     ")]


def _run(cmd: str, cwd: Path) -> subprocess.CompletedProcess:
    bin_dir = str(Path(sys.executable).parent)
    env = dict(os.environ, PATH=bin_dir + os.pathsep + os.environ["PATH"], NO_COLOR="1",
               COLUMNS="100")
    return subprocess.run(["bash", "-e", "-c", cmd], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)


def _flat(text: str) -> str:
    return " ".join(text.split())


def test_the_tutorial_runs_as_written_and_its_answers_are_the_outputs(tmp_path):
    page = PAGE.read_text()
    flat_page = _flat(page)
    cmds = _commands(page)
    assert [c.split()[1] for c in cmds] == ["trace", "replay", "explain", "explain", "report",
                                            "summary", "replay"], cmds
    (tmp_path / "examples").mkdir()
    shutil.copytree(ROOT / "examples" / "ci", tmp_path / "examples" / "ci")
    out = {}
    for cmd in cmds:
        proc = _run(cmd, tmp_path)
        assert proc.returncode == 0, f"`{cmd}` exited {proc.returncode}:\n{proc.stderr[-2000:]}"
        assert "Traceback" not in proc.stderr
        out[cmd] = proc.stdout + proc.stderr
        if cmd == cmds[1]:          # step 5 replaces it: keep step 2's receipt
            shutil.copytree(tmp_path / "receipt", tmp_path / "step2")

    # 1. the flood: tenant-x creates blocks at three times its refill
    stats = _flat(out[cmds[0]])
    for figures in ("8.153 / 64.0 = 0.1270", "3.036 / 40.0 = 0.0760", "48.573 / 16.0 = 3.0360"):
        assert figures in stats and figures in flat_page, figures

    # 2. the replay: tenant-a's hit fraction and blocks lost, both runs; the verdict
    receipt = json.loads((tmp_path / "step2" / "receipt.json").read_text())
    runs = receipt["runs"]
    hurt = {run: runs[run]["metrics"]["groups"]["tenant-a"] for run in ("baseline",
                                                                         "candidate")}
    base, cand = (round(hurt[r]["hit_fraction"], 4) for r in ("baseline", "candidate"))
    assert f"hit fraction {base:.4f} {cand:.4f} {cand - base:+.4f}" in flat_page
    assert f"{base * 100:.2f}%" in page and f"{cand * 100:.2f}%" in page
    lost = [hurt[r]["evictions_suffered"] for r in ("baseline", "candidate")]
    assert f"blocks lost {lost[0]} {lost[1]} {lost[1] - lost[0]:+d}" in flat_page
    b = {r: round(runs[r]["metrics"]["groups"]["tenant-b"]["hit_fraction"], 4)
         for r in ("baseline", "candidate")}
    assert f"({b['baseline']:.4f} to {b['candidate']:.4f})" in page
    assert runs["baseline"]["metrics"]["groups"]["tenant-x"]["hit_fraction"] == 0
    assert runs["candidate"]["metrics"]["groups"]["tenant-x"]["hit_fraction"] == 0
    gate = receipt["gate"]
    verdict = f"gate: PASS ({gate['num_checks']}/{gate['num_checks']} checks passed)"
    assert gate["result"] == "pass" and verdict in out[cmds[1]] and verdict in page
    assert ("no group's hit fraction fell; gained most: tenant-b, "
            f"{b['baseline']:.4f} -> {b['candidate']:.4f} "
            f"(+{b['candidate'] - b['baseline']:.4f})") in _flat(out[cmds[1]])

    # 3. who evicted tenant-a under lru, and request a14 in both runs
    by = runs["baseline"]["metrics"]["evictions_by"]
    assert by["tenant-x"]["tenant-a"] > by["tenant-a"]["tenant-a"] > by["tenant-b"]["tenant-a"]
    assert (f"tenant-x's requests evicted **{by['tenant-x']['tenant-a']}**, tenant-a's own "
            f"{by['tenant-a']['tenant-a']} and tenant-b's {by['tenant-b']['tenant-a']}"
            in flat_page)
    assert sum(by[g]["tenant-a"] for g in by) == lost[0]
    with open(tmp_path / "step2" / "requests.csv") as fh:
        a14 = {r["run"]: r for r in csv.DictReader(fh) if r["id"] == "a14"}
    assert a14["baseline"]["t"].startswith("7.721") and a14["baseline"]["prompt_tokens"] == "427"
    assert "`a14` arrived at 7.721 s with a 427-token prompt, 26 full blocks" in flat_page
    explained = _flat(out[cmds[2]])
    assert "baseline (lru): 0 of 26 blocks hit" in explained
    assert "candidate (prefixshield): 24 of 26 blocks hit" in explained
    assert "13 of 26 missed blocks were evicted by tenant-b's request b6" in explained
    assert "11 of 26 missed blocks were evicted by tenant-x's requests x24, x25" in explained
    assert "hit **0 of 26** blocks: 13 had been evicted by tenant-b's request b6 and 11 by " \
           "tenant-x's requests x24 and x25" in flat_page
    assert "it hit **24 of 26**" in flat_page
    decision = _flat(out[cmds[3]])
    assert re.search(r"decision 725 \(baseline run, policy lru\).*admitting request b6",
                     decision)
    assert "least recently freed candidate" in decision

    # 4. the stated gain, the report and the summary
    assert f"rises by {(cand - base) * 100:.2f} points" in page
    assert (tmp_path / "receipt" / "report.html").stat().st_size > 10_000
    assert "PASS" in out[cmds[5]]

    # 5. the gate file run: a JUnit file with one test case per check, none failed
    junit = (tmp_path / "psgate-junit.xml").read_text()
    assert "<testcase" in junit and "<failure" not in junit
