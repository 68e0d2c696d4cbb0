"""The paper reproduction's experiment: which cells run, the corpora the real benign rows
replay, and running the cells.

Everything here decides what is computed; nothing here reads results. The paper's
reference values come from paper_values.json (the creation-pressure ratios are also axes
of the plan), so the report and the plan name the same numbers.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

from psgate.engines.cost import CostModel
from psgate.engines.step_cost import SchedulerParams, StepCostModel
from psgate.sweep import SweepConfig, cells, run_cell
from psgate.trace.importers import import_trace
from psgate.trace.writer import write_trace
from psgate.workloads import generators

ROOT = Path(__file__).resolve().parents[2]
PAPER_VALUES = Path(__file__).resolve().parent / "paper_values.json"


# The replay model of every cell: vLLM's scheduler (psgate's step scheduler) with its
# default settings on the default step cost model; generators whose rates derive from
# capacity take them from the same model (``rates=step``: C_prefill measured under it).
SCHEDULER = "step"
SCHED = SchedulerParams()
STEP_COST = StepCostModel()
STEP_RATES = {"rates": "step"}


def rate_params(kind: str) -> dict:
    """What a generated workload adds to its parameters so its rates come from the step
    model (nothing for generators with fixed rates)."""
    gen = generators().get(kind)
    return dict(STEP_RATES) if gen is not None and gen.uses_cost else {}


def paper_values() -> dict:
    """Each reference entry's values, keyed as in paper_values.json."""
    raw = json.loads(PAPER_VALUES.read_text())
    return {k: v["values"] for k, v in raw.items() if isinstance(v, dict)}


PAPER_PRESSURES = tuple(p["ratio"] for p in paper_values()["creation_pressure"])
PRESSURES_BEYOND = (10.0, 20.0)     # between the paper's range and one-touch's default

ATTACKS = ("one-touch", "low-and-slow", "two-pass-replay")
TRADEOFF_TRACES = ("one-touch", "low-and-slow", "two-pass-replay", "delayed-replay", "sharegpt",
                   "sharegpt-bursty")
BOUNDS = (0.05, 0.1, 0.2, "adaptive")
CANDIDATES = (("s3fifo", {}), ("static-quota", {}), ("prefixshield", {}),
              ("prefixshield", {"leaf_only": False}), ("belady", {}))
PSB_ATTACKS = ("one-touch", "low-and-slow", "two-pass-replay", "delayed-replay")
BENIGN = ("sharegpt", "sharegpt-bursty")
BENIGN_CAPACITIES = (512, 1024, 2048)
BENIGN_POLICIES = ("s3fifo", "prefixshield", "prefixshield-b")
# The field's eviction policies (what the serving stacks ship or propose, at their sources'
# defaults) on every attack and benign trace, beside the policies above and belady. The
# generated traces at 512 blocks; each real corpus at the capacity --quick runs it at.
FIELD = ("fifo", "mru", "lfu", "slru", "tlru", "arc", "tinylfu", "isolated-lru")
FIELD_TRACES = ATTACKS + BENIGN


def field_capacity(name: str, tiny: bool) -> int:
    """The capacity of a real corpus's field cells."""
    return TINY_REAL[name]["capacities"][0] if tiny else REAL[name]["capacities"][1]

# Real benign traces: public samples in examples/traces/, imported with psgate's importers.
# Tenants: Mooncake requests split into `tenants` groups by hash_ids[1] mod `tenants` (the
# block after the shared system-prompt block follows the conversation), WEKA one group per
# session file; contracts critical / standard / best-effort in turn by group. Neither
# format says how long a request holds its blocks, so each gets done_t = t + HOLD_S +
# HOLD_PER_OUT_S x output tokens, written into the trace; hit fractions do not depend on
# the cost model's prefill queue then.
HOLD_S, HOLD_PER_OUT_S = 0.05, 0.0002
REAL = {
    "mooncake": {"sample": "examples/traces/mooncake_conversation_6000.jsonl",
                 "windows": 5, "requests": 1200, "block_tokens": 512, "tenants": 6,
                 "capacities": (1024, 2048, 4096, 8192)},
    "weka": {"sample": "examples/traces/weka-small", "bundles": 5, "block_tokens": 64,
             "capacities": (512, 1024, 2048, 4096)},
}
TINY_REAL = {"mooncake": {"windows": 2, "requests": 150, "capacities": (1024,)},
             "weka": {"bundles": 2, "sessions": 6, "capacities": (1024,)}}


def label(name: str, params: dict) -> str:
    return name + ("" if not params else
                   "(" + ",".join(f"{k}={json.dumps(v)}" for k, v in params.items()) + ")")


def plan(quick: bool, tiny: bool = False) -> list[tuple]:
    """(section, workload params incl. kind, candidate, candidate params, capacity[,
    baseline]); a workload {"kind": NAME, "corpus": True} is a real-trace corpus."""
    out = []
    for kind in ATTACKS:
        for cand, cp in CANDIDATES:
            out.append(("table1", {"kind": kind}, cand, cp, 512))
        out.append(("control", {"kind": kind, "attack": False}, "prefixshield", {}, 512))
    for kind in ("sharegpt", "sharegpt-bursty"):
        for cand, cp in (("s3fifo", {}), ("prefixshield", {}), ("belady", {})):
            out.append(("table2", {"kind": kind}, cand, cp, 512))
    for cand in ("s3fifo", "static-quota", "prefixshield", "belady"):
        out.append(("table3", {"kind": "borrowing"}, cand, {}, 512))
    for cap in ((1024,) if quick else (1024, 2048, 4096)):
        for cand, cp in (("prefixshield", {}), ("belady", {})):
            out.append(("fig2-capacity", {"kind": "one-touch", "capacity_target": cap}, cand,
                        cp, cap))
    for alpha in (0.4, 0.8):
        out.append(("fig2-load", {"kind": "one-touch", "alpha": alpha}, "prefixshield", {}, 512))
    for ratio in (*PAPER_PRESSURES, *(() if quick else PRESSURES_BEYOND)):
        for cand in (("prefixshield",) if quick else ("prefixshield", "belady")):
            out.append(("fig2-pressure", {"kind": "one-touch", "creation_pressure": ratio},
                        cand, {}, 512))
    for kind in ("one-touch", "low-and-slow", "sharegpt", "borrowing"):
        out.append(("fig3a", {"kind": kind}, "prefixshield-noseg", {}, 512))
        if kind in ("sharegpt", "borrowing"):
            out.append(("fig3a", {"kind": kind}, "prefixshield", {}, 512))
    for frac in (0.0, 0.5, 1.0):
        for cand in ("prefixshield", "prefixshield-nogate", "lru"):
            out.append(("fig3b", {"kind": "delayed-replay", "delay_fraction": frac}, cand, {},
                        512))
    # Beyond the paper: psgate's prefixshield-b (bounded Probationary segment) against the
    # paper's policies on every attack and benign trace, fixed bounds and adaptive.
    for kind in TRADEOFF_TRACES:
        for bound in BOUNDS:
            out.append(("tradeoff", {"kind": kind}, "prefixshield-b",
                        {"probationary_bound": bound}, 512))
        if kind in ("delayed-replay",):
            for cand in ("s3fifo", "prefixshield"):
                out.append(("tradeoff", {"kind": kind}, cand, {}, 512))
    # prefixshield-b (default, adaptive) against PrefixShield itself on the attack traces:
    # the paired difference in victim hit fraction.
    for kind in PSB_ATTACKS:
        out.append(("psb-vs-ps", {"kind": kind}, "prefixshield-b", {}, 512, "prefixshield"))
    # benign traces at more capacities (512 comes from table2 and tradeoff)
    for kind in BENIGN:
        for cap in BENIGN_CAPACITIES[1:2 if quick else None]:
            for cand in BENIGN_POLICIES:
                out.append(("benign", {"kind": kind}, cand, {}, cap))
    # real benign traces
    for name, real in REAL.items():
        caps = TINY_REAL[name]["capacities"] if tiny else (
            real["capacities"][1:2] if quick else real["capacities"])
        for cap in caps:
            for cand in BENIGN_POLICIES:
                out.append(("real", {"kind": name, "corpus": True}, cand, {}, cap))
    # the field's policies (the other policies' cells above are reused)
    for kind in FIELD_TRACES:
        for cand in FIELD:
            out.append(("field", {"kind": kind}, cand, {}, 512))
    for name in REAL:
        for cand in (*FIELD, "belady"):
            out.append(("field", {"kind": name, "corpus": True}, cand, {},
                        field_capacity(name, tiny)))
    return out


# --tiny: shrunken workloads that exercise the whole pipeline in about a minute (the tests
# use it); its numbers are not the paper's experiment and the report says so.
TINY = {"one-touch": {"attack_requests": 24, "warmup_s": 2.0, "cooldown_s": 1.0},
        "low-and-slow": {"attack_requests": 24, "warmup_s": 2.0, "cooldown_s": 1.0},
        "two-pass-replay": {"attack_requests": 24, "warmup_s": 2.0, "cooldown_s": 1.0},
        "sharegpt": {"conversations": 16}, "sharegpt-bursty": {"conversations": 16},
        "borrowing": {"duration_s": 8.0}, "delayed-replay": {}}


def specs(quick: bool, runs: int, seed: int, out: Path, tiny: bool = False,
          corpora: dict[str, Path] | None = None) -> list[tuple[str, str, dict]]:
    """(section, workload or corpus name, cell spec) per cell."""
    result = []
    for section, wl, cand, cp, cap, *base in plan(quick or tiny, tiny):
        if tiny and cap > 1024:
            continue
        common = dict(out=out, candidate=cand, candidate_params=cp, capacity=cap,
                      baseline=base[0] if base else "lru", resamples=2000, cost=CostModel(),
                      scheduler=SCHEDULER, step_cost=STEP_COST, sched=SCHED)
        if wl.get("corpus"):
            cfg = SweepConfig(workload=None, corpus=corpora[wl["kind"]], runs=runs,
                              allow_unexercised=True, **common)
        else:
            params = {**(TINY[wl["kind"]] if tiny else {}),
                      **{k: v for k, v in wl.items() if k != "kind"},
                      **rate_params(wl["kind"])}
            text = wl["kind"] + ("" if not params else ":" + ",".join(
                f"{k}={json.dumps(v)}" for k, v in params.items()))
            cfg = SweepConfig(workload=text, runs=runs, seed=seed, **common)
        (spec,) = cells(cfg)
        spec["id"] = f"{section}-{wl['kind']}-{spec['id'].split('-', 1)[1]}"
        result.append((section, wl["kind"], spec))
    return result


def with_hold(lines: list[dict], note: dict, key: str = "paper_reproduction") -> list[dict]:
    """The imported lines with done_t = t + HOLD_S + HOLD_PER_OUT_S x out on every request
    and ``note`` (how the trace was cut from its sample) in the header, under ``key``."""
    header = dict(lines[0], **{key: {
        **note, "hold": f"done_t = t + {HOLD_S} s + {HOLD_PER_OUT_S} s x out (the sample "
                        "records no completion times)"}})
    body = []
    for line in lines[1:]:
        line = dict(line)
        line["done_t"] = round(line["t"] + HOLD_S + HOLD_PER_OUT_S * line["out"], 6)
        body.append(line)
    return [header] + body


def import_sessions(files: list[Path], bundle: Path) -> list[dict]:
    """WEKA session ``files`` as one trace: copied into the new directory ``bundle``, one
    tenant per session file, contracts critical / standard / best-effort in turn."""
    bundle.mkdir()
    for f in files:
        shutil.copyfile(f, bundle / f.name)
    return import_trace("weka", bundle, group_by="file", contracts_cycle=True)


def build_corpora(out: Path, tiny: bool = False) -> dict[str, Path]:
    """Import the real samples into OUT/cells/corpus-NAME/ (rewritten each time, byte-
    identical for the same samples): Mooncake as consecutive windows of requests, WEKA as
    bundles of sessions."""
    dirs = {}
    for name, real in REAL.items():
        cfg = {**real, **(TINY_REAL[name] if tiny else {})}
        d = out / "cells" / f"corpus-{name}"
        if d.exists():
            shutil.rmtree(d)
        d.mkdir(parents=True)
        sample = ROOT / real["sample"]
        with tempfile.TemporaryDirectory() as tmp:
            tmp = Path(tmp)
            if name == "mooncake":
                src = sample.read_bytes().splitlines(keepends=True)
                n = cfg["requests"]
                for k in range(cfg["windows"]):
                    raw = tmp / f"window-{k}.jsonl"
                    raw.write_bytes(b"".join(src[k * n:(k + 1) * n]))
                    lines = import_trace("mooncake", raw, group_by=f"hash-mod:{cfg['tenants']}",
                                         contracts_cycle=True)
                    write_trace(d / f"mooncake-w{k}.jsonl", with_hold(lines, {
                        "sample": real["sample"], "lines": [k * n + 1, (k + 1) * n]}))
            else:
                files = sorted(sample.glob("trace_*.json"),
                               key=lambda f: (f.stat().st_size, f.name))
                files = files[:cfg.get("sessions", len(files))]
                for k in range(cfg["bundles"]):
                    picked = files[k::cfg["bundles"]]
                    lines = import_sessions(picked, tmp / f"bundle-{k}")
                    write_trace(d / f"weka-b{k}.jsonl", with_hold(lines, {
                        "sample": real["sample"], "sessions": [f.name for f in picked]}))
        dirs[name] = d
    return dirs


def _run(args):
    spec, out = args
    t0 = time.perf_counter()
    row = run_cell(spec, out)
    return spec["id"], row, time.perf_counter() - t0


def run_cells(todo: list[tuple[str, str, dict]], out: Path, workers: int) -> dict[str, dict]:
    """Every cell's sweep row by cell id, in worker processes; each cell resumes from its
    receipt when one is complete."""
    results: dict[str, dict] = {}
    with ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn")) as pool:
        for n, (cid, row, secs) in enumerate(pool.map(_run, [(s, str(out)) for *_, s in todo]),
                                             1):
            results[cid] = row
            print(f"[{n}/{len(todo)}] {cid} {secs:.1f} s{' (resumed)' if row['resumed'] else ''}",
                  file=sys.stderr, flush=True)
    return results
