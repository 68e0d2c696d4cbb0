"""examples/paper/reproduce.py: the whole pipeline on shrunken workloads (--tiny), and the
report rendered from made-up results.

The committed examples/paper/REPORT.md comes from the full command; here the same code
runs on small traces so every table, figure and lookup is exercised, and the report's
numbers are checked against the cell receipts they were read from. Rendered from a fake
result set, the report may show no number that is neither in those results nor in
paper_values.json: prose with numbers typed into it would go stale at the next run.
"""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys
from pathlib import Path

from psgate.engines.step_cost import SchedulerParams, StepCostModel

ROOT = Path(__file__).resolve().parents[2]
PAPER_DIR = ROOT / "examples" / "paper"
sys.path.insert(0, str(PAPER_DIR))


def test_tiny_reproduction_end_to_end(tmp_path):
    out = tmp_path / "paper"
    cmd = [sys.executable, str(ROOT / "examples" / "paper" / "reproduce.py"), "--tiny",
           "--workers", "2", "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = (out / "REPORT.md").read_text()
    assert report.startswith("# The PrefixShield paper's evaluation")
    assert "Pipeline check only (--tiny)" in report
    for heading in ("## Table I", "## Table II", "## Table III", "## Fig. 2", "## Fig. 3a",
                    "## Fig. 3b", "## Beyond the paper: prefixshield-b",
                    "## prefixshield-b (default, adaptive) vs PrefixShield",
                    "## Benign traces at several capacities", "## Where prefixshield-b"):
        assert heading in report, heading
    assert "has no counterpart yet" not in report
    for png in ("fig2.png", "fig3.png", "fig4.png", "fig5.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # The one-touch PrefixShield row is the cell receipt's numbers, not a copy of the paper's.
    row = re.search(r"^\| one-touch \| prefixshield \| ([0-9.]+) \| ([+-][0-9.]+) ", report, re.M)
    cell = next(p for p in (out / "cells").iterdir()
                if p.name.startswith("table1-one-touch-") and json.loads(
                    (p / "cell.json").read_text())["candidate"] == "prefixshield"
                and not json.loads((p / "cell.json").read_text())["candidate_params"])
    v = json.loads((cell / "receipt.json").read_text())["summary"]["roles"]["victim"][
        "hit_fraction"]
    assert float(row[1]) == round(v["candidate_mean"] * 100, 2)
    assert float(row[2]) == round(v["diff_mean"] * 100, 2)
    # Creation-pressure rows: one per ratio, the gain read off its cell's receipt, the
    # observed ratio off its traces' headers.
    for ratio in ("0.54", "1.02", "2.14", "4.23"):
        row = re.search(rf"^\| {ratio} \| ([0-9.]+) \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \| "
                        rf"([+-][0-9.]+) ", report, re.M)
        assert row, ratio
        cid = _cell(out, "fig2-pressure-one-touch-", lambda c: c["params"].get(
            "creation_pressure") == float(ratio) and c["candidate"] == "prefixshield")
        v = _victim(cid)
        assert float(row[2]) == round(v["diff_mean"] * 100, 2)
        heads = [json.loads(p.read_text().splitlines()[0]) for p in (cid / "traces").iterdir()]
        obs = sum(h["generator"]["derived"]["creation_pressure"]["observed"] for h in heads)
        assert float(row[1]) == round(obs / len(heads), 2)
    # prefixshield-b against PrefixShield itself: the paired row is that cell's receipt
    for kind in ("one-touch", "low-and-slow", "two-pass-replay", "delayed-replay"):
        row = re.search(rf"^\| {kind} \| 2 \| ([0-9.]+) \| ([0-9.]+) \| ([+-][0-9.]+) ",
                        report, re.M)
        cid = _cell(out, f"psb-vs-ps-{kind}-", lambda c: True)
        spec = json.loads((cid / "cell.json").read_text())
        assert (spec["baseline"], spec["candidate"]) == ("prefixshield", "prefixshield-b")
        v = _victim(cid)
        assert float(row[1]) == round(v["baseline_mean"] * 100, 2)
        assert float(row[3]) == round(v["diff_mean"] * 100, 3)
    # real benign rows from the imported samples: one run per window / bundle of sessions
    for name, n in (("mooncake", 2), ("weka", 2)):
        assert re.search(rf"^\| {name} \| 1024 \([0-9]+\) \| {n} \| ", report, re.M), name
        traces = sorted((out / "cells" / f"corpus-{name}").glob("*.jsonl"))
        assert len(traces) == n
        head = json.loads(traces[0].read_text().splitlines()[0])
        assert head["import"]["format"] == name and "hold" in head["paper_reproduction"]
        assert all("done_t" in json.loads(x) for x in traces[0].read_text().splitlines()[1:])
    # The field's policies: one row per trace, each value its cell's receipt (the field
    # cell's for the field's policies; belady on a generated attack trace from Table I's)
    assert "## The field's policies on every trace" in report
    for kind, scope in (("one-touch", "victim"), ("sharegpt", "all"), ("weka", "all")):
        row = next(x for x in report.splitlines() if x.startswith(f"| {kind} ({scope}) |"))
        cols = [c.strip() for c in row.strip("|").split("|")]
        header = next(x for x in report.splitlines()
                      if x.startswith("| trace (scope) | configured blocks"))
        names = [c.strip() for c in header.strip("|").split("|")]
        vals = dict(zip(names, cols))
        for pol in ("arc", "tinylfu", "belady"):
            section = "field" if pol != "belady" or kind == "weka" else (
                "table1" if scope == "victim" else "table2")
            (cid,) = [d for d in (out / "cells").iterdir()
                      if re.fullmatch(rf"{section}-{kind}-[0-9a-f]+", d.name) and json.loads(
                          (d / "cell.json").read_text())["candidate"] == pol]
            sm = json.loads((cid / "receipt.json").read_text())["summary"]
            e = sm["roles"]["victim"] if scope == "victim" else sm["totals"]
            assert float(vals[pol]) == round(e["hit_fraction"]["candidate_mean"] * 100, 2)
        deployable = {n: float(v) for n, v in vals.items()
                      if n not in ("trace (scope)", "configured blocks (tokens each)", "runs",
                                   "best", "best minus belady, pp", "belady") and v != "-"}
        top = max(deployable.values())
        best = [n for n, v in deployable.items() if v == top]
        assert vals["best"] == (", ".join(best) if len(best) <= 3 else f"{len(best)} tie")
    # Every cell replays under vLLM's scheduler with the defaults, and generated traces take
    # their rates from the same step model; the report's header and comparison say so.
    ot = _cell(out, "table1-one-touch-", lambda c: c["candidate"] == "prefixshield"
               and not c["candidate_params"])
    spec = json.loads((ot / "cell.json").read_text())
    assert spec["scheduler"] == "step" and spec["params"]["rates"] == "step"
    assert spec["sched"] == SchedulerParams().to_json()
    assert spec["step_cost"] == StepCostModel().to_json()
    head = json.loads(next((ot / "traces").iterdir()).read_text().splitlines()[0])
    assert head["generator"]["derived"]["rate_model"]["kind"] == "step"
    assert "replayed with vLLM's scheduler (psgate's step scheduler" in report
    assert "## What changed under vLLM's scheduler" in report
    assert re.search(r"^\| Table I \| one-touch, lru \| 56\.44 \| ", report, re.M)
    # --render-only rewrites the same report from the saved plan, computing nothing
    before = (out / "REPORT.md").read_text()
    (out / "REPORT.md").unlink()
    proc = subprocess.run(cmd + ["--render-only"], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (out / "REPORT.md").read_text() == before
    # Interrupted or repeated: every cell resumes from its receipt, the report is the same.
    first = report.split("cells in")[1]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    cells = [p for p in (out / "cells").iterdir() if (p / "cell.json").exists()]
    assert proc.stderr.count("(resumed)") == len(cells)
    again = (out / "REPORT.md").read_text()
    assert again.split("cells in")[1].split("\n", 1)[1] == first.split("\n", 1)[1]


def _cell(out, prefix, pick):
    found = [p for p in (out / "cells").iterdir() if p.name.startswith(prefix)
             and pick(json.loads((p / "cell.json").read_text()))]
    assert len(found) == 1, (prefix, found)
    return found[0]


def _victim(cell):
    return json.loads((cell / "receipt.json").read_text())["summary"]["roles"]["victim"][
        "hit_fraction"]


# a number standing alone: not part of a word, a file name or a cell id ("fig2", "P95")
NUMBER = re.compile(r"(?<![\w.])[+-]?\d[\d,]*(?:\.\d+)?(?!\w)")


def test_report_shows_only_numbers_from_results_or_paper_values(tmp_path):
    import plots
    from experiment import paper_values
    from report import render

    data = with_changes(fake_results(random.Random(7)), random.Random(8))
    text = render(data)
    allowed = set()
    for source in (data, paper_values()):       # the values, not the notes of where
        for v in _leaves(source):
            allowed |= _renderings(v)
    stray = []
    for found in NUMBER.findall(text):
        n = found.rstrip(",")
        if n in allowed or n.lstrip("+-") in allowed:
            continue
        if re.fullmatch(r"\d", n):          # section labels: Table I, Fig. 2, t = 0
            continue
        stray.append(n)
    assert not stray, stray
    # every part of the report is there, the branches that print numbers in prose included
    for part in ("## Table I", "## Fig. 3b", "Across the paper's ratios",
                 "Beyond the paper's range: ratio 11.3 ",
                 "Attack traces with runs below", "Benign traces, below", "HISTORY.md",
                 "## Gate verdicts", "fails in the cells below",
                 "## What changed under vLLM's scheduler", "One-touch under LRU",
                 "flags 17 of 444 replays", "real mooncake, 13 of 14",
                 "max_num_batched_tokens 1999"):
        assert part in text, part
    plots.draw(tmp_path, data)          # the figures need nothing but the same data
    assert sorted(p.name for p in tmp_path.glob("fig*.png")) == [
        f"fig{i}.png" for i in (2, 3, 4, 5)]


def _leaves(x):
    if isinstance(x, dict):
        for v in x.values():
            yield from _leaves(v)
    elif isinstance(x, (list, tuple)):
        for v in x:
            yield from _leaves(v)
    else:
        yield x


def _renderings(v) -> set[str]:
    """The ways report.py may print a value: as it is or in percent, at 1 to 3 decimals,
    signed or not, with thousands separators, and without decimals where it is whole
    (rounding a fraction to a whole percent would let most two-digit numbers pass);
    numbers inside strings as they stand."""
    if isinstance(v, str):
        return {n.rstrip(",") for n in NUMBER.findall(v)}
    if isinstance(v, bool) or v is None:
        return set()
    out = {str(v), f"{v:g}"}
    for x in (v, v * 100):
        for d in range(1, 4):
            out |= {f"{x:.{d}f}", f"{x:+.{d}f}", f"{x:,.{d}f}"}
        if abs(x - round(x)) < 1e-9:
            out |= {f"{round(x)}", f"{round(x):,}"}
    return {o.lstrip("+-") for o in out} | out


def fake_results(rng: random.Random) -> dict:
    """A result set shaped as results.collect returns it, every number made up and unlike
    anything a template might hold (777 configured blocks, 13-token blocks, a 93% interval,
    bounds 0.07 and 0.13), so a number typed into the report's prose cannot pass as one."""
    def frac():
        return round(rng.uniform(0.11, 0.89), 6)

    def est(lo=-0.04, hi=0.04):
        d = round(rng.uniform(lo, hi), 6)
        return {"baseline_mean": frac(), "candidate_mean": frac(), "diff_mean": d,
                "diff_ci_low": round(d - rng.uniform(0.001, 0.01), 6),
                "diff_ci_high": round(d + rng.uniform(0.001, 0.01), 6)}

    def paper_pct():
        return round(rng.uniform(11, 99), 2)

    attacks = ("one-touch", "low-and-slow", "two-pass-replay")
    table1 = [{"trace": k, "lru": frac(), "paper_lru": paper_pct(),
               "rows": [{"policy": p, "e": est(), "paper": paper_pct() if p != "belady" else None}
                        for p in ("s3fifo", "prefixshield", "prefixshield(leaf_only=false)",
                                  "belady")],
               "control": est(), "control_paper_lru": paper_pct(),
               "p95": {p: rng.uniform(120, 3000) for p in ("lru", "prefixshield", "s3fifo")},
               "paper_p95": {"lru": paper_pct(), "prefixshield": None, "s3fifo": paper_pct()}}
              for k in attacks]
    table2 = [{"trace": k, "lru": frac(), "lru_p95": rng.uniform(120, 3000),
               "rows": [{"policy": p, "e": est(), "p95": rng.uniform(120, 3000),
                         "paper": [paper_pct(), paper_pct()] if p != "belady" else None}
                        for p in ("s3fifo", "prefixshield", "belady")]}
              for k in ("sharegpt", "sharegpt-bursty")]
    pressure = [{"ratio": r, "observed": rng.uniform(0.3, 60), "debt": rng.uniform(3, 9000),
                 "requests": rng.uniform(11, 99), "window": rng.uniform(11, 99),
                 "e": est(0.001, 0.04), "belady": est(),
                 "paper_gain": None if r is None or r > 8 else round(rng.uniform(11, 80), 2),
                 "paper_debt": None if r is None or r > 8 else round(rng.uniform(11, 999), 2)}
                for r in (0.57, 1.07, 2.17, 4.27, 11.3, None)]
    psb = [{"trace": k, "e": est(), "runs": 7, "below": 3, "level": 2, "above": 2}
           for k in (*attacks, "delayed-replay")]
    benign = []
    for k, bs in (("sharegpt", 13), ("mooncake", 523), ("weka", 67)):
        for cap in (777, 1555):
            v = {"trace": k, "capacity": cap, "block_tokens": bs, "runs": 7,
                 "psb_vs_lru": est(), "gap_pp": rng.uniform(-3, 3)}
            v.update({p: frac() for p in ("lru", "s3fifo", "prefixshield", "prefixshield-b")})
            v["within"] = v["gap_pp"] >= -1.5
            benign.append(v)
    bounds = [0.07, 0.13, "adaptive"]

    def mech():
        return {role: {"hit": frac(), "ttft_p95_ms": rng.uniform(120, 3000),
                       "queue_ms": rng.uniform(11, 999), "prefix_evicted": rng.uniform(11, 9999),
                       "prefix_by_attacker": rng.uniform(11, 9999),
                       "prefix_by_victim": rng.uniform(11, 9999),
                       "prefix_in_window": rng.uniform(11, 9999),
                       "candidates": rng.uniform(11, 700), "queued_blocks": rng.uniform(11, 99),
                       "output_evicted": rng.uniform(11, 99), "preemptions": rng.uniform(2, 9),
                       "held_hit_share": frac(), "no_hit_share": frac(),
                       "age_s": rng.uniform(0.11, 0.99)} for role in ("baseline", "candidate")}

    def rates():
        return {"c_prefill_per_s": rng.uniform(3, 19), "victim_rate_per_s": rng.uniform(3, 19),
                "attack_rate_per_s": rng.uniform(3, 19), "attack_window_s": [11.5, 71.25],
                "attack_window_len_s": 59.75}

    model = {"scheduler": "step", "rates": rates(),
             "sched": {"max_num_batched_tokens": 1999, "max_num_seqs": 77,
                       "enable_chunked_prefill": True, "long_prefill_token_threshold": 33,
                       "watermark": 0.03},
             "step_cost": {"source": "made up", "fixed_ms": 11.5, "per_prefill_token_ms": 0.07,
                           "per_context_token_ms": 0.003, "per_decode_ms": 0.15,
                           "per_decode_context_token_ms": 0.0005}}
    return {
        "meta": {"quick": False, "tiny": False, "runs": 7, "seed": 3, "cells": 123,
                 "replay_min": 41.234, "fresh": 45, "resumed": 78, "wall_min": 12.345,
                 "workers": 2, "cpus": 37, "ci_level": 93, "configured": 777, "usable": 776,
                 "block_tokens": 13, "attacker_refill": 17.5, "within_pp": 1.5,
                 "hold_ms": 51.0, "hold_per_out_ms": 0.3, "bounds": bounds,
                 "s3fifo_move_threshold": 3,
                 "real": {"mooncake": {"windows": 4, "requests": 1111, "total": 4444,
                                       "block_tokens": 523, "tenants": 7},
                          "weka": {"bundles": 4, "sessions": 28, "per_bundle": 7,
                                   "block_tokens": 67}}},
        "table1": table1, "table2": table2,
        "table3": [{"policy": p, "held": rng.uniform(100, 770), "hit": frac(),
                    "paper": s} for p, s in (("lru", "- (98.76%)"), ("s3fifo", "654-655"),
                                             ("prefixshield", "-"))],
        "capacity": [{"capacity": c, "e": est(), "belady": est(), "paper": paper_pct()}
                     for c in (777, 1555, 3111)],
        "load": [{"alpha": a, "e": est(), "paper": paper_pct()} for a in (0.37, 0.63)],
        "pressure": pressure,
        "ablation": [{"trace": k, "scope": "victim", "full": 100 * frac(), "noseg": 100 * frac(),
                      "diff": rng.uniform(-3, 3), "paper": paper_pct()} for k in attacks],
        "delayed": [{"delay": d, "policy": p, "promoted": None if p == "lru" else
                     rng.uniform(11, 300), "denied": None if p == "lru" else rng.uniform(11, 300),
                     "attacker_evicted": rng.uniform(11, 300),
                     "victim_evicted": rng.uniform(11, 300), "victim_hit": 100 * frac()}
                    for d in (0.0, 0.7) for p in ("prefixshield", "prefixshield-nogate", "lru")],
        "tradeoff": [{"trace": k, "scope": s, "values": {
            key: frac() for key in ("lru", "s3fifo", "prefixshield", *(f"b={b}" for b in bounds))}}
            for k, s in (("one-touch", "victim"), ("sharegpt", "all"))],
        "psb": psb, "benign": benign,
        "losses": {"attack": psb[:2], "benign": [v for v in benign if v["gap_pp"] < 0]},
        "gates": {"cells": 123, "passed": 111, "failed": [
            {"cell": "table2-sharegpt-abcdef", "trace": "sharegpt", "baseline": "lru",
             "candidate": "prefixshield", "capacity": 777, "runs": 7,
             "paired": ["non-regression hit_fraction (group:tenant-a)"],
             "checks": [{"name": "candidate exercised eviction", "runs": 4}]}]},
        "model": model, "mechanism": {k: mech() for k in attacks},
        "saturation": {"saturated": 17, "replays": 444, "rows": [
            {"section": "real", "trace": "mooncake", "saturated": 13, "replays": 14}]},
    }


def with_changes(data: dict, rng: random.Random) -> dict:
    """``data`` with the service-model comparison results.collect adds, computed by
    results.changed from a made-up service snapshot shaped as service_model.json."""
    from results import changed
    service = fake_results(rng)
    service = {k: service[k] for k in ("table1", "capacity", "load", "pressure")} | {
        "mechanism": service["mechanism"], "rates": service["model"]["rates"]}
    return {**data, "changed": changed(data, service)}
