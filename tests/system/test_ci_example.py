"""examples/ci/: the GitHub Actions workflow passes actionlint, installs psgate from the
checkout, names files that exist, and its steps run here as they would on a runner."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from helpers import actionlint_path, assert_actionlint

ROOT = Path(__file__).resolve().parents[2]
CI = ROOT / "examples" / "ci"
WORKFLOW = CI / "psgate-gate.yml"


@pytest.fixture(scope="module")
def workflow() -> dict:
    yaml = pytest.importorskip("yaml")
    return yaml.safe_load(WORKFLOW.read_text())


def _steps(workflow: dict) -> list[dict]:
    return workflow["jobs"]["gate"]["steps"]


def test_workflow_passesactionlint_path():
    assert_actionlint(WORKFLOW)


def test_actionlint_finds_a_broken_workflow(tmp_path):
    """The lint is live: the same workflow with an unknown expression fails it."""
    exe = actionlint_path()
    if exe is None:
        pytest.skip("actionlint not installed here")
    bad = tmp_path / "bad.yml"
    bad.write_text(WORKFLOW.read_text().replace("$GITHUB_STEP_SUMMARY",
                                                "${{ github.no_such_field }}"))
    proc = subprocess.run([exe, "-no-color", str(bad)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 1 and "no_such_field" in proc.stdout


def test_installs_psgate_from_the_checkout(workflow):
    runs = [s["run"] for s in _steps(workflow) if "run" in s]
    installs = [r for r in runs if "pip install" in r]
    assert installs == ["pip install '.[report]'"], installs
    assert not any("psgate[" in r or "pip install psgate" in r for r in runs)
    uses = [s["uses"] for s in _steps(workflow) if "uses" in s]
    assert uses[0].startswith("actions/checkout@")


def test_files_it_names_exist(workflow):
    text = " ".join(s.get("run", "") for s in _steps(workflow))
    named = sorted({w for w in text.split() if w.startswith("examples/")})
    assert "examples/ci/incident.jsonl" in named and "examples/ci/gate.toml" in named
    for path in named:
        assert (ROOT / path).is_file(), path
    assert "Apache-2.0" in (CI / "README.md").read_text()


def test_keeps_receipt_report_and_junit_and_writes_a_summary(workflow):
    steps = _steps(workflow)
    upload = [s for s in steps if s.get("uses", "").startswith("actions/upload-artifact@")]
    assert len(upload) == 1 and "!cancelled()" in upload[0]["if"]
    assert upload[0]["with"]["path"].split() == ["receipt/", "psgate-junit.xml"]
    runs = " ".join(s.get("run", "") for s in steps)
    assert "--junit psgate-junit.xml" in runs and "receipt/report.html" in runs
    assert 'psgate summary receipt --format markdown >> "$GITHUB_STEP_SUMMARY"' in runs
    junit = [s for s in steps if "junit" in s.get("uses", "")]
    assert junit and junit[0]["with"]["report_paths"] == "psgate-junit.xml"
    assert workflow["permissions"]["checks"] == "write"


def test_steps_run_here(workflow, tmp_path):
    """Every psgate step of the job, in order, in a copy of the checkout's examples/ci,
    with $GITHUB_STEP_SUMMARY pointing at a file: the gate passes, the summary says so,
    the report and the JUnit file are where the upload step looks for them."""
    (tmp_path / "examples").mkdir()
    shutil.copytree(CI, tmp_path / "examples" / "ci")
    summary = tmp_path / "step-summary.md"
    summary.write_text("earlier step\n")
    env = dict(os.environ, GITHUB_STEP_SUMMARY=str(summary),
               PATH=str(Path(sys.executable).parent) + os.pathsep + os.environ["PATH"])
    ran = 0
    for step in _steps(workflow):
        cmd = step.get("run")
        if cmd is None or cmd.startswith("pip install"):
            continue                      # psgate is installed here from this checkout
        proc = subprocess.run(["bash", "-e", "-c", cmd], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, (cmd, proc.stderr)
        ran += 1
    assert ran == 3
    text = summary.read_text()
    assert text.startswith("earlier step\n") and "### psgate gate: PASS" in text
    assert "| all | hit fraction |" in text and "No check failed." in text
    assert (tmp_path / "receipt" / "report.html").is_file()
    root = ET.parse(tmp_path / "psgate-junit.xml").getroot()
    assert int(root.get("tests")) > 0 and root.get("failures") == "0"


def test_committed_trace_is_what_its_readme_command_writes(tmp_path):
    text = (CI / "README.md").read_text()
    cmd = next(ln.strip() for ln in text.splitlines() if ln.strip().startswith("psgate trace gen"))
    proc = subprocess.run(["bash", "-e", "-c", cmd], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120,
                          env=dict(os.environ, PATH=str(Path(sys.executable).parent)
                                   + os.pathsep + os.environ["PATH"]))
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "incident.jsonl").read_bytes() == (CI / "incident.jsonl").read_bytes()
