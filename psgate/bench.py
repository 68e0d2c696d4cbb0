"""psgate bench: replay throughput, victim selection time and memory per block, each
measured in one run and printed as a ratio against its performance target.

    result = run(BenchConfig(quick=True))      # a JSON-ready dict
    print(render(result))

Everything runs on traces generated here (seeded, written to a temporary directory),
one process, one core (the memory measurement uses a fresh child process per policy).
Replays are timed in CPU seconds of this process (``time.process_time``), so other load
on a shared machine does not count against either side of a ratio; per-victim selection
time is wall time (``perf_counter``) around each call. Each timing is repeated ``repeats``
times, in rounds that measure every side of a ratio once (vLLM included), so both sides
sample the same stretch of a machine whose speed drifts; the table shows min and median,
ratios are computed from the mins (the least disturbed run of each side) and, beside
them, from the medians. Targets:

- ``e2e_vs_vllm``: ``psgate replay`` with ``sim``, LRU and the full ledger (validation,
  two runs, ledger and receipt writing; blocks/s counts the blocks of both runs) over
  replaying the same trace through vLLM's KVCacheManager (building each vLLM
  ``Request``, with its block hashing, then get_computed_blocks / allocate_slots /
  free; token ids are prepared beforehand and not timed): >= 2.
- ``hot_vs_vllm``: the ``sim`` hot loop alone (events parsed beforehand, no ledger)
  over vLLM's allocate/free loop alone (``Request`` objects built beforehand): >= 1.
  Both vLLM targets are skipped, saying so, when vLLM does not import (``--vllm-python``
  measures vLLM in another interpreter, e.g. a vLLM virtualenv with psgate installed).
- ``ps_lru_hot`` / ``ps_lru_e2e``: prefixshield's blocks/s over lru's on the same reuse
  trace, hot loop and end to end: >= 0.6.
- ``select_4096``: PrefixShield's victim selection and eviction time per victim, timed
  inside a full replay in which every group is in creation debt on two contracts, at
  4,096 blocks / 32 groups, over 5 us: <= 1. ``select_growth``: the same at 1,048,576
  blocks / 1,024 groups over the 4,096 value: <= 2 (full run only).
- ``mem_lru`` / ``mem_ps``: RSS growth of a fresh process from before the engine exists
  to after the cache is full (1,048,576 resident blocks; 65,536 with ``--quick``), per
  resident block, over 200 bytes: <= 1. It includes the per-request records of the
  requests that filled the cache.
- ``cold_hot`` / ``cold_e2e``: on a trace without any reuse, prefixshield's replay time
  over lru's, hot loop and end to end: <= 1.2.
- ``mem_requests``: peak RSS of ``psgate replay`` (validation, two runs, ledger,
  requests.csv, receipt) in a fresh process, on a trace of 10^6 tiny requests minus the
  same on 10^5 (50,000 and 10,000 with ``--quick``), per request of difference, over 300
  bytes: <= 1. The requests share their blocks, so what grows is per-request state alone:
  what is in flight stays small, and a replay must not keep every request's results.

Traces never make a request wait: every request carries ``done_t`` and the blocks held
at any moment fit the cache, and replays use a zero-time cost model, so every engine
does exactly the same admissions and releases (the vLLM driver needs no waiting line).
"""

from __future__ import annotations

import gc
import heapq
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import orjson

from psgate import __version__
from psgate.engines.cost import CostModel
from psgate.engines.sim import SimEngine
from psgate.policies import make_policy
from psgate.trace.model import RequestEvent, TraceHeader, TraceSummary
from psgate.trace.reader import HashTable, TraceReader, TraceSource, validate_trace
from psgate.trace.writer import header_line

BENCH_FORMAT = 1
CONTRACTS = ("critical", "standard", "best-effort")
# Zero service time: each request holds its blocks exactly from t to done_t.
INSTANT = CostModel(0.0, 0.0, 0.0, 0.0)
BLOCK_SIZE = 16
OUT_TOKENS = 16
WARMUP_ROUNDS = 10
SELECT_TARGET_US = 5.0
BYTES_TARGET = 200.0
REQUEST_BYTES_TARGET = 300.0
TINY_CAPACITY = 256
Progress = Callable[[str], None]
POLICIES = ("lru", "prefixshield")
CLOCK = time.process_time       # replays: CPU seconds of this process


@dataclass(frozen=True)
class Scale:
    reuse: tuple[int, int, int]          # requests, blocks per request, capacity
    cold: tuple[int, int, int]
    # (capacity, groups, cache turnovers after the warm-up); the first is the 5 us target
    select: tuple[tuple[int, int, float], ...]
    memory_blocks: int
    memory_requests: tuple[int, int] = (100_000, 1_000_000)     # small, large trace


QUICK = Scale(reuse=(400, 32, 1024), cold=(400, 32, 1024), select=((4096, 32, 1.0),),
              memory_blocks=65536, memory_requests=(10_000, 50_000))
FULL = Scale(reuse=(10000, 64, 131072), cold=(4000, 64, 16384),
             select=((4096, 32, 2.0), (1048576, 1024, 1.0)), memory_blocks=1048576,
             memory_requests=(100_000, 1_000_000))


@dataclass
class BenchConfig:
    quick: bool = False
    repeats: int | None = None           # default: 3
    vllm_python: str | None = None       # measure vLLM with this interpreter
    workdir: Path | None = None          # default: a temporary directory, removed after
    scale: Scale | None = None           # default: QUICK or FULL

    def resolved_scale(self) -> Scale:
        return self.scale or (QUICK if self.quick else FULL)


# -- traces ----------------------------------------------------------------------------
def write_reuse_trace(path: Path, requests: int, blocks: int, capacity: int, *,
                      cold: bool = False, groups: int = 8, prefixes: int = 4,
                      seed: int = 1) -> dict:
    """Multi-tenant requests 1 ms apart: half of each prompt is one of its group's
    ``prefixes`` shared prefixes, half unique (``cold``: everything unique). Each holds
    its blocks for 1..M ms, M chosen so the requests in flight always fit the cache."""
    rng = random.Random(seed)
    per_req = blocks + 1 + -(-OUT_TOKENS // BLOCK_SIZE)      # tail < one block
    most = max(1, (capacity - 1) // per_req)
    dt = 0.001
    num_blocks = 0
    with open(path, "wb") as fh:
        fh.write(orjson.dumps(header_line(BLOCK_SIZE, source=f"psgate bench {path.stem} "
                                          f"seed={seed}")) + b"\n")
        for i in range(requests):
            g = rng.randrange(groups)
            if cold:
                hashes = [f"c{i:08x}{j:04x}" for j in range(blocks)]
            else:
                p = rng.randrange(prefixes)
                shared = [f"{g:02x}{p:02x}{j:04x}" for j in range(blocks // 2)]
                hashes = shared + [f"ff{i:08x}{j:04x}" for j in range(blocks - len(shared))]
            fh.write(orjson.dumps({
                "t": round(i * dt, 6), "op": "request", "id": f"r{i}", "group": f"tenant-{g}",
                "contract": CONTRACTS[g % 3], "scope": "m", "blocks": hashes,
                "tail": rng.randrange(BLOCK_SIZE), "out": OUT_TOKENS,
                "done_t": round((i + rng.randint(1, most)) * dt, 6)}) + b"\n")
            num_blocks += blocks
    return {"requests": requests, "blocks": num_blocks, "capacity": capacity,
            "blocks_per_request": blocks, "groups": groups, "reuse": not cold}


def write_debt_trace(path: Path, capacity: int, groups: int, turnovers: float,
                     blocks: int = 64, warmup_rounds: int | None = None) -> dict:
    """Requests 0.1 ms apart, groups round-robin, contracts alternating per round:
    after WARMUP_ROUNDS rounds every group has materialized 5 x 64 blocks on each of
    two contracts, more than either bucket's burst, and refill is negligible."""
    rounds = WARMUP_ROUNDS if warmup_rounds is None else warmup_rounds
    n = rounds * groups + int(capacity * turnovers / (blocks + 1))
    with open(path, "wb") as fh:
        fh.write(orjson.dumps(header_line(BLOCK_SIZE, source="psgate bench debt")) + b"\n")
        for i in range(n):
            g = i % groups
            t = i * 0.0001
            fh.write(orjson.dumps({
                "t": round(t, 6), "op": "request", "id": f"r{i}", "group": f"g{g}",
                "contract": CONTRACTS[(i // groups) % 2], "scope": "m",
                "blocks": [f"{i:08x}{j:04x}" for j in range(blocks)], "tail": 1, "out": 0,
                "done_t": round(t + 0.00005, 6)}) + b"\n")
    return {"requests": n, "blocks": n * blocks, "capacity": capacity, "groups": groups,
            "warmup_rounds": rounds}


def write_tiny_trace(path: Path, requests: int, seed: int = 1) -> dict:
    """Tiny requests 1 ms apart, each one of 16 shared one-block prompts plus a tail, held
    1..4 ms (``done_t``), from 4 groups with roles, a few of them cancelled: after the
    first requests no block is new, so a longer trace adds per-request state only."""
    rng = random.Random(seed)
    prompts = [[f"{k:04x}"] for k in range(16)]
    with open(path, "wb") as fh:
        fh.write(orjson.dumps(header_line(BLOCK_SIZE, source=f"psgate bench tiny seed={seed}"))
                 + b"\n")
        for i in range(requests):
            g = i % 4
            t = round(i * 0.001, 6)
            fh.write(orjson.dumps({
                "t": t, "op": "request", "id": f"r{i}", "group": f"tenant-{g}",
                "contract": CONTRACTS[g % 3], "scope": "m", "blocks": rng.choice(prompts),
                "tail": rng.randrange(1, BLOCK_SIZE), "out": 4,
                "role": ("victim", "attacker")[g % 2],
                "done_t": round(t + rng.randint(1, 4) * 0.001, 6)}) + b"\n")
            if i % 97 == 5:
                fh.write(orjson.dumps({"t": t, "op": "cancel", "id": f"r{i}"}) + b"\n")
    return {"requests": requests, "blocks": requests, "capacity": TINY_CAPACITY}


class Loaded(NamedTuple):
    """A validated trace with its events in memory (the hot loop's input)."""

    header: TraceHeader
    summary: TraceSummary
    hashes: HashTable
    events: list


def load(path: Path) -> Loaded:
    """Validate once, then keep one pass's events (block hashes interned alike)."""
    hashes = HashTable()
    header, summary = validate_trace(str(path), hashes)
    with TraceReader(TraceSource(str(path), path), hashes) as r:
        events = list(r.events())
    return Loaded(header, summary, hashes, events)


def _engine(loaded: Loaded, policy, capacity: int, **kw) -> SimEngine:
    return SimEngine(header=loaded.header, hashes=loaded.hashes, capacity=capacity,
                     policy=policy, contracts=CONTRACTS, done_ids=loaded.summary.done_ids,
                     groups=loaded.summary.groups, cost=INSTANT, **kw)


# -- measurements ------------------------------------------------------------------------
def _stats(values: list[float]) -> dict:
    return {"values": values, "min": min(values), "median": statistics.median(values),
            "n": len(values)}


def hot_loop(loaded: Loaded, policy: str, capacity: int) -> tuple[float, dict]:
    """Seconds for one sim replay of pre-parsed events, no ledger; and its counts."""
    engine = _engine(loaded, make_policy(policy), capacity)
    gc.collect()
    t0 = CLOCK()
    result = engine.run(loaded.events)
    dt = CLOCK() - t0
    return dt, {"evictions": result.evictions, "hit_blocks": result.counts["hit_blocks"],
                "waits": result.counts["waits"],
                "invariants_hold": all(v.holds for v in result.invariants.values())}


def end_to_end(trace: Path, policy: str, capacity: int, out: Path) -> float:
    """Seconds for psgate.api.replay (what ``psgate replay`` runs) with ``policy`` as
    baseline and candidate: validation, two runs, full ledger, requests.csv, receipt."""
    from psgate import api
    cfg = api.ReplayConfig(trace=str(trace), baseline=policy, candidate=policy,
                           capacity=capacity, out=out, force=True, cost=INSTANT,
                           contracts=CONTRACTS)
    gc.collect()
    t0 = CLOCK()
    api.replay(cfg)
    dt = CLOCK() - t0
    shutil.rmtree(out, ignore_errors=True)
    return dt


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
    engine = _engine(loaded, pol, capacity)
    gc.collect()
    result = engine.run(loaded.events)
    in_debt = None
    if hasattr(pol, "group_buckets"):
        now = engine.now / 1e9
        in_debt = sum(1 for g in range(len(pol.gnames))
                      if sum(1 for i in pol.group_buckets[g] if pol.bhat(i, now) < 0) >= 2)
    return {"victims": acc["victims"], "batches": acc["batches"],
            "us_per_victim": 1e6 * acc["t"] / max(1, acc["victims"]),
            "evictions": result.evictions, "groups_in_debt_on_2_contracts": in_debt,
            "invariants_hold": all(v.holds for v in result.invariants.values())}


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
    engine = _engine(loaded, make_policy(policy), capacity)
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
    ledger) and the process's peak RSS."""
    from psgate import api
    api.replay(api.ReplayConfig(trace=trace, baseline="lru", candidate="prefixshield",
                                capacity=TINY_CAPACITY, out=Path(out), force=True,
                                cost=INSTANT, contracts=CONTRACTS))
    shutil.rmtree(out, ignore_errors=True)
    return {"peak_rss": _peak_rss()}


def requests_memory(small: Path, large: Path, n_small: int, n_large: int,
                    work: Path) -> dict:
    """RSS growth per request between two replays, each in its own fresh process."""
    peaks = []
    for trace in (small, large):
        proc = subprocess.run([sys.executable, "-m", "psgate.bench", "--requests-memory-child",
                               str(trace), str(work / "out-requests")], capture_output=True,
                              text=True, env=_child_env())
        if proc.returncode != 0:
            raise RuntimeError(f"memory child failed: {proc.stderr.strip()[-500:]}")
        peaks.append(json.loads(proc.stdout)["peak_rss"])
    if None in peaks:
        return {"requests": [n_small, n_large], "peak_rss": peaks, "bytes_per_request": None}
    return {"requests": [n_small, n_large], "peak_rss": peaks,
            "bytes_per_request": (peaks[1] - peaks[0]) / (n_large - n_small)}


def _child_env() -> dict:
    """The environment for a child running this psgate (its package root on the path)."""
    root = str(Path(__file__).resolve().parents[1])
    env = dict(os.environ)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def memory(policy: str, trace: Path, capacity: int) -> dict:
    proc = subprocess.run([sys.executable, "-m", "psgate.bench", "--memory-child", policy,
                           str(trace), str(capacity)], capture_output=True, text=True,
                          env=_child_env())
    if proc.returncode != 0:
        raise RuntimeError(f"memory child failed: {proc.stderr.strip()[-500:]}")
    return json.loads(proc.stdout)


# -- vLLM ---------------------------------------------------------------------------------
def vllm_status() -> tuple[str | None, str | None]:
    """(version, None) when vLLM imports here, else (None, why not)."""
    from psgate.engines.vllm_pool import vllm_version
    from psgate.errors import EngineUnavailable
    try:
        return vllm_version("bench"), None
    except EngineUnavailable as exc:
        msg = str(exc)
        return None, ("vLLM not installed" if "not installed" in msg else msg)


def vllm_replay(loaded: Loaded, capacity: int, prebuilt: bool) -> tuple[float, int]:
    """Seconds to replay the trace through vLLM's own KVCacheManager (native LRU), as a
    script driving vLLM would, and the prefix-hit blocks it found. ``prebuilt``: the
    ``Request`` objects (and their block hashes) are made before the clock starts."""
    from vllm import SamplingParams
    from vllm.v1.request import Request, RequestStatus

    from psgate.engines.vllm_pool import (make_kv_cache_manager, namespace_salt,
                                          prompt_token_ids)
    bs = loaded.header.block_size
    names = loaded.hashes.names
    cache: dict[int, list[int]] = {}
    reqs = []
    for ev in loaded.events:
        if type(ev) is not RequestEvent:
            raise ValueError("the bench's vLLM driver replays request lines only")
        tokens = prompt_token_ids(ev, names, bs, cache)
        reqs.append((ev.t_ns, ev.done_ns, ev.id, tokens, ev.out,
                     namespace_salt(ev.group, ev.scope)))
    mgr, hasher = make_kv_cache_manager(capacity, bs)
    running, finished = RequestStatus.RUNNING, RequestStatus.FINISHED_STOPPED

    def build(r):
        return Request(r[2], r[3], SamplingParams(max_tokens=max(1, r[4])), None,
                       cache_salt=r[5], block_hasher=hasher)

    built = [build(r) for r in reqs] if prebuilt else None
    heap: list = []
    hit_tokens = 0
    gc.collect()
    t0 = CLOCK()
    for i, r in enumerate(reqs):
        now = r[0]
        while heap and heap[0][0] <= now:
            v = heapq.heappop(heap)[2]
            v.status = finished
            mgr.free(v)
        v = built[i] if prebuilt else build(r)
        computed, n_hit, _ = mgr.get_computed_blocks(v)
        got = mgr.allocate_slots(v, v.num_tokens - n_hit, num_new_computed_tokens=n_hit,
                                 new_computed_blocks=computed, num_lookahead_tokens=r[4])
        if got is None:
            raise RuntimeError(f"vLLM had no room for {r[2]}; bench traces never wait")
        v.status = running
        v.num_computed_tokens = v.num_tokens
        heapq.heappush(heap, (r[1], i, v))
        hit_tokens += n_hit
    while heap:
        v = heapq.heappop(heap)[2]
        v.status = finished
        mgr.free(v)
    return CLOCK() - t0, hit_tokens // bs


def vllm_measure(trace: Path, capacity: int, repeats: int) -> dict:
    """vLLM's two timings on one trace, ``repeats`` times each, after one untimed pass of
    each (a fresh process's first replay pays for warming up, as sim's first round in
    the bench process does not)."""
    version, why = vllm_status()
    if version is None:
        return {"version": None, "note": why}
    loaded = load(trace)
    vllm_replay(loaded, capacity, prebuilt=False)
    vllm_replay(loaded, capacity, prebuilt=True)
    e2e, loop, hits = [], [], set()
    for _ in range(repeats):
        t, h = vllm_replay(loaded, capacity, prebuilt=False)
        e2e.append(t)
        hits.add(h)
        t, h = vllm_replay(loaded, capacity, prebuilt=True)
        loop.append(t)
        hits.add(h)
    return {"version": version, "note": None, "e2e_s": e2e, "loop_s": loop,
            "hit_blocks": sorted(hits)}


def _merge_vllm(acc: dict, one: dict) -> dict:
    """Rounds of vLLM measurements as one: the first round that could not measure wins."""
    if not acc:
        return dict(one)
    if not acc.get("version") or not one.get("version"):
        return acc if not acc.get("version") else dict(one)
    return {"version": acc["version"], "note": None, "e2e_s": acc["e2e_s"] + one["e2e_s"],
            "loop_s": acc["loop_s"] + one["loop_s"],
            "hit_blocks": sorted(set(acc["hit_blocks"]) | set(one["hit_blocks"]))}


def vllm_in_child(python: str, trace: Path, capacity: int, repeats: int) -> dict:
    proc = subprocess.run([python, "-m", "psgate.bench", "--vllm-child", str(trace),
                           str(capacity), str(repeats)], capture_output=True, text=True,
                          env=_child_env())
    if proc.returncode != 0:
        return {"version": None,
                "note": f"{python} failed: {proc.stderr.strip().splitlines()[-1:] or ['?']}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


# -- the run -------------------------------------------------------------------------------
def _target(tid: str, what: str, op: str, threshold: float, num: dict | None,
            den: dict | None, *, invert: bool = False, unit_note: str = "",
            skip: str | None = None) -> dict:
    """A target whose ratio is num/den (``invert``: den/num, for times turned into rates)."""
    t = {"id": tid, "what": what, "op": op, "threshold": threshold, "ratio_min": None,
         "ratio_median": None, "result": "SKIP", "note": skip or unit_note or None}
    if skip is not None or num is None or den is None:
        return t
    if invert:
        rmin, rmed = den["min"] / num["min"], den["median"] / num["median"]
    else:
        rmin, rmed = num["min"] / den["min"], num["median"] / den["median"]
    ok = rmin >= threshold if op == ">=" else rmin <= threshold
    t.update(ratio_min=rmin, ratio_median=rmed, result="PASS" if ok else "MISS")
    return t


def _const(value: float) -> dict:
    return {"values": [value], "min": value, "median": value, "n": 1}


def run(cfg: BenchConfig, progress: Progress | None = None) -> dict:
    say = progress or (lambda msg: None)
    scale = cfg.resolved_scale()
    repeats = cfg.repeats or 3
    if repeats < 1:
        raise ValueError("repeats must be at least 1")
    own_dir = cfg.workdir is None
    work = Path(tempfile.mkdtemp(prefix="psgate-bench-")) if own_dir else cfg.workdir
    work.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    load_start = os.getloadavg() if hasattr(os, "getloadavg") else None
    m: dict[str, dict] = {}
    info: dict[str, dict] = {}
    traces: dict[str, dict] = {}
    try:
        # Reuse and cold traces: hot loop and end to end, lru and prefixshield, and vLLM
        # on the reuse trace. Each round measures every side once, so the sides of a ratio
        # sample the same stretch of a machine whose speed drifts.
        vl: dict = {}
        for name, (n, blocks, cap), cold in (("reuse", scale.reuse, False),
                                             ("cold", scale.cold, True)):
            path = work / f"{name}.jsonl"
            traces[name] = write_reuse_trace(path, n, blocks, cap, cold=cold)
            loaded = load(path)
            nb = traces[name]["blocks"]
            hot: dict[str, list[float]] = {pol: [] for pol in POLICIES}
            e2e: dict[str, list[float]] = {pol: [] for pol in POLICIES}
            for _ in range(repeats):
                for pol in POLICIES:
                    dt, info[f"{name}_{pol}"] = hot_loop(loaded, pol, cap)
                    hot[pol].append(dt)
                    e2e[pol].append(end_to_end(path, pol, cap, work / "out"))
                if name == "reuse":
                    vl = _merge_vllm(vl, vllm_in_child(cfg.vllm_python, path, cap, 1)
                                     if cfg.vllm_python else vllm_measure(path, cap, 1))
            for pol in POLICIES:
                m[f"{name}_hot_{pol}"] = {"what": f"{name} trace, sim hot loop, {pol}",
                                          "unit": "s", **_stats(hot[pol]),
                                          "blocks_per_s": nb / min(hot[pol])}
                m[f"{name}_e2e_{pol}"] = {"what": f"{name} trace, replay end to end, {pol} "
                                                  f"x2",
                                          "unit": "s", **_stats(e2e[pol]),
                                          "blocks_per_s": 2 * nb / min(e2e[pol])}
                say(f"{name} {pol}: hot loop {nb / min(hot[pol]):,.0f} blocks/s, end to end "
                    f"{2 * nb / min(e2e[pol]):,.0f} blocks/s (two runs)")
            del loaded

        if vl.get("version"):
            nb = traces["reuse"]["blocks"]
            m["vllm_e2e"] = {"what": "reuse trace, vLLM Request build + allocate/free",
                             "unit": "s", **_stats(vl["e2e_s"]),
                             "blocks_per_s": nb / min(vl["e2e_s"])}
            m["vllm_loop"] = {"what": "reuse trace, vLLM allocate/free loop", "unit": "s",
                              **_stats(vl["loop_s"]), "blocks_per_s": nb / min(vl["loop_s"])}
            info["vllm"] = {"version": vl["version"], "hit_blocks": vl["hit_blocks"]}
            say(f"vLLM {vl['version']}: {traces['reuse']['blocks'] / min(vl['e2e_s']):,.0f} "
                f"blocks/s with Request building, "
                f"{traces['reuse']['blocks'] / min(vl['loop_s']):,.0f} allocate/free only")
        else:
            info["vllm"] = {"version": None, "note": vl["note"]}
            say(f"{vl['note']}: sim measured alone")

        # victim selection inside a full replay, every group in debt; rounds interleave
        # the scales, as above
        sel_loaded = {}
        for cap, groups, turnovers in scale.select:
            path = work / f"debt_{cap}.jsonl"
            traces[f"debt_{cap}"] = write_debt_trace(path, cap, groups, turnovers)
            sel_loaded[cap] = load(path)
        runs: dict[tuple[int, str], list[dict]] = {}
        for _ in range(repeats):
            for cap, groups, _t in scale.select:
                for pol in POLICIES:
                    runs.setdefault((cap, pol), []).append(
                        time_selection(sel_loaded[cap], pol, cap, groups))
        del sel_loaded
        for cap, groups, _t in scale.select:
            for pol in POLICIES:
                got = runs[(cap, pol)]
                m[f"select_{cap}_{pol}"] = {
                    "what": f"select+evict per victim, {cap} / {groups} groups, {pol}",
                    "unit": "us",
                    **_stats([r["us_per_victim"] for r in got])}
                info[f"select_{cap}_{pol}"] = {k: v for k, v in got[-1].items()
                                               if k != "us_per_victim"}
                say(f"selection {cap}/{groups} {pol}: "
                    f"{m[f'select_{cap}_{pol}']['min']:.2f} us/victim")

        # metadata bytes per resident block, fresh process per policy
        cap = scale.memory_blocks
        path = work / "fill.jsonl"
        traces["fill"] = write_debt_trace(path, cap, 1024 if cap >= 1 << 20 else 64,
                                          turnovers=0.999, warmup_rounds=0)
        for pol in POLICIES:
            r = memory(pol, path, cap)
            info[f"memory_{pol}"] = r
            if r["bytes"] is not None:
                m[f"memory_{pol}"] = {"what": f"RSS per resident block, {pol} "
                                              f"({r['resident']} resident)", "unit": "B",
                                      **_stats([r["bytes"] / r["resident"]])}
                say(f"memory {pol}: {r['bytes'] / r['resident']:.0f} bytes/block")
        path.unlink()

        # replay memory per request, a short and a long trace of tiny requests
        n_small, n_large = scale.memory_requests
        small, large = work / "tiny_small.jsonl", work / "tiny_large.jsonl"
        traces["tiny_small"] = write_tiny_trace(small, n_small)
        traces["tiny_large"] = write_tiny_trace(large, n_large)
        r = requests_memory(small, large, n_small, n_large, work)
        small.unlink()
        large.unlink()
        info["memory_requests"] = r
        if r["bytes_per_request"] is not None:
            m["memory_requests"] = {"what": f"replay peak RSS per request, {n_large} vs "
                                            f"{n_small} requests", "unit": "B",
                                    **_stats([r["bytes_per_request"]])}
            say(f"memory per request: {r['bytes_per_request']:.0f} bytes ({n_large:,} vs "
                f"{n_small:,} requests)")
    finally:
        if own_dir:
            shutil.rmtree(work, ignore_errors=True)

    nb = traces["reuse"]["blocks"]
    novllm = None if "vllm_e2e" in m else info["vllm"]["note"]
    sel0 = f"select_{scale.select[0][0]}_prefixshield"
    big = f"select_{scale.select[-1][0]}_prefixshield" if len(scale.select) > 1 else None

    def halve(d: dict) -> dict:       # e2e times cover two runs: per-run time
        return {k: (v / 2 if k in ("min", "median") else v) for k, v in d.items()}

    targets = [
        _target("e2e_vs_vllm", "sim LRU end to end (ledger) / vLLM with Request build, "
                "blocks/s", ">=", 2.0,
                halve(m["reuse_e2e_lru"]), m.get("vllm_e2e"), invert=True, skip=novllm),
        _target("hot_vs_vllm", "sim LRU hot loop / vLLM allocate-free loop, blocks/s", ">=",
                1.0, m["reuse_hot_lru"], m.get("vllm_loop"), invert=True, skip=novllm),
        _target("ps_lru_hot", "prefixshield / lru blocks/s, sim hot loop", ">=",
                0.6, m["reuse_hot_prefixshield"], m["reuse_hot_lru"], invert=True),
        _target("ps_lru_e2e", "prefixshield / lru blocks/s, end to end", ">=",
                0.6, m["reuse_e2e_prefixshield"], m["reuse_e2e_lru"], invert=True),
        _target("select_4096", f"PrefixShield us/victim, {scale.select[0][0]} / "
                f"{scale.select[0][1]} groups, over {SELECT_TARGET_US:g} us", "<=", 1.0,
                m[sel0], _const(SELECT_TARGET_US)),
        _target("select_growth", "PrefixShield us/victim, 1048576 / 1024 over 4096 / 32",
                "<=", 2.0, m.get(big) if big else None, m[sel0],
                skip=None if big else "full run only"),
        _target("mem_lru", f"lru + engine bytes/block over {BYTES_TARGET:g} B", "<=", 1.0,
                m.get("memory_lru"),
                _const(BYTES_TARGET), skip=None if "memory_lru" in m else "no /proc here"),
        _target("mem_ps", f"prefixshield + engine bytes/block over {BYTES_TARGET:g} B",
                "<=", 1.0,
                m.get("memory_prefixshield"), _const(BYTES_TARGET),
                skip=None if "memory_prefixshield" in m else "no /proc here"),
        _target("cold_hot", "cold trace, prefixshield / lru time, sim hot loop", "<=",
                1.2, m["cold_hot_prefixshield"], m["cold_hot_lru"]),
        _target("cold_e2e", "cold trace, prefixshield / lru time, end to end", "<=",
                1.2, m["cold_e2e_prefixshield"], m["cold_e2e_lru"]),
        _target("mem_requests", f"replay bytes/request at {scale.memory_requests[1]:,} "
                f"requests over {REQUEST_BYTES_TARGET:g} B", "<=", 1.0,
                m.get("memory_requests"), _const(REQUEST_BYTES_TARGET),
                skip=None if "memory_requests" in m else "no peak RSS here"),
    ]
    rates = {"sim_e2e_lru": 2 * nb / m["reuse_e2e_lru"]["min"],
             "sim_hot_lru": nb / m["reuse_hot_lru"]["min"],
             "sim_hot_prefixshield": nb / m["reuse_hot_prefixshield"]["min"]}
    if "vllm_e2e" in m:
        rates["vllm_e2e"] = nb / m["vllm_e2e"]["min"]
        rates["vllm_loop"] = nb / m["vllm_loop"]["min"]
    return {
        "psgate_bench": BENCH_FORMAT,
        "psgate_version": __version__,
        "quick": cfg.quick,
        "repeats": repeats,
        "machine": {"python": sys.version.split()[0], "platform": platform.platform(),
                    "cpus": os.cpu_count(), "loadavg_start": load_start,
                    "loadavg_end": os.getloadavg() if hasattr(os, "getloadavg") else None},
        "clocks": {"s": "CPU seconds of the bench process (time.process_time)",
                   "us": "wall time around each call (time.perf_counter)"},
        "vllm": info["vllm"],
        "traces": traces,
        "measurements": m,
        "blocks_per_s": rates,
        "details": {k: v for k, v in info.items() if k != "vllm"},
        "targets": targets,
        "wall_s": time.perf_counter() - started,
    }


# -- the table -------------------------------------------------------------------------------
def _num(x: float, unit: str) -> str:
    if unit == "s":
        return f"{x:.3f}"
    if unit == "us":
        return f"{x:.2f}"
    return f"{x:,.0f}"


def render(result: dict) -> str:
    """The human table: measurements (min / median) and targets (ratio, PASS/MISS)."""
    lines = []
    mach = result["machine"]
    load = mach.get("loadavg_start")
    lines.append(f"psgate bench {'--quick ' if result['quick'] else ''}(psgate "
                 f"{result['psgate_version']}, Python {mach['python']}, {mach['cpus']} CPUs"
                 + (f", load average {load[0]:.2f} at start" if load else "")
                 + f"; {result['repeats']} repeats; {result['wall_s']:.0f} s)")
    lines.append("clocks: " + "; ".join(f"{k}: {v}" for k, v in result["clocks"].items()))
    v = result["vllm"]
    lines.append(f"vLLM: {v['version']}" if v.get("version") else f"vLLM: {v['note']}")
    lines.append("traces: " + "; ".join(
        f"{k} {t['requests']} requests, {t['blocks']} blocks, capacity {t['capacity']}"
        for k, t in result["traces"].items()))
    lines.append("")
    w = max(len(x["what"]) for x in result["measurements"].values())
    lines.append(f"{'measurement':<{w}}  {'unit':>4}  {'min':>10}  {'median':>10}  "
                 f"{'blocks/s (min)':>14}")
    for x in result["measurements"].values():
        bps = f"{x['blocks_per_s']:,.0f}" if "blocks_per_s" in x else ""
        lines.append(f"{x['what']:<{w}}  {x['unit']:>4}  {_num(x['min'], x['unit']):>10}  "
                     f"{_num(x['median'], x['unit']):>10}  {bps:>14}")
    lines.append("")
    w = max(len(t["what"]) for t in result["targets"])
    lines.append(f"{'target':<13} {'what':<{w}}  {'ratio':>7}  {'(median)':>8}  {'goal':>7}  "
                 f"result")
    for t in result["targets"]:
        r = "" if t["ratio_min"] is None else f"{t['ratio_min']:.2f}"
        rm = "" if t["ratio_median"] is None else f"{t['ratio_median']:.2f}"
        note = f"  ({t['note']})" if t["result"] == "SKIP" and t["note"] else ""
        lines.append(f"{t['id']:<13} {t['what']:<{w}}  {r:>7}  {rm:>8}  "
                     f"{t['op']} {t['threshold']:<4g}  {t['result']}{note}")
    return "\n".join(lines) + "\n"


def _main(argv: list[str]) -> None:
    """Child entry points: --memory-child POLICY TRACE CAPACITY, --requests-memory-child
    TRACE OUT, --vllm-child TRACE CAPACITY REPEATS; each prints one JSON line."""
    if argv[:1] == ["--memory-child"]:
        print(json.dumps(memory_child(argv[1], argv[2], int(argv[3]))))
    elif argv[:1] == ["--requests-memory-child"]:
        print(json.dumps(requests_memory_child(argv[1], argv[2])))
    elif argv[:1] == ["--vllm-child"]:
        print(json.dumps(vllm_measure(Path(argv[1]), int(argv[2]), int(argv[3]))))
    else:
        raise SystemExit("usage: psgate bench [--quick] [--json] (this module's own entry "
                         "points are for its child processes)")


if __name__ == "__main__":
    _main(sys.argv[1:])
