"""Memory per resident block and per request, each measured in a fresh child process
(``python -m psgate.bench``), so nothing the bench process holds counts."""

from __future__ import annotations

import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from psgate.bench.traces import INSTANT, INSTANT_STEPS, TINY_CAPACITY, load, make_engine
from psgate.contracts import CONTRACT_NAMES
from psgate.policies import make_policy


def _rss() -> int | None:
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return None


def memory_child(policy: str, trace: str, capacity: int) -> dict:
    """In a fresh process: RSS before the engine exists (trace loaded) and once full."""
    loaded = load(Path(trace))
    gc.collect()
    before = _rss()
    engine = make_engine(loaded, make_policy(policy), capacity)
    result = engine.run(loaded.events)
    gc.collect()
    after = _rss()
    resident = capacity - 1 - len(engine.free)
    return {"policy": policy, "resident": resident, "evictions": result.evictions,
            "requests": loaded.summary.num_requests,
            "bytes": None if before is None or after is None else after - before}


def _peak_rss() -> int | None:
    """This process's peak resident set size in bytes (None where it cannot be read): Linux's
    VmHWM, the high-water mark of this program's own memory (getrusage's maxrss would also
    count the parent it was forked from, whose size it inherits across exec)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        import resource
    except ImportError:
        return None
    if sys.platform != "darwin":
        return None
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss     # bytes there


def requests_memory_child(trace: str, out: str) -> dict:
    """In a fresh process: ``psgate replay`` of the trace (lru against prefixshield, full
    ledger; the default step scheduler with zero-time steps, so no backlog of waiting
    requests grows with the trace) and the process's peak RSS."""
    from psgate import api
    api.replay(api.ReplayConfig(trace=trace, baseline="lru", candidate="prefixshield",
                                capacity=TINY_CAPACITY, out=Path(out), force=True,
                                cost=INSTANT, scheduler="step", step_cost=INSTANT_STEPS,
                                contracts=CONTRACT_NAMES))
    shutil.rmtree(out, ignore_errors=True)
    return {"peak_rss": _peak_rss()}


def peak_growth(traces: tuple[Path, Path], counts: tuple[int, int], work: Path) -> dict:
    """Peak RSS of a replay of each trace, each in its own fresh process, and the growth
    per unit of ``counts`` (requests, tenants) between them."""
    peaks = []
    for trace in traces:
        proc = subprocess.run([sys.executable, "-m", "psgate.bench", "--requests-memory-child",
                               str(trace), str(work / "out-requests")], capture_output=True,
                              text=True, env=child_env())
        if proc.returncode != 0:
            raise RuntimeError(f"memory child failed: {proc.stderr.strip()[-500:]}")
        peaks.append(json.loads(proc.stdout)["peak_rss"])
    growth = None if None in peaks else (peaks[1] - peaks[0]) / (counts[1] - counts[0])
    return {"counts": list(counts), "peak_rss": peaks, "bytes_per_unit": growth}


# A child that runs ``python -m psgate ARGS`` as a user would (stdout discarded) and then
# prints its own peak RSS on the real stdout: a process boundary, as the user's shell has.
_COMMAND_CHILD = """
import os, runpy, sys
from psgate.bench.memory import _peak_rss
keep = os.dup(1)
with open(os.devnull, "wb") as null:
    os.dup2(null.fileno(), 1)
sys.argv = ["psgate", *sys.argv[1:]]
try:
    runpy.run_module("psgate", run_name="__main__")
    code = 0
except SystemExit as exc:
    code = exc.code if isinstance(exc.code, int) else 1
sys.stdout.flush()
os.dup2(keep, 1)
print('{"code": %d, "peak_rss": %s}' % (code, _peak_rss() or "null"))
"""


def command_cost(args: list[str]) -> dict:
    """CPU seconds (the child's own rusage, from wait4) and peak RSS (its own VmHWM: a
    wait4 maxrss would count the bench process it was forked from) of one ``psgate``
    command in a fresh process."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen([sys.executable, "-c", _COMMAND_CHILD, *args], stdout=out,
                                stderr=err, env=child_env())
        _, status, usage = os.wait4(proc.pid, 0)
        out.seek(0)
        err.seek(0)
        lines = out.read().splitlines()
        got = json.loads(lines[-1]) if lines else {}
        if os.waitstatus_to_exitcode(status) != 0 or got.get("code") != 0:
            raise RuntimeError(f"psgate {' '.join(args)} failed: "
                               f"{err.read().decode(errors='replace')[-500:]}")
    return {"cpu_s": usage.ru_utime + usage.ru_stime, "peak_rss": got["peak_rss"]}


def child_env() -> dict:
    """The environment for a child running this psgate (its package root on the path)."""
    root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def memory(policy: str, trace: Path, capacity: int) -> dict:
    proc = subprocess.run([sys.executable, "-m", "psgate.bench", "--memory-child", policy,
                           str(trace), str(capacity)], capture_output=True, text=True,
                          env=child_env())
    if proc.returncode != 0:
        raise RuntimeError(f"memory child failed: {proc.stderr.strip()[-500:]}")
    return json.loads(proc.stdout)
