"""An install without a C compiler (or without Cython) replays to the same bytes.

Each replay runs in a fresh interpreter. One imports psgate as it is installed here
(compiled where the build could compile); the other runs as a machine without a compiler
has it: ``PSGATE_CORE=0`` (``psgate.core.run_interpreted``) leaves ``psgate._core`` out and
loads the modules written in Cython's pure-Python mode from their ``.py`` sources, and
``import cython`` fails, so they take ``psgate.cython_shadow``. Everything either writes
must be the same bytes, but the receipt's environment section, which names the code that
ran.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import replay_outputs, write_lines
from psgate.workloads import generate

ROOT = Path(__file__).resolve().parents[1]

# Run in the child before psgate is imported: Cython is not installed there. With
# PSGATE_CORE=0 (psgate.core.run_interpreted) psgate loads its compiled modules from
# their sources, so the modules in pure-Python mode import psgate.cython_shadow.
HIDE_CYTHON = r'''
import importlib.abc, sys

class NoCython(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in ("cython", "Cython"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NoCython())
'''

RUN = r'''
import importlib, pathlib, sys
import psgate
from psgate import cli, core
mode = sys.argv[1]
root = pathlib.Path(psgate.__file__).parent
pure = [".".join(("psgate",) + p.relative_to(root).parts[:-1] + (p.name.split(".")[0],))
        for p in sorted(root.rglob("*.so")) if p.name.split(".")[0] != "_core"]
assert len(pure) >= 4, pure                   # the modules in pure-Python mode
if mode == "interpreted":
    assert core.interpreted() and core.get() is None, "psgate._core loaded"
    for name in pure:
        mod = importlib.import_module(name)
        assert mod.__file__.endswith(".py"), mod.__file__
        assert mod.cython.__name__ == "psgate.cython_shadow", (name, mod.cython)
sys.argv = ["psgate", *sys.argv[2:]]
cli.main()
'''


def _replay(mode: str, trace: Path, out: Path, *args: str) -> dict[str, bytes]:
    code = (HIDE_CYTHON if mode == "interpreted" else "") + RUN
    env = {k: v for k, v in os.environ.items() if k != "PSGATE_CORE"}
    if mode == "interpreted":
        env["PSGATE_CORE"] = "0"
    proc = subprocess.run([sys.executable, "-c", code, mode, "replay", "--trace", str(trace),
                           "--out", str(out), *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    files = replay_outputs(out)
    receipt = json.loads(files["receipt.json"])
    if mode == "interpreted":
        assert receipt["replay_code"] == "python"
    del receipt["replay_code"]
    files["receipt.json"] = json.dumps(receipt, sort_keys=True).encode()
    return files


@pytest.mark.parametrize("args", [
    ("--baseline", "lru", "--candidate", "prefixshield", "--capacity", "256"),
    ("--baseline", "lru", "--candidate", "prefixshield", "--capacity", "256",
     "--scheduler", "service"),
], ids=["step", "service"])
def test_replay_without_compiler_matches(tmp_path, args):
    trace = write_lines(tmp_path, generate("one-touch", {"attack_requests": 60}))
    installed = _replay("installed", trace, tmp_path / "installed", *args)
    interpreted = _replay("interpreted", trace, tmp_path / "interpreted", *args)
    assert sorted(installed) == sorted(interpreted)
    for name in installed:
        assert installed[name] == interpreted[name], f"{name} differs"
