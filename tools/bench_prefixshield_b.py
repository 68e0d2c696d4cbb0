"""Mean hit fraction of lru, s3fifo, prefixshield and prefixshield-b on attack and benign traces.

    python tools/bench_prefixshield_b.py            # 5 seeds per paper workload (several minutes)
    python tools/bench_prefixshield_b.py --quick    # 2 seeds, one capacity per real trace
    python tools/bench_prefixshield_b.py --json out.json
    python tools/bench_prefixshield_b.py --variant 'fill 0.25={"evidence_fill": 0.25}'

Attack rows (the paper's workloads, 512 configured blocks, default cost model): the
victim's mean hit fraction (role ``victim``), mean over seeds with [min, max]; one-touch,
low-and-slow, two-pass-replay, delayed-replay (delay_fraction 0.5). Benign rows: the mean
hit fraction of every measured request. sharegpt and sharegpt-bursty at 512 blocks, seeds
as above; and real traces from ``--traces`` (default ../shared/traces):

- Mooncake conversation trace, 512-token blocks, ``--group-by hash-mod:6`` (6 tenants,
  k = hash_ids[1] mod 6) with contracts cycling critical / standard / best-effort;
- WEKA sessions, 64-token blocks: every fifth session file in file-name order (28 of
  140, to keep the run short), one tenant per session file, contracts cycling, every
  session starting at t = 0 (the importer's defaults);

each request holding its blocks 50 ms + 0.2 ms per output token (``done_t``) with zero
modeled service time, at the capacities in ``REAL``. Policies: lru, s3fifo,
prefixshield and prefixshield-b at probationary_bound 0.05, 0.1, 0.2 and adaptive.
``--variant 'LABEL=JSON'`` (repeatable) adds prefixshield-b with those parameters as
column ``ps-b LABEL``. After the table, each prefixshield-b column's paired difference from
prefixshield on the attack rows (victim hit, pp, mean over seeds with its 95% percentile
bootstrap interval) and its gap to the better of lru and s3fifo on the benign rows.
Every replay is checked: a run with a violated hard invariant is reported as such.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from psgate.bench.traces import INSTANT, load  # noqa: E402  (validate once, keep the events)
from psgate.contracts import CONTRACT_NAMES  # noqa: E402
from psgate.engines.cost import CostModel  # noqa: E402
from psgate.engines.sim import SimEngine  # noqa: E402
from psgate.policies import make_policy  # noqa: E402
from psgate.stats.bootstrap import bootstrap_ci  # noqa: E402
from psgate.stats.metrics import run_metrics  # noqa: E402
from psgate.trace.importers import import_trace  # noqa: E402
from psgate.trace.writer import write_trace  # noqa: E402
from psgate.workloads import generate, generators  # noqa: E402

PAPER_CAPACITY = 512
ATTACKS = [("one-touch", {}), ("low-and-slow", {}), ("two-pass-replay", {}),
           ("delayed-replay", {"delay_fraction": 0.5})]
BENIGN = [("sharegpt", {}), ("sharegpt-bursty", {})]
# (name, format, source under --traces, every k-th session file (a directory source),
#  import options, configured capacities)
REAL = [("mooncake", "mooncake", "mooncake/mooncake_conversation_trace.jsonl", 1,
         {"group_by": "hash-mod:6", "contracts_cycle": True}, (2001, 8001)),
        ("weka", "weka", "weka", 5, {"contracts_cycle": True}, (2001, 8001))]
POLICIES = [("lru", {}), ("s3fifo", {}), ("prefixshield", {}),
            ("ps-b 0.05", {"probationary_bound": 0.05}),
            ("ps-b 0.1", {"probationary_bound": 0.1}),
            ("ps-b 0.2", {"probationary_bound": 0.2}),
            ("ps-b adaptive", {})]
HOLD_S, HOLD_PER_OUT_S = 0.05, 0.0002


def replay(loaded, capacity: int, label: str, params: dict, cost: CostModel) -> dict:
    header, summary, hashes, events = loaded
    name = "prefixshield-b" if label.startswith("ps-b") else label
    engine = SimEngine(header=header, hashes=hashes, capacity=capacity,
                       policy=make_policy(name, params), contracts=CONTRACT_NAMES,
                       done_ids=summary.done_ids, groups=summary.groups, cost=cost)
    result = engine.run(events)
    metrics = run_metrics(result, cost)
    ok = result.aborted is None and all(v.holds for v in result.invariants.values())
    roles = metrics["roles"]
    return {"victim": roles.get("victim", {}).get("hit_fraction"),
            "all": metrics["totals"]["hit_fraction"], "ok": ok,
            "bound": getattr(engine.policy, "bound", None)}


def with_hold(lines: list[dict]) -> list[dict]:
    for x in lines[1:]:
        x["done_t"] = round(x["t"] + HOLD_S + HOLD_PER_OUT_S * x["out"], 6)
    return lines


def source(src: Path, every: int, tmp: Path) -> Path:
    """src, or for a directory and every > 1, a directory linking every k-th session file
    (file-name order, starting with the first)."""
    if every == 1 or not src.is_dir():
        return src
    sub = tmp / f"{src.name}-every-{every}"
    sub.mkdir()
    for f in sorted(p for p in src.iterdir() if p.suffix == ".json")[::every]:
        (sub / f.name).symlink_to(f.resolve())
    return sub


def rows(args, tmp: Path):
    """Yield (row name, capacity, metric, {policy: [values over seeds]})."""
    cost = CostModel()
    seeds = range(args.seeds)
    for kind, params, metric in ([(k, p, "victim") for k, p in ATTACKS]
                                 + [(k, p, "all") for k, p in BENIGN]):
        vals: dict[str, list] = {label: [] for label, _ in POLICIES}
        for seed in seeds:
            path = tmp / f"{kind}-{seed}.jsonl"
            uses_cost = generators()[kind].uses_cost
            write_trace(path, generate(kind, {**params, "seed": seed},
                                       cost=cost if uses_cost else None))
            loaded = load(path)
            for label, pp in POLICIES:
                vals[label].append(replay(loaded, PAPER_CAPACITY, label, pp, cost))
        yield kind, PAPER_CAPACITY, metric, vals
    for name, fmt, src, every, opts, caps in REAL:
        path = tmp / f"{name}.jsonl"
        write_trace(path, with_hold(import_trace(fmt, source(args.traces / src, every, tmp),
                                                 **opts)))
        loaded = load(path)
        for cap in (caps[:1] if args.quick else caps):
            vals = {label: [replay(loaded, cap, label, pp, INSTANT)] for label, pp in POLICIES}
            yield name, cap, "all", vals


def fmt(vs: list[dict], metric: str) -> str:
    xs = [v[metric] for v in vs]
    bad = "" if all(v["ok"] for v in vs) else "!"
    if len(xs) == 1:
        return f"{xs[0]:.3f}{bad}"
    return f"{statistics.fmean(xs):.3f} [{min(xs):.3f},{max(xs):.3f}]{bad}"


def paired(a: list[float], b: list[float], resamples: int = 2000) -> str:
    """Mean of a - b in pp with its 95% percentile-bootstrap interval over seeds (the
    sweep's interval, from a generator seeded 0; none with one seed)."""
    d = [100 * (x - y) for x, y in zip(a, b)]
    ci = bootstrap_ci(d, resamples, random.Random(0))
    return f"{statistics.fmean(d):+.3f}" + ("" if ci is None else
                                            f" [{ci[0]:+.3f}, {ci[1]:+.3f}]")


def summary(out: list[dict], labels: list[str]) -> None:
    psb = [x for x in labels if x.startswith("ps-b")]
    print("\n# prefixshield-b columns: attack rows, victim hit minus prefixshield's, pp "
          "[95% CI]; benign rows, mean hit minus the better of lru and s3fifo, pp")
    for row in out:
        v = row["values"]
        if row["metric"] == "victim":
            cells = [paired(v[x], v["prefixshield"]) for x in psb]
        else:
            best = max(statistics.fmean(v["lru"]), statistics.fmean(v["s3fifo"]))
            cells = [f"{100 * (statistics.fmean(v[x]) - best):+.2f}" for x in psb]
        print(f"{row['trace']:<16}{row['usable']:>7}  " + "   ".join(
            f"{x}: {c}" for x, c in zip(psb, cells)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="2 seeds, one capacity per real trace")
    ap.add_argument("--seeds", type=int, default=None, help="seeds per paper workload (5)")
    ap.add_argument("--traces", type=Path, default=ROOT.parent / "shared" / "traces")
    ap.add_argument("--json", type=Path, default=None, help="also write every value here")
    ap.add_argument("--variant", action="append", default=[], metavar="LABEL=JSON",
                    help="also prefixshield-b with these parameters, column 'ps-b LABEL'")
    args = ap.parse_args()
    for v in args.variant:
        label, sep, params = v.partition("=")
        try:
            parsed = json.loads(params) if sep else None
        except json.JSONDecodeError:
            parsed = None
        if not isinstance(parsed, dict) or not label:
            ap.error(f"--variant takes LABEL=JSON object, found {v!r}")
        POLICIES.append((f"ps-b {label}", parsed))
    if args.seeds is None:
        args.seeds = 2 if args.quick else 5
    labels = [label for label, _ in POLICIES]
    print(f"{'trace':<16}{'usable':>7} {'metric':<7}" + "".join(f"{x:>22}" for x in labels))
    out = []
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as d:
        for name, cap, metric, vals in rows(args, Path(d)):
            print(f"{name:<16}{cap - 1:>7} {metric:<7}"
                  + "".join(f"{fmt(vals[x], metric):>22}" for x in labels), flush=True)
            out.append({"trace": name, "usable": cap - 1, "metric": metric,
                        "values": {x: [v[metric] for v in vals[x]] for x in labels},
                        "invariants_hold": all(v["ok"] for x in labels for v in vals[x]),
                        "adaptive_final_bound": [v["bound"] for v in vals["ps-b adaptive"]]})
    print(f"# {time.perf_counter() - t0:.0f} s; '!' marks a run whose invariants failed")
    summary(out, labels)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
