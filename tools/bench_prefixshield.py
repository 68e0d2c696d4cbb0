"""PrefixShield victim selection time and metadata bytes per block.

    python tools/bench_prefixshield.py            # all sizes (several minutes)
    python tools/bench_prefixshield.py --quick    # 512/8 and 4096/32 only

Selection: a full replay in which every group is in creation debt on two
contracts (each group alternates critical/standard requests of 64 unseen blocks,
arriving 0.1 ms apart, far faster than any bucket refills) at 512 blocks/8
groups, 4,096/32, 65,536/256 and 1,048,576/1,024. The time of select_victim +
on_evict is summed per victim and per allocation batch, and printed beside LRU's
in the same run and beside the paper's prototype (0.483 ms and 3.08 ms per
selection at 512/8 and 4096/32).

Memory: RSS of a child process before the engine exists and after 1,048,576
blocks are resident (no eviction yet), per block, for lru and prefixshield.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from psgate.engines.cost import CostModel  # noqa: E402
from psgate.engines.sim import SimEngine  # noqa: E402
from psgate.policies import make_policy  # noqa: E402
from psgate.trace.reader import HashTable, TraceReader, TraceSource, validate_trace  # noqa: E402
from psgate.trace.writer import header_line  # noqa: E402

import orjson  # noqa: E402

CONTRACTS = ("critical", "standard", "best-effort")
# Zero service time: each request holds its blocks exactly until done_t, so the
# trace's clock (and with it bucket refill) stays where the trace puts it.
INSTANT = CostModel(0.0, 0.0, 0.0, 0.0)
SIZES = [(512, 8), (4096, 32), (65536, 256), (1048576, 1024)]
WARMUP_ROUNDS = 10


def write_debt_trace(path: Path, capacity: int, groups: int, turnovers: float,
                     blocks: int = 64, warmup_rounds: int | None = None) -> int:
    """Requests 0.1 ms apart, groups round-robin, contracts alternating per round:
    after WARMUP_ROUNDS rounds every group has materialized 5 x 64 blocks on each of
    two contracts, more than either bucket's burst, and refill is negligible."""
    rounds = WARMUP_ROUNDS if warmup_rounds is None else warmup_rounds
    n = rounds * groups + int(capacity * turnovers / (blocks + 1))
    with open(path, "wb") as fh:
        fh.write(orjson.dumps(header_line(16, source="bench debt")) + b"\n")
        for i in range(n):
            g = i % groups
            t = i * 0.0001
            fh.write(orjson.dumps({
                "t": round(t, 6), "op": "request", "id": f"r{i}", "group": f"g{g}",
                "contract": CONTRACTS[(i // groups) % 2], "scope": "m",
                "blocks": [f"{i:08x}{j:04x}" for j in range(blocks)], "tail": 1, "out": 0,
                "done_t": round(t + 0.00005, 6)}) + b"\n")
    return n


def load(path: Path):
    hashes = HashTable()
    header, summary = validate_trace(str(path), hashes)
    with TraceReader(TraceSource(str(path), path), hashes) as r:
        events = list(r.events())
    return header, summary, hashes, events


def time_selection(policy_name: str, loaded, capacity: int, groups: int) -> dict:
    """Times batches after the warm-up rounds, when every group is in debt."""
    header, summary, hashes, events = loaded
    warmup = WARMUP_ROUNDS * groups
    pol = make_policy(policy_name)
    acc = {"victims": 0, "batches": 0, "t": 0.0, "t_batch_max": 0.0, "cur": 0.0,
           "measure": False}
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

    def on_admit(req, now):
        acc["cur"] = 0.0
        acc["measure"] = req.index >= warmup
        return adm(req, now)

    def end_admit(req, now):
        if acc["cur"] and acc["measure"]:
            acc["batches"] += 1
            acc["t"] += acc["cur"]
            acc["t_batch_max"] = max(acc["t_batch_max"], acc["cur"])
        return end(req, now)

    pol.select_victim, pol.on_evict, pol.on_admit, pol.end_admit = \
        select_victim, on_evict, on_admit, end_admit
    engine = SimEngine(header=header, hashes=hashes, capacity=capacity, policy=pol,
                       contracts=CONTRACTS, done_ids=summary.done_ids, groups=summary.groups,
                       cost=INSTANT)
    t0 = clock()
    result = engine.run(events)
    wall = clock() - t0
    debt_groups = None
    if policy_name == "prefixshield":
        now = engine.now / 1e9
        debt_groups = sum(1 for g in range(len(pol.gnames))
                          if sum(1 for i in pol.group_buckets[g] if pol.bhat(i, now) < 0) >= 2)
    return {"victims": acc["victims"], "batches": acc["batches"],
            "us_per_victim": 1e6 * acc["t"] / max(1, acc["victims"]),
            "us_per_batch": 1e6 * acc["t"] / max(1, acc["batches"]),
            "replay_s": wall, "evictions": result.evictions,
            "groups_in_debt_on_2_contracts": debt_groups,
            "invariants_hold": all(v.holds for v in result.invariants.values())}


def memory_child(policy_name: str, trace: str, capacity: int) -> None:
    """Runs in a fresh process: RSS before the engine exists and after the fill."""
    header, summary, hashes, events = load(Path(trace))

    def rss() -> int:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    import gc
    gc.collect()
    before = rss()
    pol = make_policy(policy_name)
    engine = SimEngine(header=header, hashes=hashes, capacity=capacity, policy=pol,
                       contracts=CONTRACTS, done_ids=summary.done_ids, groups=summary.groups,
                       cost=INSTANT)
    result = engine.run(events)
    after = rss()
    resident = capacity - 1 - len(engine.free)
    print(json.dumps({"policy": policy_name, "resident": resident,
                      "evictions": result.evictions, "bytes": after - before}))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--memory-child", nargs=3, metavar=("POLICY", "TRACE", "CAPACITY"))
    args = ap.parse_args()
    if args.memory_child:
        memory_child(args.memory_child[0], args.memory_child[1], int(args.memory_child[2]))
        return
    tmp = Path(tempfile.mkdtemp())
    sizes = SIZES[:2] if args.quick else SIZES
    paper = {512: 483.0, 4096: 3080.0}
    print("selection time inside a full replay (select_victim + on_evict), microseconds")
    print(f"{'blocks':>9} {'groups':>6} {'policy':>13} {'victims':>9} {'us/victim':>10} "
          f"{'us/batch':>9} {'vs lru':>7} {'paper us/sel':>12} {'in debt x2':>10}")
    base = None
    for capacity, groups in sizes:
        path = tmp / f"debt_{capacity}.jsonl"
        write_debt_trace(path, capacity, groups, turnovers=2.0 if capacity < 65536 else 1.5)
        loaded = load(path)
        rows = {}
        for pol in ("lru", "prefixshield"):
            rows[pol] = time_selection(pol, loaded, capacity, groups)
        for pol, r in rows.items():
            ratio = r["us_per_victim"] / rows["lru"]["us_per_victim"]
            print(f"{capacity:>9} {groups:>6} {pol:>13} {r['victims']:>9} "
                  f"{r['us_per_victim']:>10.2f} {r['us_per_batch']:>9.1f} {ratio:>6.1f}x "
                  f"{paper.get(capacity, float('nan')) if pol == 'prefixshield' else '':>12} "
                  f"{'' if r['groups_in_debt_on_2_contracts'] is None else r['groups_in_debt_on_2_contracts']:>10}")
        if capacity == 4096:
            base = rows["prefixshield"]["us_per_victim"]
        elif base is not None:
            print(f"{'':>9} {'':>6} prefixshield us/victim growth over 4096/32: "
                  f"{rows['prefixshield']['us_per_victim'] / base:.2f}x (target <= 2x)")
    if not args.quick:
        cap = 1048576
        path = tmp / "fill.jsonl"
        write_debt_trace(path, cap, 1024, turnovers=0.999, warmup_rounds=0)
        print("memory: RSS difference with ~1,048,576 resident blocks (fresh process each)")
        for pol in ("lru", "prefixshield"):
            out = subprocess.run([sys.executable, __file__, "--memory-child", pol, str(path),
                                  str(cap)], capture_output=True, text=True, check=True)
            m = json.loads(out.stdout)
            print(f"  {pol:>13}: {m['bytes'] / m['resident']:.0f} bytes/block "
                  f"({m['resident']} resident, {m['evictions']} evictions)")


if __name__ == "__main__":
    main()
