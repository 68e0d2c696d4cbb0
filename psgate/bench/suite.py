"""The bench run: every measurement in rounds, then the targets as ratios."""

from __future__ import annotations

import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import orjson

from psgate import __version__, core
from psgate.errors import InputError
from psgate.policies import resolve
from psgate.bench.memory import command_cost, memory, peak_growth
from psgate.bench.timing import end_to_end, hot_loop, time_selection
from psgate.bench.traces import (load, write_debt_trace, write_mooncake_trace,
                                 write_reuse_trace, write_tenants_trace, write_tiny_trace)
from psgate.bench.vllm_driver import merge_vllm, vllm_in_child, vllm_measure

BENCH_FORMAT = 1
SELECT_TARGET_US = 2.0
CORE_TARGET = 10.0           # compiled core over the Python engine, same replay
BYTES_TARGET = 200.0
REQUEST_BYTES_TARGET = 300.0
# A replay's receipt holds each tenant's metrics for both runs and its gate checks (about
# 3.3 KB of JSON per tenant); what a replay holds per tenant is that receipt in memory and
# its running sums. A G x G structure would be 8 bytes x G per tenant: 400 KB at 50,000.
GROUP_BYTES_TARGET = 24_000.0
Progress = Callable[[str], None]
POLICIES = ("lru", "prefixshield")


@dataclass(frozen=True)
class Scale:
    reuse: tuple[int, int, int]          # requests, blocks per request, capacity
    cold: tuple[int, int, int]
    # (capacity, groups, cache turnovers after the warm-up); the first is the per-victim
    # target and the growth's denominator, so it turns over often enough (about 130,000
    # victims at full scale) that its time is the code's, not one quiet or busy moment's
    select: tuple[tuple[int, int, float], ...]
    memory_blocks: int
    memory_requests: tuple[int, int] = (100_000, 1_000_000)     # small, large trace
    memory_groups: tuple[int, int] = (5_000, 50_000)             # few, many tenants


QUICK = Scale(reuse=(400, 32, 1024), cold=(400, 32, 1024), select=((4096, 32, 1.0),),
              memory_blocks=65536, memory_requests=(10_000, 50_000),
              memory_groups=(1_000, 5_000))
FULL = Scale(reuse=(10000, 64, 131072), cold=(4000, 64, 16384),
             select=((4096, 32, 32.0), (1048576, 1024, 1.0)), memory_blocks=1048576,
             memory_requests=(100_000, 1_000_000))


@dataclass
class BenchConfig:
    quick: bool = False
    repeats: int | None = None           # default: 3
    vllm_python: str | None = None       # measure vLLM with this interpreter
    workdir: Path | None = None          # default: a temporary directory, removed after
    scale: Scale | None = None           # default: QUICK or FULL
    mooncake: Path | None = None         # a Mooncake trace: its first requests replayed
    mooncake_requests: int = 6000        # compiled and in Python (core_vs_python_mooncake)
    mooncake_capacity: int = 16384
    mooncake_block_size: int = 16        # re-blocked from Mooncake's 512 tokens, as vLLM's 16
    policy: str | None = None            # a policy spec (a user's): timed beside lru

    def resolved_scale(self) -> Scale:
        return self.scale or (QUICK if self.quick else FULL)


def _stats(values: list[float]) -> dict:
    return {"values": values, "min": min(values), "median": statistics.median(values),
            "n": len(values)}


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
    if cfg.policy:
        cls = resolve(cfg.policy, "--policy").cls   # a spec that does not load: before timing
        if getattr(cls, "needs_future", False):
            raise InputError(f"expected a deployable policy; '{cfg.policy}' needs the trace's "
                             f"future, which the bench's timed replays do not give",
                             path="--policy")
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
            timed = tuple(dict.fromkeys(POLICIES + ((cfg.policy,) if cfg.policy and name == "reuse"
                                                   else ())))
            hot: dict[str, list[float]] = {pol: [] for pol in timed}
            e2e: dict[str, list[float]] = {pol: [] for pol in timed}
            step: list[float] = []
            pure: list[float] = []
            for _ in range(repeats):
                for pol in timed:
                    dt, info[f"{name}_{pol}"] = hot_loop(loaded, pol, cap)
                    hot[pol].append(dt)
                    e2e[pol].append(end_to_end(path, pol, cap, work / "out"))
                if name == "reuse" and core.get() is not None:
                    pure.append(end_to_end(path, "lru", cap, work / "out", python=True))
                if name == "reuse":       # the step scheduler and vLLM, in the same rounds
                    dt, info["reuse_step_lru"] = hot_loop(loaded, "lru", cap, "step")
                    step.append(dt)
                    vl = merge_vllm(vl, vllm_in_child(cfg.vllm_python, path, cap, 1)
                                     if cfg.vllm_python else vllm_measure(path, cap, 1))
            if pure:
                m["reuse_e2e_lru_python"] = {"what": "reuse trace, replay end to end, lru x2, "
                                                     "interpreted (PSGATE_CORE=0)",
                                             "unit": "s", **_stats(pure),
                                             "blocks_per_s": 2 * nb / min(pure)}
            if step:
                m["reuse_hot_step_lru"] = {"what": "reuse trace, sim hot loop, lru, step "
                                                   "scheduler", "unit": "s", **_stats(step),
                                           "blocks_per_s": nb / min(step)}
                say(f"{name} lru, step scheduler: hot loop {nb / min(step):,.0f} blocks/s")
            for pol in timed:
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

        # a real trace, compiled and in Python, rounds interleaved as above
        if cfg.mooncake is not None and core.get() is not None:
            path = work / "mooncake.jsonl"
            traces["mooncake"] = {**write_mooncake_trace(path, cfg.mooncake,
                                                         cfg.mooncake_requests,
                                                         cfg.mooncake_block_size),
                                  "capacity": cfg.mooncake_capacity}
            got: dict[str, list[float]] = {"compiled": [], "python": []}
            for _ in range(repeats):
                for code in got:
                    got[code].append(end_to_end(path, "lru", cfg.mooncake_capacity,
                                                work / "out", python=code == "python",
                                                candidate="prefixshield", scheduler="step"))
            for code, values in got.items():
                m[f"mooncake_{code}"] = {
                    "what": f"Mooncake, first {cfg.mooncake_requests} requests, "
                            f"{cfg.mooncake_block_size}-token blocks, "
                            f"{cfg.mooncake_capacity} blocks, lru vs prefixshield end to end "
                            f"(step scheduler, the default ledger: compact, every row), {code}",
                    "unit": "s", **_stats(values)}
            say(f"Mooncake {cfg.mooncake_requests} requests: compiled "
                f"{m['mooncake_compiled']['min']:.1f} s, Python {m['mooncake_python']['min']:.1f} s")
            # explain on that receipt, each question in a fresh process: memory bounded by
            # what the answer needs, time linear in the ledger rows read before it
            rcpt = work / "mooncake-receipt"
            end_to_end(path, "lru", cfg.mooncake_capacity, rcpt, candidate="prefixshield",
                       scheduler="step", keep=True)
            first = next(orjson.loads(x) for x in path.read_bytes().splitlines()[1:]
                         if b'"request"' in x)
            questions = {"decision": ["--decision", "2"],
                         "decision_baseline": ["--decision", "2", "--run", "baseline"],
                         "request": ["--request", first["id"]]}
            for q, args in questions.items():
                r = command_cost(["explain", str(rcpt), *args])
                m[f"explain_mooncake_{q}"] = {
                    "what": f"explain {' '.join(args)} on that Mooncake receipt, CPU "
                            f"(peak RSS {r['peak_rss'] / 1e6:.0f} MB)", "unit": "s",
                    **_stats([r["cpu_s"]])}
                info[f"explain_mooncake_{q}"] = r
                say(f"explain {' '.join(args)}: {r['cpu_s']:.1f} s, "
                    f"{r['peak_rss'] / 1e6:.0f} MB")
            shutil.rmtree(rcpt, ignore_errors=True)
            path.unlink()

        # replay memory per request (a short and a long trace of tiny requests) and per
        # tenant (few and many tenants, two requests each): the growth between the two
        for key, unit, counts, write in (
                ("memory_requests", "request", scale.memory_requests, write_tiny_trace),
                ("memory_groups", "tenant", scale.memory_groups, write_tenants_trace)):
            paths = (work / f"{unit}_small.jsonl", work / f"{unit}_large.jsonl")
            for path, n, size in zip(paths, counts, ("small", "large")):
                traces[f"{unit}_{size}"] = write(path, n)
            r = peak_growth(paths, counts, work)
            for path in paths:
                path.unlink()
            info[key] = r
            if r["bytes_per_unit"] is not None:
                m[key] = {"what": f"replay peak RSS per {unit}, {counts[1]} vs {counts[0]} "
                                  f"{unit}s", "unit": "B", **_stats([r["bytes_per_unit"]])}
                say(f"memory per {unit}: {r['bytes_per_unit']:.0f} bytes ({counts[1]:,} vs "
                    f"{counts[0]:,} {unit}s)")
    finally:
        if own_dir:
            shutil.rmtree(work, ignore_errors=True)

    nb = traces["reuse"]["blocks"]
    novllm = None if "vllm_e2e" in m else info["vllm"]["note"]
    nocore = None if core.get() is not None else "the compiled core is not built here"
    sel0 = f"select_{scale.select[0][0]}_prefixshield"
    big = f"select_{scale.select[-1][0]}_prefixshield" if len(scale.select) > 1 else None

    def halve(d: dict) -> dict:       # e2e times cover two runs: per-run time
        return {k: (v / 2 if k in ("min", "median") else v) for k, v in d.items()}

    own = cfg.policy
    noown = None if own else "needs --policy SPEC"
    own_note = ""
    if own:
        evictions = info[f"reuse_{own}"]["evictions"]
        extra = m[f"reuse_hot_{own}"]["min"] - m["reuse_hot_lru"]["min"]
        info["policy"] = {"spec": own, "evictions": evictions,
                          "extra_us_per_eviction": (1e6 * extra / evictions
                                                    if evictions else None)}
        own_note = (f"{own}: {1e6 * extra / evictions:+.2f} us per eviction over lru's, "
                    f"{evictions} evictions" if evictions else f"{own}: no eviction")

    targets = [
        _target("e2e_vs_vllm", "sim LRU end to end (ledger) / vLLM with Request build, "
                "blocks/s", ">=", 5.0,
                halve(m["reuse_e2e_lru"]), m.get("vllm_e2e"), invert=True, skip=novllm),
        _target("hot_vs_vllm", "sim LRU hot loop / vLLM allocate-free loop, blocks/s", ">=",
                3.0, m["reuse_hot_lru"], m.get("vllm_loop"), invert=True, skip=novllm),
        _target("core_vs_python", "compiled core / Python engine, LRU end to end (ledger), "
                "reuse trace", ">=", CORE_TARGET, m["reuse_e2e_lru"],
                m.get("reuse_e2e_lru_python"), invert=True, skip=nocore),
        _target("core_vs_python_mooncake", "compiled core / Python engine, Mooncake replay "
                "end to end", ">=", CORE_TARGET, m.get("mooncake_compiled"),
                m.get("mooncake_python"), invert=True,
                skip=nocore or (None if "mooncake_compiled" in m else "needs --mooncake FILE")),
        _target("step_vs_service_hot", "step scheduler / service model blocks/s, sim LRU "
                "hot loop", ">=", 0.8, m["reuse_hot_step_lru"], m["reuse_hot_lru"],
                invert=True),
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
        _target("policy_lru_e2e", f"--policy's replay time / lru's, end to end (ledger), "
                f"reuse trace", "<=", 3.0, m.get(f"reuse_e2e_{own}"), m["reuse_e2e_lru"],
                unit_note=own_note, skip=noown),
        _target("mem_groups", f"replay bytes/tenant at {scale.memory_groups[1]:,} "
                f"tenants over {GROUP_BYTES_TARGET:g} B", "<=", 1.0,
                m.get("memory_groups"), _const(GROUP_BYTES_TARGET),
                skip=None if "memory_groups" in m else "no peak RSS here"),
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
        "replay_code": core.describe(),
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
