"""Soak: random traces x every registered policy, with paranoid invariant checking.

    python tools/soak.py --traces 10000 [--seed 0] [--policies lru,prefixshield]

Each trace comes from the `random` workload (seed = base seed + index) and is
replayed at a random small capacity with --paranoid checks (every invariant
recomputed from scratch after every mutation). Prints the counts and exits 1 at
the first trace with a violation, an aborted run or a crash, naming its seed.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from psgate.api import contract_table  # noqa: E402
from psgate.contracts import CONTRACT_NAMES  # noqa: E402
from psgate.engines.sim import SimEngine  # noqa: E402
from psgate.policies import make_policy, policy_names  # noqa: E402
from psgate.trace.future import future_uses  # noqa: E402
from psgate.trace.reader import HashTable, TraceReader, TraceSource, validate_trace  # noqa: E402
from psgate.trace.writer import write_trace  # noqa: E402
from psgate.workloads import generate  # noqa: E402


def soak(num_traces: int, seed: int, policies: list[str], quiet: bool = False) -> dict:
    tmp = Path(tempfile.mkdtemp())
    counts = {"traces": 0, "replays": 0, "violations": 0, "evictions": 0}
    t0 = time.time()
    for i in range(num_traces):
        s = seed + i
        rng = random.Random(s)
        path = tmp / "t.jsonl"
        write_trace(path, generate("random", {"seed": s, "requests": rng.randint(5, 60),
                                              "groups": rng.randint(1, 4)}))
        capacity = rng.randint(4, 40)
        hashes = HashTable()
        header, summary = validate_trace(str(path), hashes)
        src = TraceSource(str(path), path)
        for name in policies:
            policy = make_policy(name)
            if policy.needs_future:
                policy.set_future(future_uses(src, hashes))
            engine = SimEngine(header=header, hashes=hashes, capacity=capacity, policy=policy,
                               contracts=contract_table(CONTRACT_NAMES, [policy]),
                               done_ids=summary.done_ids, paranoid=True, groups=summary.groups)
            try:
                with TraceReader(src, hashes) as reader:
                    result = engine.run(reader.events())
            except Exception:
                traceback.print_exc()
                raise SystemExit(f"crash: seed {s}, policy {name}, capacity {capacity}")
            bad = {k: v.first_violation for k, v in result.invariants.items() if not v.holds}
            if bad or result.aborted:
                counts["violations"] += 1
                raise SystemExit(f"violation: seed {s}, policy {name}, capacity {capacity}: "
                                 f"{result.aborted or bad}")
            counts["replays"] += 1
            counts["evictions"] += result.evictions
        counts["traces"] += 1
        if not quiet and (i + 1) % 500 == 0:
            print(f"{i + 1} traces, {counts['replays']} replays, {time.time() - t0:.0f} s",
                  flush=True)
    counts["seconds"] = round(time.time() - t0, 1)
    return counts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--traces", type=int, default=10000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--policies", default=",".join(policy_names()))
    args = ap.parse_args()
    counts = soak(args.traces, args.seed, args.policies.split(","))
    print(f"{counts['traces']} traces x {len(args.policies.split(','))} policies = "
          f"{counts['replays']} paranoid replays, {counts['evictions']} evictions, "
          f"0 violations, 0 crashes ({counts['seconds']} s)")


if __name__ == "__main__":
    main()
