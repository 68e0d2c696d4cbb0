"""Where a replay spends its time: cProfile over one of psgate bench's own traces.

    python tools/profile_replay.py --policy prefixshield --trace cold
    python tools/profile_replay.py --policy lru --e2e            # psgate replay, ledger on

Prints each function's share of the profiled time (its own time, then with what it
calls), largest first. Shares are steadier than seconds on a shared machine; the
profiler's own overhead inflates small functions alike on both sides of a comparison.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from psgate import api  # noqa: E402
from psgate.bench.suite import FULL, QUICK  # noqa: E402
from psgate.bench.traces import (INSTANT, load, make_engine, write_debt_trace,  # noqa: E402
                                 write_reuse_trace)
from psgate.contracts import CONTRACT_NAMES  # noqa: E402
from psgate.policies import make_policy  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--policy", default="lru")
    ap.add_argument("--trace", choices=("reuse", "cold", "debt"), default="reuse")
    ap.add_argument("--e2e", action="store_true",
                    help="profile psgate replay end to end (validation, two runs, ledger)")
    ap.add_argument("--full", action="store_true", help="the full-scale trace sizes")
    ap.add_argument("--top", type=int, default=15)
    args = ap.parse_args()
    scale = FULL if args.full else QUICK
    work = Path(tempfile.mkdtemp(prefix="psgate-profile-"))
    try:
        path = work / f"{args.trace}.jsonl"
        if args.trace == "debt":
            cap, groups, turns = scale.select[0]
            write_debt_trace(path, cap, groups, turns)
        else:
            requests, blocks, cap = scale.cold if args.trace == "cold" else scale.reuse
            write_reuse_trace(path, requests, blocks, cap, cold=args.trace == "cold")
        prof = cProfile.Profile()
        if args.e2e:
            cfg = api.ReplayConfig(trace=str(path), baseline=args.policy,
                                   candidate=args.policy, capacity=cap, out=work / "out",
                                   force=True, cost=INSTANT, contracts=CONTRACT_NAMES)
            prof.runcall(api.replay, cfg)
        else:
            loaded = load(path)
            engine = make_engine(loaded, make_policy(args.policy), cap)
            prof.runcall(engine.run, loaded.events)
        st = pstats.Stats(prof)
        total = st.total_tt
        rows = sorted(st.stats.items(), key=lambda kv: -kv[1][2])[:args.top]
        print(f"{args.policy}, {args.trace} trace, {'end to end' if args.e2e else 'hot loop'}: "
              f"{total:.3f} s profiled")
        print(f"{'own %':>6} {'with callees %':>15} {'calls':>9}  function")
        for (file, line, fn), (_, ncalls, tt, ct, _) in rows:
            where = f"{Path(file).parent.name}/{Path(file).name}:{line}" if line else file
            print(f"{100 * tt / total:6.1f} {100 * ct / total:15.1f} {ncalls:9d}  {fn} "
                  f"({where})")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
