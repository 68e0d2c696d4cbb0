"""An install without a C compiler (or without Cython) replays to the same bytes.

Each replay runs in a fresh interpreter. One imports psgate as it is installed here
(compiled where the build could compile); the other hides every compiled psgate module
and Cython itself, as a machine without a compiler has them: ``psgate._core`` is missing,
the modules written in Cython's pure-Python mode load from their ``.py`` sources, and
``import cython`` fails, so they take ``psgate.cython_shadow``. Everything either writes
must be the same bytes, but the receipt's environment section, which names the code that
ran.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import replay_outputs, write_lines
from psgate.workloads import generate

ROOT = Path(__file__).resolve().parents[1]

# Run in the child before psgate is imported: a finder that answers first.
HIDE_COMPILED = r'''
import importlib.abc, importlib.machinery, importlib.util, sys

class NoCompiler(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in ("cython", "Cython"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        if name != "psgate" and not name.startswith("psgate."):
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or not spec.origin or not spec.origin.endswith(".so"):
            return spec
        folder, _, file = spec.origin.rpartition("/")
        source = f"{folder}/{file.split('.')[0]}.py"
        if name == "psgate._core":          # the core has no Python form of its own
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return importlib.util.spec_from_file_location(name, source)

sys.meta_path.insert(0, NoCompiler())
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
    assert core.get() is None, "psgate._core loaded"
    for name in pure:
        mod = importlib.import_module(name)
        assert mod.__file__.endswith(".py"), mod.__file__
        assert mod.cython.__name__ == "psgate.cython_shadow", (name, mod.cython)
sys.argv = ["psgate", *sys.argv[2:]]
cli.main()
'''


def _replay(mode: str, trace: Path, out: Path, *args: str) -> dict[str, bytes]:
    code = (HIDE_COMPILED if mode == "interpreted" else "") + RUN
    proc = subprocess.run([sys.executable, "-c", code, mode, "replay", "--trace", str(trace),
                           "--out", str(out), *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
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
