"""The vLLM engines from the base environment.

The conformance, real-engine and plugin suites in tests/vllm_suite import vLLM, so they
run in an interpreter that has it: PSGATE_VLLM_PYTHON (CI builds one with
scripts/install-vllm.sh and sets PSGATE_REQUIRE_VLLM=1, so these tests cannot skip
there), or this interpreter when it can import vLLM itself.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import heavy_python
from test_cli import assert_one_line_error

ROOT = Path(__file__).resolve().parents[2]
HIDE_VLLM = ("import sys; sys.modules['vllm'] = None; "
             "from psgate.cli import main; sys.argv[0] = 'psgate'; main()")


@pytest.mark.parametrize("engine", ["vllm-pool", "vllm-sched", "vllm"])
def test_vllm_engines_without_vllm_exit_3_naming_the_install_command(tmp_path, engine):
    proc = subprocess.run([sys.executable, "-c", HIDE_VLLM, "replay", "--engine", engine,
                           "--baseline", "lru", "--candidate", "prefixshield",
                           "--out", str(tmp_path / "o")],
                          capture_output=True, text=True, timeout=120)
    assert_one_line_error(proc, 3, engine, "scripts/install-vllm.sh")
    assert not (tmp_path / "o").exists()


@pytest.mark.heavy
@pytest.mark.parametrize("suite", sorted(p.name for p in (ROOT / "tests" / "vllm_suite")
                                         .glob("test_*.py")))
def test_vllm_suite(tmp_path, suite):
    python = heavy_python("VLLM", ("vllm",), "bash scripts/install-vllm.sh .venv-vllm")
    env = {**os.environ, "PSGATE_VLLM_SUITE": "1", "PYTHONPATH": str(ROOT),
           "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    proc = subprocess.run([python, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
                           "--basetemp", str(tmp_path / "t"), f"tests/vllm_suite/{suite}"],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=2400)
    tail = proc.stdout[-4000:] + proc.stderr[-2000:]
    print(tail)
    assert proc.returncode == 0, tail
    summary = proc.stdout.strip().splitlines()[-1]
    assert " passed" in summary and "skipped" not in summary and "deselected" not in summary, \
        summary
