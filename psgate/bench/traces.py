"""The bench's seeded traces, and loading one into memory as the hot loop's input."""

from __future__ import annotations

import random
from pathlib import Path
from typing import NamedTuple

import orjson

from psgate.contracts import CONTRACT_NAMES
from psgate.engines.cost import CostModel
from psgate.engines import engine_class
from psgate.engines.sim import SimEngine
from psgate.engines.step_cost import StepCostModel
from psgate.trace.model import TraceHeader, TraceSummary
from psgate.trace.reader import HashTable, TraceReader, TraceSource, validate_trace
from psgate.trace.writer import header_line

# Zero service time: each request holds its blocks exactly from t to done_t.
INSTANT = CostModel(0.0, 0.0, 0.0, 0.0)
# Zero step time for the step scheduler (each step lasts the clock's 1 ns): nothing queues
# behind a modeled device, so what is measured is psgate's own per-request state.
INSTANT_STEPS = StepCostModel(0.0, 0.0, 0.0, 0.0, 0.0)
BLOCK_SIZE = 16
OUT_TOKENS = 16
WARMUP_ROUNDS = 10
TINY_CAPACITY = 256


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
                "contract": CONTRACT_NAMES[g % 3], "scope": "m", "blocks": hashes,
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
                "contract": CONTRACT_NAMES[(i // groups) % 2], "scope": "m",
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
                "contract": CONTRACT_NAMES[g % 3], "scope": "m", "blocks": rng.choice(prompts),
                "tail": rng.randrange(1, BLOCK_SIZE), "out": 4,
                "role": ("victim", "attacker")[g % 2],
                "done_t": round(t + rng.randint(1, 4) * 0.001, 6)}) + b"\n")
            if i % 97 == 5:
                fh.write(orjson.dumps({"t": t, "op": "cancel", "id": f"r{i}"}) + b"\n")
    return {"requests": requests, "blocks": requests, "capacity": TINY_CAPACITY}


def write_tenants_trace(path: Path, groups: int, per_group: int = 2, seed: int = 1) -> dict:
    """``per_group`` rounds over ``groups`` tenants, one two-block request each, 0.1 ms
    apart and held 0.1 ms: every tenant reuses its own prompt, so a larger trace adds
    tenants, not blocks per tenant (the state that must grow linearly in tenants)."""
    rng = random.Random(seed)
    dt = 0.0001
    with open(path, "wb") as fh:
        fh.write(orjson.dumps(header_line(BLOCK_SIZE, source=f"psgate bench tenants "
                                                              f"groups={groups} seed={seed}"))
                 + b"\n")
        for i in range(groups * per_group):
            g = i % groups
            t = round(i * dt, 6)
            fh.write(orjson.dumps({
                "t": t, "op": "request", "id": f"r{i}", "group": f"tenant-{g}",
                "contract": CONTRACT_NAMES[g % 3], "scope": "m",
                "blocks": [f"{2 * g:x}", f"{2 * g + 1:x}"], "tail": rng.randrange(1, BLOCK_SIZE),
                "out": 4, "role": "benign", "done_t": round(t + dt, 6)}) + b"\n")
    return {"requests": groups * per_group, "blocks": 2 * groups, "groups": groups,
            "capacity": TINY_CAPACITY}


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


def make_engine(loaded: Loaded, policy, capacity: int, scheduler: str = "service",
                **kw) -> SimEngine:
    """A sim engine over pre-parsed events (``scheduler="step"``: the step scheduler,
    with its default step cost model)."""
    return engine_class("sim", scheduler)(
        header=loaded.header, hashes=loaded.hashes, capacity=capacity, policy=policy,
        contracts=CONTRACT_NAMES, done_ids=loaded.summary.done_ids,
        groups=loaded.summary.groups, cost=INSTANT, **kw)


def write_mooncake_trace(path: Path, source: Path, requests: int, block_size: int) -> dict:
    """The first ``requests`` requests of a Mooncake trace file, imported as psgate's
    importer does (``psgate trace import --format mooncake --block-size B --option
    limit=N``)."""
    from psgate.trace.importers import import_trace
    lines = import_trace("mooncake", source, limit=requests, block_size=block_size)
    with open(path, "wb") as fh:
        for line in lines:
            fh.write(orjson.dumps(line) + b"\n")
    num = sum(1 for x in lines if x.get("op") == "request")
    return {"requests": num, "source": str(source), "blocks": sum(
        len(x.get("blocks", ())) for x in lines if x.get("op") == "request")}
