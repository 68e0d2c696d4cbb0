"""Reproduce the PrefixShield paper's evaluation with psgate's sim engine.

    python examples/paper/reproduce.py                  # 10 matched runs per cell
    python examples/paper/reproduce.py --quick          # 2 runs, fewer capacities

Every cell is a matched-run experiment (baseline LRU, or PrefixShield where prefixshield-b
is compared with it, vs one candidate; seeds derived from --seed) run by psgate sweep's
cell runner, so an interrupted run resumes. The real benign rows replay corpora built here
from the public samples in examples/traces/ (one run per window or bundle of sessions).
It writes OUT/REPORT.md (psgate's means with 95% bootstrap intervals beside the paper's
numbers, DESIGN section 7), OUT/fig2.png to OUT/fig5.png, and keeps every cell's receipts
(and the imported corpora) under OUT/cells/ (not committed: regenerate them). Policy
defaults are the paper's; psgate's PrefixShield evicts leaves only, so the paper's
behaviour (leaf_only=false) is reported beside it. Needs matplotlib (pip install
'psgate[report]').
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from psgate.engines.cost import CostModel  # noqa: E402
from psgate.receipt.ledger import open_text  # noqa: E402
from psgate.sweep import SweepConfig, cells, run_cell  # noqa: E402
from psgate.trace.importers import import_trace  # noqa: E402
from psgate.trace.writer import write_trace  # noqa: E402

PAPER = {  # DESIGN section 7 (hit % unless noted)
    ("one-touch", "lru"): 5.54, ("one-touch", "s3fifo"): 6.29,
    ("one-touch", "static-quota"): 1.94, ("one-touch", "prefixshield"): 14.93,
    ("low-and-slow", "lru"): 92.64, ("low-and-slow", "s3fifo"): 98.64,
    ("low-and-slow", "static-quota"): 0.00, ("low-and-slow", "prefixshield"): 98.90,
    ("two-pass-replay", "lru"): 92.87, ("two-pass-replay", "s3fifo"): 93.96,
    ("two-pass-replay", "prefixshield"): 95.97,
    ("sharegpt", "s3fifo"): 38.85, ("sharegpt", "prefixshield"): 38.92,
    ("sharegpt-bursty", "s3fifo"): 38.72, ("sharegpt-bursty", "prefixshield"): 38.10,
}
PAPER_P95 = {("one-touch", "lru"): 1440.0, ("one-touch", "prefixshield"): 1428.2,
             ("two-pass-replay", "s3fifo"): 141.3, ("two-pass-replay", "prefixshield"): 104.8,
             ("sharegpt", "s3fifo"): 96.5, ("sharegpt", "prefixshield"): 97.4,
             ("sharegpt-bursty", "s3fifo"): 185.5, ("sharegpt-bursty", "prefixshield"): 168.1}
PAPER_GAIN_CAPACITY = {512: 9.39, 1024: 12.01, 2048: 39.71, 4096: 79.95}
PAPER_GAIN_LOAD = {0.4: 20.06, 0.6: 9.39, 0.8: 8.47}
PAPER_NOSEG = {"one-touch": 3.38, "low-and-slow": 1.84, "sharegpt": 2.31, "borrowing": 0.0}
# Fig. 2 middle panel: creation-pressure ratio -> (gain pp, mean debt blocks)
PAPER_PRESSURE = {0.54: (0.0, 0.0), 1.02: (5.11, 5.69), 2.14: (24.38, 260.90),
                  4.23: (59.07, 901.91)}
PRESSURES_BEYOND = (10.0, 20.0)     # between the paper's range and one-touch's default

# What the ledgers show behind prefixshield-b's losses (`psgate explain` on a cell's runs),
# printed under "Where prefixshield-b still loses" for whichever kind of row has some.
WHY_PSB_ATTACK = (
    "Attack traces, as the ledgers show it (`psgate explain` on a cell's runs): the runs "
    "below PrefixShield lose a few blocks each, in evictions where nobody is responsible "
    "(most often the victim's own requests) and native order is in force. The bound that "
    "put it in force was raised by evidence from a group in good standing: the victim "
    "re-reading fresh blocks that segment order had evicted, or the attacker early in its "
    "attack window, before it has spent half of its burst. Native order then takes the "
    "victim's least recently freed proven reuse where the paper's order would have taken "
    "its Normal or Probationary blocks, and the victim needed those first. A group in "
    "debt always gives up its own blocks in the paper's order, so these are bets between "
    "the two orders, not debt escaping its charge.")
WHY_PSB_BENIGN = (
    "Benign traces: three things remain of PrefixShield. Creation debt still picks the "
    "group: a tenant whose traffic creates blocks faster than its contract refills (the "
    "ShareGPT-like traces' best-effort tenant; a WEKA session's first, very long prompts) "
    "gives up its own blocks first, however recently they were used, which LRU never "
    "does. A responsible group gives up its blocks in the paper's order, Probationary "
    "first, whatever the bound. And the bound starts at PrefixShield's order and moves "
    "one block per settled disagreement, only toward native order on evidence from "
    "groups in good standing, so early in a trace fresh blocks that a later turn re-reads "
    "still go first. The last two are the price of the protection in the table above: "
    "with the bounded order applied inside responsible groups too, and evidence from any "
    "group that owes nothing, the attack rows fell below PrefixShield (low-and-slow "
    "-0.058 pp, two-pass replay -0.083 pp, both intervals excluding 0, in this report's "
    "previous edition).")
PSB_RULES_TRIED = (
    "Rules tried on these traces and on a second set of seeds (the generators' seeds 0 to "
    "9), never tuned per trace. Rejected: keeping Reuse blocks last in native order (no "
    "attack gap, but the ShareGPT-like rows 1.7 to 10 pp below LRU); the paper's order "
    "whenever no Probationary block is a candidate, for every requester (no attack gap, "
    "but sharegpt-bursty at 1,024 blocks 1.24 pp below LRU); segment order for every "
    "request from a group not in good standing (ShareGPT-like rows up to 1.64 pp below "
    "LRU); ignoring evidence for the defence, too, from groups not in good standing (the "
    "bound freezes once the victim itself overdraws, as it does in low-and-slow, and "
    "native order goes on costing it Reuse blocks). evidence_fill, with the rule otherwise "
    "as in use: 0.25 and 0.75 keep every benign row within 0.1 pp of 0.5's, but each "
    "leaves two-pass replay below PrefixShield with an interval excluding 0 on one of the "
    "two seed sets (0.25: -0.019 pp on the second; 0.75: -0.005 pp on this report's); 1.0 "
    "puts sharegpt-bursty at 1,024 blocks 1.13 pp below LRU. 0.5, the default, is the "
    "only setting tried that meets both the protection and the 1-pp benign criterion on "
    "both sets; it was chosen on them, so these runs are not a held-out test. "
    "`python tools/bench_prefixshield_b.py --seeds 10 --variant "
    "'fill 0.75={\"evidence_fill\": 0.75}'` compares settings on the second set.")

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

# Real benign traces: public samples in examples/traces/, imported with psgate's importers.
# Tenants: Mooncake requests split into 6 groups by hash_ids[1] mod 6 (the block after the
# shared system-prompt block follows the conversation), WEKA one group per session file;
# contracts critical / standard / best-effort in turn by group. Neither format says how
# long a request holds its blocks, so each gets done_t = t + HOLD_S + HOLD_PER_OUT_S x
# output tokens (50 ms + 0.2 ms per output token), written into the trace; hit fractions
# do not depend on the cost model's prefill queue then.
HOLD_S, HOLD_PER_OUT_S = 0.05, 0.0002
REAL = {
    "mooncake": {"sample": "examples/traces/mooncake_conversation_6000.jsonl",
                 "windows": 5, "requests": 1200, "block_tokens": 512,
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
    for ratio in (*PAPER_PRESSURE, *(() if quick else PRESSURES_BEYOND)):
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
                      baseline=base[0] if base else "lru", resamples=2000, cost=CostModel())
        if wl.get("corpus"):
            cfg = SweepConfig(workload=None, corpus=corpora[wl["kind"]], runs=runs,
                              allow_unexercised=True, **common)
        else:
            params = {**(TINY[wl["kind"]] if tiny else {}),
                      **{k: v for k, v in wl.items() if k != "kind"}}
            text = wl["kind"] + ("" if not params else ":" + ",".join(
                f"{k}={json.dumps(v)}" for k, v in params.items()))
            cfg = SweepConfig(workload=text, runs=runs, seed=seed, **common)
        (spec,) = cells(cfg)
        spec["id"] = f"{section}-{wl['kind']}-{spec['id'].split('-', 1)[1]}"
        result.append((section, wl["kind"], spec))
    return result


def _with_hold(lines: list[dict], note: dict) -> list[dict]:
    """The imported lines with done_t = t + HOLD_S + HOLD_PER_OUT_S x out on every request
    and ``note`` (how the trace was cut from its sample) in the header."""
    header = dict(lines[0], paper_reproduction={
        **note, "hold": f"done_t = t + {HOLD_S} s + {HOLD_PER_OUT_S} s x out (the sample "
                        "records no completion times)"})
    body = []
    for line in lines[1:]:
        line = dict(line)
        line["done_t"] = round(line["t"] + HOLD_S + HOLD_PER_OUT_S * line["out"], 6)
        body.append(line)
    return [header] + body


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
                    lines = import_trace("mooncake", raw, group_by="hash-mod:6",
                                         contracts_cycle=True)
                    write_trace(d / f"mooncake-w{k}.jsonl", _with_hold(lines, {
                        "sample": real["sample"], "lines": [k * n + 1, (k + 1) * n]}))
            else:
                files = sorted(sample.glob("trace_*.json"),
                               key=lambda f: (f.stat().st_size, f.name))
                files = files[:cfg.get("sessions", len(files))]
                for k in range(cfg["bundles"]):
                    bundle = tmp / f"bundle-{k}"
                    bundle.mkdir()
                    picked = files[k::cfg["bundles"]]
                    for f in picked:
                        shutil.copyfile(f, bundle / f.name)
                    lines = import_trace("weka", bundle, group_by="file",
                                         contracts_cycle=True)
                    write_trace(d / f"weka-b{k}.jsonl", _with_hold(lines, {
                        "sample": real["sample"], "sessions": [f.name for f in picked]}))
        dirs[name] = d
    return dirs


def _run(args):
    spec, out = args
    t0 = time.perf_counter()
    row = run_cell(spec, out)
    return spec["id"], row, time.perf_counter() - t0


def cell_receipts(out: Path, cell_id: str) -> list[dict]:
    exp = json.loads((out / "cells" / cell_id / "receipt.json").read_text())
    return [json.loads((out / "cells" / cell_id / r["receipt"]).read_text()) for r in exp["runs"]]


def ledger_promotions(out: Path, cell_id: str, group: str) -> tuple[float, float]:
    """Mean over runs of blocks the group's admissions promoted and were denied (candidate)."""
    exp = json.loads((out / "cells" / cell_id / "receipt.json").read_text())
    promoted, denied = [], []
    for r in exp["runs"]:
        run_dir = out / "cells" / cell_id / Path(r["receipt"]).parent
        ledger = json.loads((run_dir / "receipt.json").read_text())["config"].get(
            "ledger", {}).get("file", "ledger.csv")
        p = d = 0
        with open_text(run_dir / ledger) as fh:
            for row in csv.DictReader(fh):
                if row["run"] == "candidate" and row["kind"] == "admit" and row["group"] == group \
                        and row["rank"]:
                    note = json.loads(row["rank"])
                    p += note.get("promoted", 0)
                    d += note.get("promotion_denied", 0)
        promoted.append(p)
        denied.append(d)
    return sum(promoted) / len(promoted), sum(denied) / len(denied)


def fmt_ci(e: dict | None, scale: float = 100.0, digits: int = 2) -> str:
    if e is None:
        return "-"
    return f"{e['candidate_mean'] * scale:.{digits}f}"


def fmt_diff(e: dict | None, scale: float = 100.0, digits: int = 2) -> str:
    if e is None:
        return "-"
    if e["diff_ci_low"] is None:
        return f"{e['diff_mean'] * scale:+.{digits}f}"
    return (f"{e['diff_mean'] * scale:+.{digits}f} [{e['diff_ci_low'] * scale:+.{digits}f}, "
            f"{e['diff_ci_high'] * scale:+.{digits}f}]")


def ci_reading(e: dict) -> str:
    """The paired interval in words: which side of zero it lies on."""
    if e["diff_ci_low"] is None:
        return "one run: no interval"
    if e["diff_ci_high"] < 0:
        return "below (the interval excludes 0)"
    if e["diff_ci_low"] > 0:
        return "above (the interval excludes 0)"
    if e["diff_ci_low"] == e["diff_ci_high"] == 0:
        return "identical in every run"
    return "no difference resolved (the interval contains 0)"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="2 runs, capacities up to 1024")
    ap.add_argument("--tiny", action="store_true",
                    help="shrunken workloads: checks the pipeline, not the paper's numbers")
    ap.add_argument("--runs", type=int, help="matched runs per cell (default 10, quick 2)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--out", type=Path, default=ROOT / "examples" / "paper")
    args = ap.parse_args()
    runs = args.runs or (2 if args.quick or args.tiny else 10)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    corpora = build_corpora(out, tiny=args.tiny)
    todo = specs(args.quick, runs, args.seed, out, tiny=args.tiny, corpora=corpora)
    results: dict[str, dict] = {}
    with ProcessPoolExecutor(max_workers=args.workers, mp_context=get_context("spawn")) as pool:
        for n, (cid, row, secs) in enumerate(pool.map(_run, [(s, str(out)) for *_, s in todo]),
                                             1):
            results[cid] = row
            print(f"[{n}/{len(todo)}] {cid} {secs:.1f} s{' (resumed)' if row['resumed'] else ''}",
                  file=sys.stderr, flush=True)
    wall = time.perf_counter() - started
    write_report(out, todo, results, runs, args.quick, wall, args.tiny, args.workers)
    print(f"{out / 'REPORT.md'} ({wall:.0f} s)", file=sys.stderr)
    return 0


def _summary(out: Path, cid: str) -> dict:
    return json.loads((out / "cells" / cid / "receipt.json").read_text())["summary"]


def _traces(out: Path, cid: str) -> list[list[dict]]:
    return [[json.loads(x) for x in p.read_text().splitlines()]
            for p in sorted((out / "cells" / cid / "traces").glob("*.jsonl"))]


def attack_pressure(out: Path, cid: str) -> dict:
    """Means over a one-touch cell's traces: the observed creation-pressure ratio, the
    nominal mean debt, attack requests and the attack window (s). The ratio and debt come
    from the header where creation_pressure set them, otherwise they are computed the same
    way from the attacker's requests over the attack window."""
    from psgate.policies.prefixshield import DEFAULT_CONTRACTS
    from psgate.workloads.paper import mean_bucket_debt
    rows = []
    for lines in _traces(out, cid):
        d = lines[0]["generator"]["derived"]
        att = [x for x in lines[1:] if x.get("role") == "attacker"]
        start, end = d["attack_window_s"]
        if "creation_pressure" in d:
            cp = d["creation_pressure"]
            obs, debt = cp["observed"], cp["nominal_mean_debt_blocks"]
        else:
            rho, beta = DEFAULT_CONTRACTS[lines[0]["generator"]["params"]["attacker_contract"]]
            blocks = len(att[0]["blocks"]) if att else 0
            obs = len(att) * blocks / (end - start) / rho
            debt = mean_bucket_debt([x["t"] for x in att], blocks, rho, beta, start, end)
        rows.append((obs, debt, len(att), end - start))
    return {k: sum(r[i] for r in rows) / len(rows)
            for i, k in enumerate(("observed", "debt", "requests", "window"))}


def pressure_note(rows) -> str:
    """What the creation-pressure rows show against the paper's, in words from the numbers."""
    paper = [(r, st, e, b) for r, st, e, b in rows if r in PAPER_PRESSURE]
    if len(paper) < 2:
        return ""
    gains = [e["diff_mean"] * 100 for _, _, e, _ in paper]
    rising = all(b >= a for a, b in zip(gains, gains[1:]))
    top_r, top, top_e, top_b = paper[-1]
    text = (f"Across the paper's ratios psgate's gain {'rises' if rising else 'does not rise steadily'}"
            f" from {gains[0]:+.2f} to {gains[-1]:+.2f} pp (paper: {PAPER_PRESSURE[paper[0][0]][0]}"
            f" to {PAPER_PRESSURE[top_r][0]} pp). ")
    smaller = all(g < PAPER_PRESSURE[r][0] for g, (r, *_) in zip(gains, paper)
                  if PAPER_PRESSURE[r][0] > 0)
    if smaller:
        paper_debt = PAPER_PRESSURE[top_r][1]
        rel = top["debt"] / paper_debt if paper_debt else float("inf")
        debt_word = ("close to" if 0.75 <= rel <= 1.25 else "above" if rel > 1 else "below")
        text += (f"It is smaller wherever the paper's is positive, although the attacker's "
                 f"nominal mean debt is {debt_word} the paper's at ratio {top_r:g} "
                 f"({top['debt']:.1f} vs {paper_debt} blocks): at ratio {top_r:g} psgate's "
                 f"attacker sends {top['requests']:.1f} requests (mean) in one-touch's "
                 f"{top['window']:.1f}-s attack window, and LRU still keeps most of the "
                 f"victim's hits ({top_e['baseline_mean'] * 100:.2f}%)")
        text += (f"; even belady, the clairvoyant reference heuristic, gains only "
                 f"{(top_b['candidate_mean'] - top_b['baseline_mean']) * 100:.2f} pp over LRU "
                 f"there" if top_b else "")
        text += ". "
    extra = [(r, e) for r, _, e, _ in rows if r not in PAPER_PRESSURE]
    if extra:
        text += ("Beyond the paper's range: " + "; ".join(
            f"{'default' if r is None else f'ratio {r:g}'} {e['diff_mean'] * 100:+.2f} pp "
            f"(LRU {e['baseline_mean'] * 100:.2f}%)" for r, e in extra) + ".")
    return text


def write_report(out: Path, todo, results, runs: int, quick: bool, wall: float,
                 tiny: bool = False, workers: int = 1) -> None:
    by = {}
    for section, kind, spec in todo:
        shrunk = TINY.get(kind, {}) if tiny else {}
        key = (section, kind, spec["candidate"],
               json.dumps(spec["candidate_params"], sort_keys=True),
               json.dumps({k: v for k, v in spec["params"].items()
                           if k not in shrunk or shrunk[k] != v}, sort_keys=True),
               spec["capacity"])
        by[key] = spec["id"]

    def cell(section, kind, cand, cp=None, params=None, cap=512):
        return by.get((section, kind, cand, json.dumps(cp or {}, sort_keys=True),
                       json.dumps(params or {}, sort_keys=True), cap))

    compute = sum(json.loads((out / "cells" / spec["id"] / "receipt.json").read_text())
                  ["environment"]["wall_s"] for *_, spec in todo)
    fresh = sum(1 for r in results.values() if not r["resumed"])
    lines = [
        "# The PrefixShield paper's evaluation, reproduced with psgate's sim engine", "",
        *(["**Pipeline check only (--tiny): shrunken workloads, not the paper's experiment.**",
            ""] if tiny else []),
        f"Generated by `python examples/paper/reproduce.py{' --quick' if quick else ''}"
        f"{' --tiny' if tiny else ''}`: "
        f"{runs} matched runs per cell (seeds derived from 0), 512 configured blocks (511 "
        f"usable), 16-token blocks, the default cost model (modeled times), {len(todo)} cells "
        f"in {compute / 60:.1f} min of replay time (summed over cells, from their receipts); "
        f"this invocation computed {fresh} cell(s) and resumed {len(todo) - fresh} from their "
        f"receipts in {wall / 60:.1f} min of wall-clock time with {workers} worker "
        f"process(es) on a {os.cpu_count()}-core machine. Each value is "
        f"psgate's mean over runs; "
        "differences are candidate minus LRU on the same traces with a 95% percentile-bootstrap "
        "interval over runs. Paper values are from its tables and figures (hit %).", "",
        "psgate's PrefixShield evicts leaves only (no orphans); `prefixshield(leaf_only=false)` is "
        "the paper's behaviour. `belady` (evict the block used furthest in the future, from the "
        "trace itself) is psgate's clairvoyant reference heuristic: a point of comparison, not "
        "an optimum or a bound, and not deployable.", "",
        "## Table I: attack traces, victim hit %", "",
        "| trace | policy | psgate victim hit % | gain over LRU, pp [95% CI] | paper |",
        "|---|---|---|---|---|"]
    for kind in ATTACKS:
        first = _summary(out, cell("table1", kind, "prefixshield"))
        v = first["roles"]["victim"]["hit_fraction"]
        lines.append(f"| {kind} | lru | {v['baseline_mean'] * 100:.2f} | - | "
                     f"{PAPER.get((kind, 'lru'), '-')} |")
        for cand, cp in CANDIDATES:
            s = _summary(out, cell("table1", kind, cand, cp))
            e = s["roles"]["victim"]["hit_fraction"]
            paper = PAPER.get((kind, cand), "-") if not cp else "-"
            lines.append(f"| {kind} | {label(cand, cp)} | {fmt_ci(e)} | {fmt_diff(e)} | {paper} |")
        ctrl = _summary(out, cell("control", kind, "prefixshield", params={"attack": False}))
        e = ctrl["roles"]["victim"]["hit_fraction"]
        lines.append(f"| {kind}, no attack | lru | {e['baseline_mean'] * 100:.2f} | - | "
                     f"{'99.19' if kind != 'one-touch' else '-'} |")
        lines.append(f"| {kind}, no attack | prefixshield | {fmt_ci(e)} | {fmt_diff(e)} | - |")
    lines += ["", "Victim P95 TTFT (ms, modeled):", "",
              "| trace | LRU | PrefixShield | S3-FIFO | paper LRU / PrefixShield / S3-FIFO |",
              "|---|---|---|---|---|"]
    for kind in ATTACKS:
        ps = _summary(out, cell("table1", kind, "prefixshield"))["roles"]["victim"]["ttft_p95_ms"]
        s3 = _summary(out, cell("table1", kind, "s3fifo"))["roles"]["victim"]["ttft_p95_ms"]
        lines.append(f"| {kind} | {ps['baseline_mean']:.1f} | {ps['candidate_mean']:.1f} | "
                     f"{s3['candidate_mean']:.1f} | {PAPER_P95.get((kind, 'lru'), '-')} / "
                     f"{PAPER_P95.get((kind, 'prefixshield'), '-')} / "
                     f"{PAPER_P95.get((kind, 's3fifo'), '-')} |")
    lines += ["", "## Table II: benign traces, all requests", "",
              "| trace | policy | hit % | gain over LRU, pp [95% CI] | P95 TTFT ms | paper hit % / P95 |",
              "|---|---|---|---|---|---|"]
    for kind in ("sharegpt", "sharegpt-bursty"):
        base = _summary(out, cell("table2", kind, "prefixshield"))["totals"]
        lines.append(f"| {kind} | lru | {base['hit_fraction']['baseline_mean'] * 100:.2f} | - | "
                     f"{base['ttft_p95_ms']['baseline_mean']:.1f} | not in the paper |")
        for cand in ("s3fifo", "prefixshield", "belady"):
            t = _summary(out, cell("table2", kind, cand))["totals"]
            paper = (f"{PAPER.get((kind, cand), '-')} / {PAPER_P95.get((kind, cand), '-')}"
                     if (kind, cand) in PAPER else "-")
            lines.append(f"| {kind} | {cand} | {fmt_ci(t['hit_fraction'])} | "
                         f"{fmt_diff(t['hit_fraction'])} | {t['ttft_p95_ms']['candidate_mean']:.1f} "
                         f"| {paper} |")
    lines += ["", "## Table III: borrowing (511 usable blocks)", "",
              "| policy | blocks held by the active group (max, mean over runs) | hit % (all) | paper |",
              "|---|---|---|---|"]
    paper3 = {"lru": "- (99.33%)", "s3fifo": "509-510", "static-quota": "254-255",
              "prefixshield": "509-510 (99.33%)", "belady": "-"}
    first = True
    for cand in ("s3fifo", "static-quota", "prefixshield", "belady"):
        cid = cell("table3", "borrowing", cand)
        recs = cell_receipts(out, cid)
        t = _summary(out, cid)["totals"]["hit_fraction"]
        if first:
            held = sum(r["runs"]["baseline"]["metrics"]["groups"]["active"]["occupancy_max"]
                       for r in recs) / len(recs)
            lines.append(f"| lru | {held:.1f} | {t['baseline_mean'] * 100:.2f} | {paper3['lru']} |")
            first = False
        held = sum(r["runs"]["candidate"]["metrics"]["groups"]["active"]["occupancy_max"]
                   for r in recs) / len(recs)
        lines.append(f"| {cand} | {held:.1f} | {fmt_ci(t)} | {paper3[cand]} |")

    # Fig. 2: gain over LRU vs capacity and load.
    caps = [512] + [c for c in (1024, 2048, 4096) if cell("fig2-capacity", "one-touch",
                                                            "prefixshield",
                                                            params={"capacity_target": c}, cap=c)]
    cap_rows = []
    for c in caps:
        cid = (cell("table1", "one-touch", "prefixshield") if c == 512 else
               cell("fig2-capacity", "one-touch", "prefixshield", params={"capacity_target": c},
                    cap=c))
        bel = (cell("table1", "one-touch", "belady") if c == 512 else
               cell("fig2-capacity", "one-touch", "belady", params={"capacity_target": c}, cap=c))
        cap_rows.append((c, _summary(out, cid)["roles"]["victim"]["hit_fraction"],
                         _summary(out, bel)["roles"]["victim"]["hit_fraction"]))
    load_rows = []
    for alpha in (0.4, 0.6, 0.8):
        cid = (cell("table1", "one-touch", "prefixshield") if alpha == 0.6 else
               cell("fig2-load", "one-touch", "prefixshield", params={"alpha": alpha}))
        load_rows.append((alpha, _summary(out, cid)["roles"]["victim"]["hit_fraction"]))
    lines += ["", "## Fig. 2: PrefixShield's gain over LRU (one-touch, victim hit, pp)", "",
              "| configured blocks | LRU % | PrefixShield % | gain [95% CI] | belady % | paper gain |",
              "|---|---|---|---|---|---|"]
    for c, e, b in cap_rows:
        lines.append(f"| {c} | {e['baseline_mean'] * 100:.2f} | {e['candidate_mean'] * 100:.2f} | "
                     f"{fmt_diff(e)} | {b['candidate_mean'] * 100:.2f} | "
                     f"{PAPER_GAIN_CAPACITY[c]} |")
    lines += ["", "| nominal load (alpha) | LRU % | PrefixShield % | gain [95% CI] | paper gain |",
              "|---|---|---|---|---|"]
    for a, e in load_rows:
        lines.append(f"| {a:.0%} | {e['baseline_mean'] * 100:.2f} | {e['candidate_mean'] * 100:.2f}"
                     f" | {fmt_diff(e)} | {PAPER_GAIN_LOAD[a]} |")
    pressure_rows = []
    for r in (*PAPER_PRESSURE, *PRESSURES_BEYOND, None):
        cid = (cell("table1", "one-touch", "prefixshield") if r is None else
               cell("fig2-pressure", "one-touch", "prefixshield",
                    params={"creation_pressure": r}))
        if cid is None:
            continue
        bel = (cell("table1", "one-touch", "belady") if r is None else
               cell("fig2-pressure", "one-touch", "belady", params={"creation_pressure": r}))
        pressure_rows.append((r, attack_pressure(out, cid),
                              _summary(out, cid)["roles"]["victim"]["hit_fraction"],
                              None if bel is None else
                              _summary(out, bel)["roles"]["victim"]["hit_fraction"]))
    lines += ["", "Creation-pressure ratio (Fig. 2, middle): one-touch with `creation_pressure` = "
              "R, the attacker's block creation rate set to R x its contract's refill "
              "(best-effort, 16 blocks/s) over one-touch's fixed attack window; the last row is "
              "one-touch's default, whose attack rate derives from C_prefill. Observed ratio = "
              "attack blocks created / window / refill and nominal mean debt = the attacker's "
              "bucket charged at arrival times, averaged over the window (means over runs, from "
              "the traces).", "",
              "| target ratio | observed ratio | nominal mean debt (blocks) | LRU % | "
              "PrefixShield % | gain [95% CI] | belady % | paper gain | paper mean debt |",
              "|---|---|---|---|---|---|---|---|---|"]
    for r, st, e, b in pressure_rows:
        paper = PAPER_PRESSURE.get(r, ("-", "-"))
        name = "default" if r is None else f"{r:g}"
        lines.append(
            f"| {name} | {st['observed']:.2f} | {st['debt']:.1f} | {e['baseline_mean'] * 100:.2f} | "
            f"{e['candidate_mean'] * 100:.2f} | {fmt_diff(e)} | {fmt_ci(b)} | {paper[0]} | "
            f"{paper[1]} |")
    lines += ["", pressure_note(pressure_rows), ""]

    # Fig. 3a: segmentation ablation; Fig. 3b: delayed replay.
    lines += ["## Fig. 3a: segmentation ablation (full minus no-segmentation, pp)", "",
              "| trace | scope | full % | no-segmentation % | full minus no-seg | paper |",
              "|---|---|---|---|---|---|"]
    ab_rows = []
    for kind in ("one-touch", "low-and-slow", "sharegpt", "borrowing"):
        scope = "victim" if kind in ATTACKS else "all"
        full_cell = (cell("table1", kind, "prefixshield") if kind in ATTACKS
                     else cell("fig3a", kind, "prefixshield"))
        pick = (lambda s: s["roles"]["victim"]["hit_fraction"]) if scope == "victim" \
            else (lambda s: s["totals"]["hit_fraction"])
        full = pick(_summary(out, full_cell))["candidate_mean"] * 100
        noseg = pick(_summary(out, cell("fig3a", kind, "prefixshield-noseg")))["candidate_mean"] * 100
        ab_rows.append((kind, full - noseg))
        lines.append(f"| {kind} | {scope} | {full:.2f} | {noseg:.2f} | {full - noseg:+.2f} | "
                     f"{PAPER_NOSEG[kind]} |")
    lines += ["", "## Fig. 3b: delayed replay (attacker replays after a fraction of its "
              "debt-clearance time)", "",
              "| delay | policy | attacker blocks promoted | promotions gated | attacker blocks "
              "evicted | victim blocks evicted | victim hit % |", "|---|---|---|---|---|---|---|"]
    fig3b = []
    for frac in (0.0, 0.5, 1.0):
        for cand in ("prefixshield", "prefixshield-nogate", "lru"):
            cid = cell("fig3b", "delayed-replay", cand, params={"delay_fraction": frac})
            recs = cell_receipts(out, cid)
            ev = [r["runs"]["candidate"]["metrics"]["groups"] for r in recs]
            att = sum(g.get("attacker", {}).get("evictions_suffered", 0) for g in ev) / len(ev)
            vic = sum(g.get("victim", {}).get("evictions_suffered", 0) for g in ev) / len(ev)
            hit = _summary(out, cid)["roles"]["victim"]["hit_fraction"]["candidate_mean"] * 100
            if cand == "lru":
                prom, den = "-", "-"
            else:
                p, d = ledger_promotions(out, cid, "attacker")
                prom, den = f"{p:.1f}", f"{d:.1f}"
            fig3b.append((frac, cand, att, vic, hit))
            lines.append(f"| {frac} | {cand} | {prom} | {den} | {att:.1f} | {vic:.1f} | {hit:.2f} |")
    lines += ["", "Paper (Fig. 3b): full PrefixShield gates all 193 replay-eligible blocks and "
              "evicts 74 attacker and 0 victim blocks; without the gate 2 attacker and 72 victim "
              "blocks (35.16 pp); at the designed clearance time both promote all 193.", ""]
    tradeoff = tradeoff_rows(out, cell)
    lines += ["## Beyond the paper: prefixshield-b (psgate's extension)", "",
              "PrefixShield with a bounded Probationary segment: a group in debt gives up its "
              "own blocks in the paper's order; where nobody is responsible, Probationary-"
              "first order applies only while Probationary candidates number at least a "
              "bound T (a fraction of usable blocks, or adaptive: moved by which of the two "
              "orders' choices proved right where they disagreed, evidence toward native "
              "order counting only from groups in good standing; "
              "`psgate/policies/prefixshield_b.py`). "
              "Protection = victim hit % on the attack traces; benign = all requests' hit % on "
              "the ShareGPT-like traces (the paper compares these only with S3-FIFO, not LRU).",
              "", "| trace | scope | lru | s3fifo | prefixshield | " +
              " | ".join(f"ps-b {b}" for b in BOUNDS) + " |",
              "|---|---|---|---|---|" + "---|" * len(BOUNDS)]
    for kind, scope, vals in tradeoff:
        lines.append(f"| {kind} | {scope} | " + " | ".join(
            "-" if vals.get(k) is None else f"{vals[k] * 100:.2f}"
            for k in ["lru", "s3fifo", "prefixshield", *[f"b={b}" for b in BOUNDS]]) + " |")
    lines += ["", "Differences against LRU with their intervals are in each cell's receipt "
              "(`cells/tradeoff-*/receipt.json`); fig4.png plots protection against benign "
              "hit rate.", ""]
    # prefixshield-b vs PrefixShield on the attack traces (paired, same traces)
    psb_rows = []
    for kind in PSB_ATTACKS:
        cid = cell("psb-vs-ps", kind, "prefixshield-b")
        if cid is not None:
            s = _summary(out, cid)
            psb_rows.append((kind, s["roles"]["victim"]["hit_fraction"], s["num_runs"],
                             runs_compared(out, cid, "role:victim")))
    lines += ["## prefixshield-b (default, adaptive) vs PrefixShield on the attack traces", "",
              "Victim hit %, PrefixShield as the baseline: the paired difference prefixshield-b "
              "minus PrefixShield on the same traces, with its 95% percentile-bootstrap interval "
              "over runs, and how many runs fell below, level with and above PrefixShield.", "",
              "| trace | runs | PrefixShield % | prefixshield-b % | difference, pp [95% CI] | "
              "reading | runs below / level / above |", "|---|---|---|---|---|---|---|"]
    for kind, e, n, (below, level, above) in psb_rows:
        lines.append(f"| {kind} | {n} | {e['baseline_mean'] * 100:.2f} | "
                     f"{e['candidate_mean'] * 100:.2f} | {fmt_diff(e, digits=3)} | "
                     f"{ci_reading(e)} | {below} / {level} / {above} |")
    # benign traces, synthetic and real, at several capacities
    benign = benign_rows(out, cell)
    lines += ["", "## Benign traces at several capacities: LRU, S3-FIFO, PrefixShield, "
              "prefixshield-b", "",
              "All requests' mean hit fraction (%). ShareGPT-like traces: 16-token blocks, "
              f"{runs} seeded runs per cell. Real traces (public samples in `examples/traces/`, "
              "imported with psgate's importers; the runs of a cell are the corpus's traces): "
              "Mooncake's conversation trace, its first 6,000 requests as "
              f"{REAL['mooncake']['windows']} consecutive windows of "
              f"{REAL['mooncake']['requests']:,} requests, 512-token blocks, 6 tenants by "
              "`hash_ids[1] mod 6`; WEKA's agentic-coding sessions, the 30 smallest session "
              f"files as {REAL['weka']['bundles']} bundles of six, 64-token blocks, one tenant per "
              "session, all starting at t = 0. Contracts critical / standard / best-effort in "
              f"turn by tenant; each request holds its blocks {HOLD_S * 1000:g} ms + "
              f"{HOLD_PER_OUT_S * 1000:g} ms per output token (`done_t`, since neither sample "
              "records completions). The last columns compare prefixshield-b with LRU (paired, "
              "95% CI) and with the better of LRU and S3-FIFO (means).", "",
              "| trace | configured blocks (tokens each) | runs | LRU | S3-FIFO | PrefixShield | "
              "prefixshield-b | ps-b minus LRU, pp [95% CI] | ps-b minus best of LRU and "
              "S3-FIFO, pp | within 1 pp |", "|---|---|---|---|---|---|---|---|---|---|"]
    for kind, cap, bs, v in benign:
        best = max(v["lru"], v["s3fifo"])
        gap = (v["prefixshield-b"] - best) * 100
        lines.append(
            f"| {kind} | {cap} ({bs}) | {v['runs']} | {v['lru'] * 100:.2f} | "
            f"{v['s3fifo'] * 100:.2f} | {v['prefixshield'] * 100:.2f} | "
            f"{v['prefixshield-b'] * 100:.2f} | {fmt_diff(v['psb_vs_lru'])} | {gap:+.2f} | "
            f"{'yes' if gap >= -1.0 else '**no**'} |")
    lines += ["", "fig5.png plots these hit fractions against capacity, and prefixshield-b's "
              "paired difference from PrefixShield on the attack traces.", ""]
    lines += losses_note(psb_rows, benign)
    (out / "REPORT.md").write_text("\n".join(lines) + "\n")
    plots(out, cap_rows, load_rows, ab_rows, fig3b, pressure_rows)
    plot_tradeoff(out, tradeoff)
    plot_benign(out, benign, psb_rows)


def tradeoff_rows(out: Path, cell) -> list[tuple[str, str, dict]]:
    rows = []
    for kind in TRADEOFF_TRACES:
        attack = kind not in ("sharegpt", "sharegpt-bursty")
        scope = "victim" if attack else "all"
        pick = ((lambda s: s["roles"]["victim"]["hit_fraction"]) if attack
                else (lambda s: s["totals"]["hit_fraction"]))
        vals: dict[str, float | None] = {}
        for b in BOUNDS:
            e = pick(_summary(out, cell("tradeoff", kind, "prefixshield-b",
                                        {"probationary_bound": b})))
            vals[f"b={b}"] = e["candidate_mean"]
            vals["lru"] = e["baseline_mean"]
        for cand in ("s3fifo", "prefixshield"):
            section = ("table1" if kind in ATTACKS else "table2" if not attack else "tradeoff")
            cid = cell(section, kind, cand)
            vals[cand] = None if cid is None else pick(_summary(out, cid))["candidate_mean"]
        rows.append((kind, scope, vals))
    return rows


def benign_rows(out: Path, cell) -> list[tuple[str, int, int, dict]]:
    """(trace, configured blocks, tokens per block, values) for every benign trace and
    capacity: each policy's mean hit fraction (all requests), LRU's, runs, and
    prefixshield-b's paired difference from LRU."""
    rows = []
    cases = [(k, c, 16) for k in BENIGN for c in BENIGN_CAPACITIES]
    cases += [(k, c, r["block_tokens"]) for k, r in REAL.items()
              for c in (*r["capacities"], *TINY_REAL[k]["capacities"])]
    for kind, cap, bs in cases:
        if kind in REAL:
            ids = {p: cell("real", kind, p, cap=cap) for p in BENIGN_POLICIES}
        elif cap == 512:
            ids = {"s3fifo": cell("table2", kind, "s3fifo"),
                   "prefixshield": cell("table2", kind, "prefixshield"),
                   "prefixshield-b": cell("tradeoff", kind, "prefixshield-b",
                                          {"probationary_bound": "adaptive"})}
        else:
            ids = {p: cell("benign", kind, p, cap=cap) for p in BENIGN_POLICIES}
        if any(v is None for v in ids.values()) or (kind, cap, bs) in [r[:3] for r in rows]:
            continue
        v: dict = {}
        for pol, cid in ids.items():
            s = _summary(out, cid)
            t = s["totals"]["hit_fraction"]
            v[pol], v["lru"], v["runs"] = t["candidate_mean"], t["baseline_mean"], s["num_runs"]
            if pol == "prefixshield-b":
                v["psb_vs_lru"] = t
        rows.append((kind, cap, bs, v))
    return rows


def runs_compared(out: Path, cid: str, scope: str) -> tuple[int, int, int]:
    """(runs where the candidate's hit fraction in ``scope`` is below, equal to, above
    the baseline's), from the cell's runs.csv."""
    vals: dict[str, dict[str, float]] = {}
    with open(out / "cells" / cid / "runs.csv", newline="") as f:
        for row in csv.DictReader(f):
            if row["scope"] == scope:
                vals.setdefault(row["run"], {})[row["policy_role"]] = float(row["hit_fraction"])
    d = [v["candidate"] - v["baseline"] for v in vals.values()]
    return sum(x < 0 for x in d), sum(x == 0 for x in d), sum(x > 0 for x in d)


def losses_note(psb_rows, benign) -> list[str]:
    """Where prefixshield-b still loses, read off the two tables above."""
    att = [(k, e, below) for k, e, _, (below, _, _) in psb_rows
           if e["diff_mean"] < 0 or below]
    ben = [(k, c, v) for k, c, _, v in benign
           if v["prefixshield-b"] < max(v["lru"], v["s3fifo"])]
    out = ["## Where prefixshield-b still loses", ""]
    if not att and not ben:
        return out + ["Nowhere in these tables: it is at least PrefixShield's protection in "
                      "every run of every attack trace and at least the better of LRU and "
                      "S3-FIFO on every benign trace and capacity.", "", PSB_RULES_TRIED, ""]
    if att:
        out.append("Attack traces with runs below PrefixShield's victim hit fraction: "
                   + "; ".join(f"{k}, {below} runs, mean {e['diff_mean'] * 100:+.3f} pp "
                               f"({ci_reading(e)})" for k, e, below in att) + ".")
    if ben:
        out.append("Benign traces, below the better of LRU and S3-FIFO: " + "; ".join(
            f"{k} at {c} blocks {(v['prefixshield-b'] - max(v['lru'], v['s3fifo'])) * 100:+.2f} "
            f"pp" for k, c, v in ben) + ".")
    for text, some in ((WHY_PSB_ATTACK, att), (WHY_PSB_BENIGN, ben), (PSB_RULES_TRIED, True)):
        if some:
            out += ["", text]
    return out + [""]


def plot_benign(out: Path, benign, psb_rows) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = list(dict.fromkeys(k for k, *_ in benign))
    fig, axes = plt.subplots(2, 3, figsize=(13, 7.5))
    axes = axes.ravel()
    names = {"lru": "LRU", "s3fifo": "S3-FIFO", "prefixshield": "PrefixShield",
             "prefixshield-b": "prefixshield-b"}
    for ax, kind in zip(axes, kinds):
        rows = [(c, bs, v) for k, c, bs, v in benign if k == kind]
        for i, (pol, name) in enumerate(names.items()):
            ax.plot([c for c, _, _ in rows], [v[pol] * 100 for _, _, v in rows],
                    marker="o^sD"[i], color=f"C{i}", label=name)
        ax.set_xscale("log", base=2)
        ax.set_xlabel(f"configured blocks ({rows[0][1]} tokens each)")
        ax.set_ylabel("hit % (all requests)")
        ax.set_title(kind)
        ax.legend(fontsize=7)
    ax = axes[len(kinds)] if len(kinds) < len(axes) else None
    if ax is not None and psb_rows:
        for i, (kind, e, *_) in enumerate(psb_rows):
            lo = e["diff_ci_low"] if e["diff_ci_low"] is not None else e["diff_mean"]
            hi = e["diff_ci_high"] if e["diff_ci_high"] is not None else e["diff_mean"]
            ax.errorbar([i], [e["diff_mean"] * 100],
                        yerr=[[(e["diff_mean"] - lo) * 100], [(hi - e["diff_mean"]) * 100]],
                        fmt="o", color="C3", capsize=4)
        ax.axhline(0, color="grey", lw=0.8)
        ax.set_xticks(range(len(psb_rows)), [k for k, *_ in psb_rows], rotation=15)
        ax.set_ylabel("victim hit, pp (95% CI)")
        ax.set_title("prefixshield-b minus PrefixShield (attacks)")
    for extra in axes[len(kinds) + (1 if psb_rows else 0):]:
        extra.set_visible(False)
    fig.tight_layout()
    fig.savefig(out / "fig5.png", dpi=110)
    plt.close(fig)


def plot_tradeoff(out: Path, rows) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    attack = [v for k, s, v in rows if s == "victim"]
    benign = [v for k, s, v in rows if s == "all"]
    keys = ["lru", "s3fifo", "prefixshield", *[f"b={b}" for b in BOUNDS]]
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for i, k in enumerate(keys):
        xs = [v[k] for v in benign if v.get(k) is not None]
        ys = [v[k] for v in attack if v.get(k) is not None]
        if not xs or not ys:
            continue
        x, y = 100 * sum(xs) / len(xs), 100 * sum(ys) / len(ys)
        name = k if not k.startswith("b=") else f"prefixshield-b {k[2:]}"
        ax.scatter([x], [y], s=60, marker="o" if not k.startswith("b=") else "^",
                   color=f"C{i}", label=name)
    ax.set_xlabel("benign hit % (mean over the ShareGPT-like traces)")
    ax.set_ylabel("victim hit % (mean over the attack traces)")
    ax.set_title("protection vs benign hit rate (512 blocks)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "fig4.png", dpi=110)
    plt.close(fig)


def plots(out: Path, cap_rows, load_rows, ab_rows, fig3b, pressure_rows=()) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def err(e):
        return [[(e["diff_mean"] - e["diff_ci_low"]) * 100 if e["diff_ci_low"] is not None else 0],
                [(e["diff_ci_high"] - e["diff_mean"]) * 100 if e["diff_ci_high"] is not None else 0]]

    fig, axes = plt.subplots(1, 3, figsize=(15, 3.8))
    ax = axes[0]
    xs = [c for c, _, _ in cap_rows]
    for i, (c, e, _) in enumerate(cap_rows):
        ax.errorbar([c], [e["diff_mean"] * 100], yerr=err(e), fmt="o", color="C0",
                    label="psgate" if i == 0 else None, capsize=3)
    ax.plot(xs, [PAPER_GAIN_CAPACITY[c] for c in xs], "s--", color="C1", label="paper")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("configured blocks")
    ax.set_ylabel("victim hit gain over LRU (pp)")
    ax.set_title("one-touch: gain vs capacity")
    ax.legend()
    ax = axes[1]
    for i, (r, st, e, _) in enumerate(pressure_rows):
        obs = st["observed"]
        ax.errorbar([obs], [e["diff_mean"] * 100], yerr=err(e), fmt="o", color="C0",
                    label="psgate (observed ratio)" if i == 0 else None, capsize=3)
        if r is None:
            ax.annotate("default", (obs, e["diff_mean"] * 100), textcoords="offset points",
                        xytext=(-10, 8), fontsize=8)
    ax.plot(list(PAPER_PRESSURE), [g for g, _ in PAPER_PRESSURE.values()], "s--", color="C1",
            label="paper")
    ax.set_xscale("log")
    ax.set_xlabel("creation-pressure ratio (creation rate / refill)")
    ax.set_title("one-touch: gain vs creation pressure")
    ax.legend()
    ax = axes[2]
    for i, (a, e) in enumerate(load_rows):
        ax.errorbar([a * 100], [e["diff_mean"] * 100], yerr=err(e), fmt="o", color="C0",
                    label="psgate" if i == 0 else None, capsize=3)
    ax.plot([40, 60, 80], [PAPER_GAIN_LOAD[a] for a in (0.4, 0.6, 0.8)], "s--", color="C1",
            label="paper")
    ax.set_xlabel("nominal load (%)")
    ax.set_title("one-touch: gain vs load")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "fig2.png", dpi=110)
    plt.close(fig)

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    ax = axes[0]
    names = [k for k, _ in ab_rows]
    x = range(len(names))
    ax.bar([i - 0.2 for i in x], [v for _, v in ab_rows], width=0.4, label="psgate")
    ax.bar([i + 0.2 for i in x], [PAPER_NOSEG[k] for k in names], width=0.4, label="paper")
    ax.set_xticks(list(x), names, rotation=15)
    ax.set_ylabel("full minus no-segmentation (pp)")
    ax.set_title("segmentation ablation")
    ax.legend()
    ax = axes[1]
    fracs = sorted({f for f, *_ in fig3b})
    for j, cand in enumerate(("prefixshield", "prefixshield-nogate", "lru")):
        vals = [v for f, c, a, v, h in fig3b if c == cand]
        ax.bar([i + (j - 1) * 0.27 for i in range(len(fracs))], vals, width=0.27, label=cand)
    ax.set_xticks(range(len(fracs)), [f"{f:g} x clearance" for f in fracs])
    ax.set_ylabel("victim blocks evicted (mean)")
    ax.set_title("delayed replay")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "fig3.png", dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
