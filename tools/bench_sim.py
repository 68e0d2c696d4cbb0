"""Throughput of the sim engine on a large synthetic trace, in prompt blocks per second.

    python tools/bench_sim.py [--requests 20000] [--blocks 64] [--capacity 4096] [--profile]

Builds a seeded multi-tenant trace (hot shared prefixes plus unique suffixes,
so there are hits, misses and evictions), then measures in one process:
  validate    parsing + validation alone (one pass)
  hot loop    the engine alone on pre-parsed events, no ledger
  end to end  psgate.api.replay with two policies and full ledgers (parse, replay, write),
              counted as 2x the trace's blocks
Ratios between the three are what to compare across machines.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from psgate import api  # noqa: E402
from psgate.engines.sim import SimEngine  # noqa: E402
from psgate.policies import make_policy  # noqa: E402
from psgate.trace.reader import HashTable, TraceReader, TraceSource, validate_trace  # noqa: E402
from psgate.trace.writer import dump_lines, header_line  # noqa: E402


def make_trace(n: int, blocks: int, seed: int = 1) -> list[dict]:
    rng = random.Random(seed)
    lines = [header_line(16, source=f"bench n={n} blocks={blocks} seed={seed}")]
    t = 0.0
    for i in range(n):
        t = round(t + rng.expovariate(1 / 0.01), 4)
        g = rng.randrange(8)
        p = rng.randrange(4)
        prefix = [f"{g:02x}{p:02x}{j:04x}" for j in range(blocks // 2)]
        suffix = [f"ff{i:08x}{j:04x}" for j in range(blocks - len(prefix))]
        lines.append({"t": t, "op": "request", "id": f"r{i}", "group": f"tenant-{g}",
                      "contract": ("critical", "standard", "best-effort")[g % 3], "scope": "m",
                      "blocks": prefix + suffix, "tail": rng.randrange(16), "out": 16,
                      "done_t": round(t + rng.uniform(0.05, 0.5), 4)})
    return lines


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=20000)
    ap.add_argument("--blocks", type=int, default=64)
    ap.add_argument("--capacity", type=int, default=4096)
    ap.add_argument("--policy", default="lru")
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp())
    trace = tmp / "bench.jsonl"
    trace.write_bytes(dump_lines(make_trace(args.requests, args.blocks)))
    n_blocks = args.requests * args.blocks
    print(f"trace: {args.requests} requests x {args.blocks} blocks = {n_blocks} blocks, "
          f"{trace.stat().st_size / 1e6:.1f} MB, capacity {args.capacity}")

    t0 = time.perf_counter()
    hashes = HashTable()
    header, summary = validate_trace(str(trace), hashes)
    t_val = time.perf_counter() - t0
    print(f"validate:    {n_blocks / t_val:12,.0f} blocks/s ({t_val:.2f} s)")

    with TraceReader(TraceSource(str(trace), trace), hashes) as r:
        events = list(r.events())
    engine = SimEngine(header=header, hashes=hashes, capacity=args.capacity,
                       policy=make_policy(args.policy), contracts=api.DEFAULT_CONTRACTS,
                       done_ids=summary.done_ids)
    prof = cProfile.Profile() if args.profile else None
    t0 = time.perf_counter()
    if prof:
        prof.enable()
    result = engine.run(events)
    if prof:
        prof.disable()
    t_hot = time.perf_counter() - t0
    print(f"hot loop:    {n_blocks / t_hot:12,.0f} blocks/s ({t_hot:.2f} s, "
          f"{result.evictions} evictions, hit blocks {result.counts['hit_blocks']})")

    t0 = time.perf_counter()
    api.replay(api.ReplayConfig(trace=str(trace), baseline=args.policy, candidate=args.policy,
                                capacity=args.capacity, out=tmp / "out"))
    t_e2e = time.perf_counter() - t0
    print(f"end to end:  {2 * n_blocks / t_e2e:12,.0f} blocks/s ({t_e2e:.2f} s for two runs, "
          f"validation pass and ledgers included)")
    print(f"ratios: hot/validate {t_val / t_hot:.2f}x, end-to-end/hot "
          f"{(2 * n_blocks / t_e2e) / (n_blocks / t_hot):.2f}x")
    if prof:
        pstats.Stats(prof).sort_stats("tottime").print_stats(12)


if __name__ == "__main__":
    main()
