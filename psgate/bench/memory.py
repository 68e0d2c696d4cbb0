"""Memory per resident block and per request, each measured in a fresh child process
(``python -m psgate.bench``), so nothing the bench process holds counts."""

from __future__ import annotations

import gc
import json
import os
import shutil
import subprocess
import sys
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


def requests_memory(small: Path, large: Path, n_small: int, n_large: int,
                    work: Path) -> dict:
    """RSS growth per request between two replays, each in its own fresh process."""
    peaks = []
    for trace in (small, large):
        proc = subprocess.run([sys.executable, "-m", "psgate.bench", "--requests-memory-child",
                               str(trace), str(work / "out-requests")], capture_output=True,
                              text=True, env=child_env())
        if proc.returncode != 0:
            raise RuntimeError(f"memory child failed: {proc.stderr.strip()[-500:]}")
        peaks.append(json.loads(proc.stdout)["peak_rss"])
    if None in peaks:
        return {"requests": [n_small, n_large], "peak_rss": peaks, "bytes_per_request": None}
    return {"requests": [n_small, n_large], "peak_rss": peaks,
            "bytes_per_request": (peaks[1] - peaks[0]) / (n_large - n_small)}


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
