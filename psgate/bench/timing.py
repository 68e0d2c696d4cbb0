"""Timed replays: the sim hot loop, ``psgate replay`` end to end, and victim selection
per victim inside a full replay."""

from __future__ import annotations

import gc
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from psgate.bench.traces import INSTANT, WARMUP_ROUNDS, Loaded, make_engine
from psgate.contracts import CONTRACT_NAMES
from psgate.policies import make_policy

CLOCK = time.process_time       # replays: CPU seconds of this process


def hot_loop(loaded: Loaded, policy: str, capacity: int,
             scheduler: str = "service") -> tuple[float, dict]:
    """Seconds for one sim replay of pre-parsed events, no ledger; and its counts."""
    engine = make_engine(loaded, make_policy(policy), capacity, scheduler)
    gc.collect()
    t0 = CLOCK()
    result = engine.run(loaded.events)
    dt = CLOCK() - t0
    return dt, {"evictions": result.evictions, "hit_blocks": result.counts["hit_blocks"],
                "waits": result.counts["waits"],
                "invariants_hold": all(v.holds for v in result.invariants.values())}


def end_to_end(trace: Path, policy: str, capacity: int, out: Path, *, python: bool = False,
               candidate: str | None = None, scheduler: str = "service", keep: bool = False,
               **options) -> float:
    """Seconds for psgate.api.replay (what ``psgate replay`` runs) with ``policy`` as
    baseline and candidate: validation, two runs, full ledger, requests.csv, receipt. Under
    the service model, whose admissions and releases are those of the vLLM KVCacheManager
    replay it is compared with (each request allocated at t and freed at done_t).
    ``python``: as an install without a C compiler runs it, every module interpreted (a
    child interpreter with ``PSGATE_CORE=0``), whether or not the compiled code is built.
    ``keep``: leave the receipt in ``out`` (for what reads it next)."""
    args = {"trace": str(trace), "policy": policy, "capacity": capacity, "out": str(out),
            "candidate": candidate or policy, "scheduler": scheduler, **options}
    if python:
        env = {**os.environ, "PSGATE_CORE": "0"}
        proc = subprocess.run([sys.executable, "-c", _INTERPRETED, json.dumps(args)],
                              env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"the interpreted replay failed: {proc.stderr[-800:]}")
        dt = float(proc.stdout.split()[-1])
    else:
        dt = replay_seconds(**args)
    if not keep:
        shutil.rmtree(out, ignore_errors=True)
    return dt


def replay_seconds(trace: str, policy: str, capacity: int, out: str, candidate: str,
                   scheduler: str, **options) -> float:
    """CPU seconds of one psgate.api.replay in this interpreter (end_to_end's run)."""
    from psgate import api
    cfg = api.ReplayConfig(trace=trace, baseline=policy, candidate=candidate,
                           capacity=capacity, out=Path(out), force=True, cost=INSTANT,
                           scheduler=scheduler, contracts=CONTRACT_NAMES, **options)
    gc.collect()
    t0 = CLOCK()
    api.replay(cfg)
    return CLOCK() - t0


# end_to_end(python=True)'s child: every psgate module from its Python source
_INTERPRETED = """
import json, sys
from psgate import core
from psgate.bench.timing import replay_seconds
assert core.interpreted() and core.get() is None, "psgate loaded compiled code"
print(repr(replay_seconds(**json.loads(sys.argv[1]))))
"""


def time_selection(loaded: Loaded, policy_name: str, capacity: int, groups: int) -> dict:
    """select_victim + on_evict time per victim (or evict_batch's, for a policy that
    evicts a batch in one call), summed over the allocation batches after the warm-up
    rounds (when every group is in debt), inside a full replay."""
    warmup = WARMUP_ROUNDS * groups
    pol = make_policy(policy_name)
    acc = {"victims": 0, "batches": 0, "t": 0.0, "cur": 0.0, "measure": False}
    clock = time.perf_counter
    sel, ev = pol.select_victim, pol.on_evict
    adm, end = pol.on_admit, pol.end_admit

    def select_victim(req, now):
        t0 = clock()
        d = sel(req, now)
        acc["cur"] += clock() - t0
        return d

    def on_evict(b):
        t0 = clock()
        ev(b)
        acc["cur"] += clock() - t0
        acc["victims"] += acc["measure"]

    batch = pol.evict_batch

    def evict_batch(req, now, n, decisions):
        t0 = clock()
        victims = batch(req, now, n, decisions)
        acc["cur"] += clock() - t0
        acc["victims"] += acc["measure"] * len(victims)
        return victims

    def on_admit(req, now):
        acc["cur"] = 0.0
        acc["measure"] = req.index >= warmup
        return adm(req, now)

    def end_admit(req, now):
        if acc["cur"] and acc["measure"]:
            acc["batches"] += 1
            acc["t"] += acc["cur"]
        return end(req, now)

    pol.select_victim, pol.on_evict, pol.on_admit, pol.end_admit = \
        select_victim, on_evict, on_admit, end_admit
    pol.evict_batch = evict_batch   # the engine's fast path, when the policy has one
    engine = make_engine(loaded, pol, capacity)
    gc.collect()
    result = engine.run(loaded.events)
    in_debt = None
    if hasattr(pol, "buckets"):
        now = engine.now / 1e9
        buckets = pol.buckets
        in_debt = sum(1 for g in range(len(pol.gnames))
                      if sum(1 for i in buckets.group_buckets[g] if buckets.bhat(i, now) < 0) >= 2)
    return {"victims": acc["victims"], "batches": acc["batches"],
            "us_per_victim": 1e6 * acc["t"] / max(1, acc["victims"]),
            "evictions": result.evictions, "groups_in_debt_on_2_contracts": in_debt,
            "invariants_hold": all(v.holds for v in result.invariants.values())}
