"""Read the finished cells into the plain numbers the report and the figures show.

Every number REPORT.md prints is computed here (or is a paper value from
paper_values.json): report.py and plots.py only format and draw, so a test can render a
report from made-up results and check that nothing else reaches the page.
"""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

from experiment import (ATTACKS, BENIGN, BENIGN_CAPACITIES, BENIGN_POLICIES, BOUNDS,
                        CANDIDATES, HOLD_PER_OUT_S, HOLD_S, PAPER_PRESSURES, PRESSURES_BEYOND,
                        PSB_ATTACKS, REAL, TINY, TINY_REAL, TRADEOFF_TRACES, label,
                        paper_values)
from psgate.contracts import DEFAULT_CONTRACTS
from psgate.receipt.ledger import open_text
from psgate.stats.bootstrap import LEVEL
from psgate.workloads.paper import mean_bucket_debt

# prefixshield-b on a benign trace counts as keeping up when it is at most this far
# (pp) below the better of LRU and S3-FIFO
WITHIN_PP = 1.0


def collect(out: Path, todo, results: dict[str, dict], runs: int, quick: bool, wall: float,
            tiny: bool, workers: int, seed: int) -> dict:
    """The report's data: plain dicts, lists and numbers (hit fractions as fractions)."""
    paper = paper_values()
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

    def summary(cid):
        return _summary(out, cid)

    def victim(cid):
        return summary(cid)["roles"]["victim"]["hit_fraction"]

    first = _experiment(out, cell("table1", "one-touch", "prefixshield"))
    first_run = json.loads((out / "cells" / first["_id"] / first["runs"][0]["receipt"])
                           .read_text())
    fresh = sum(1 for r in results.values() if not r["resumed"])
    data: dict = {"meta": {
        "quick": quick, "tiny": tiny, "runs": runs, "seed": seed, "cells": len(todo),
        "replay_min": sum(_experiment(out, s["id"])["environment"]["wall_s"]
                          for *_, s in todo) / 60,
        "fresh": fresh, "resumed": len(todo) - fresh, "wall_min": wall / 60,
        "workers": workers, "cpus": os.cpu_count(), "ci_level": round(LEVEL * 100),
        "configured": first["config"]["capacity"], "usable": first["config"]["usable_blocks"],
        "block_tokens": first_run["config"]["block_size"],
        "attacker_refill": DEFAULT_CONTRACTS["best-effort"][0], "within_pp": WITHIN_PP,
        "hold_ms": HOLD_S * 1000, "hold_per_out_ms": HOLD_PER_OUT_S * 1000,
        "bounds": list(BOUNDS), "real": _real_meta(out),
        "s3fifo_move_threshold": _experiment(out, cell("table1", "one-touch", "s3fifo"))[
            "config"]["candidate"]["params"]["move_threshold"]}}

    table1 = []
    for kind in ATTACKS:
        pv = paper["attack_victim_hit_pct"].get(kind, {})
        rows = []
        for cand, cp in CANDIDATES:
            rows.append({"policy": label(cand, cp), "e": victim(cell("table1", kind, cand, cp)),
                         "paper": pv.get(cand) if not cp else None})
        ctrl = victim(cell("control", kind, "prefixshield", params={"attack": False}))
        ps = summary(cell("table1", kind, "prefixshield"))["roles"]["victim"]["ttft_p95_ms"]
        s3 = summary(cell("table1", kind, "s3fifo"))["roles"]["victim"]["ttft_p95_ms"]
        p95 = paper["attack_victim_p95_ttft_ms"].get(kind, {})
        table1.append({
            "trace": kind, "lru": victim(cell("table1", kind, "prefixshield"))["baseline_mean"],
            "paper_lru": pv.get("lru"), "rows": rows, "control": ctrl,
            "control_paper_lru": paper["no_attack_lru_victim_hit_pct"].get(kind),
            "p95": {"lru": ps["baseline_mean"], "prefixshield": ps["candidate_mean"],
                    "s3fifo": s3["candidate_mean"]},
            "paper_p95": {p: p95.get(p) for p in ("lru", "prefixshield", "s3fifo")}})
    data["table1"] = table1

    table2 = []
    for kind in BENIGN:
        base = summary(cell("table2", kind, "prefixshield"))["totals"]
        rows = []
        for cand in ("s3fifo", "prefixshield", "belady"):
            t = summary(cell("table2", kind, cand))["totals"]
            hit = paper["benign_hit_pct"].get(kind, {}).get(cand)
            rows.append({"policy": cand, "e": t["hit_fraction"],
                         "p95": t["ttft_p95_ms"]["candidate_mean"],
                         "paper": None if hit is None else
                         [hit, paper["benign_p95_ttft_ms"][kind].get(cand)]})
        table2.append({"trace": kind, "lru": base["hit_fraction"]["baseline_mean"],
                       "lru_p95": base["ttft_p95_ms"]["baseline_mean"], "rows": rows})
    data["table2"] = table2

    table3 = []
    for cand in ("s3fifo", "static-quota", "prefixshield", "belady"):
        cid = cell("table3", "borrowing", cand)
        recs = _cell_receipts(out, cid)
        t = summary(cid)["totals"]["hit_fraction"]
        if not table3:
            table3.append({"policy": "lru", "held": _mean(
                r["runs"]["baseline"]["metrics"]["groups"]["active"]["occupancy_max"]
                for r in recs), "hit": t["baseline_mean"], "paper": paper["borrowing"]["lru"]})
        table3.append({"policy": cand, "held": _mean(
            r["runs"]["candidate"]["metrics"]["groups"]["active"]["occupancy_max"]
            for r in recs), "hit": t["candidate_mean"], "paper": paper["borrowing"][cand]})
    data["table3"] = table3

    capacity = []
    for c in (512, 1024, 2048, 4096):
        ps, bel = ((cell("table1", "one-touch", "prefixshield"),
                    cell("table1", "one-touch", "belady")) if c == 512 else
                   (cell("fig2-capacity", "one-touch", p, params={"capacity_target": c}, cap=c)
                    for p in ("prefixshield", "belady")))
        if ps is not None:
            capacity.append({"capacity": c, "e": victim(ps), "belady": victim(bel),
                             "paper": paper["capacity_gain_pp"].get(str(c))})
    data["capacity"] = capacity
    data["load"] = [{"alpha": a, "paper": paper["load_gain_pp"].get(str(a)), "e": victim(
        cell("table1", "one-touch", "prefixshield") if a == 0.6 else
        cell("fig2-load", "one-touch", "prefixshield", params={"alpha": a}))}
        for a in (0.4, 0.6, 0.8)]

    paper_cp = {p["ratio"]: p for p in paper["creation_pressure"]}
    pressure = []
    for r in (*PAPER_PRESSURES, *PRESSURES_BEYOND, None):
        cid, bel = ((cell("table1", "one-touch", "prefixshield"),
                     cell("table1", "one-touch", "belady")) if r is None else
                    (cell("fig2-pressure", "one-touch", p, params={"creation_pressure": r})
                     for p in ("prefixshield", "belady")))
        if cid is None:
            continue
        p = paper_cp.get(r, {})
        pressure.append({"ratio": r, **_attack_pressure(out, cid), "e": victim(cid),
                         "belady": None if bel is None else victim(bel),
                         "paper_gain": p.get("gain_pp"), "paper_debt": p.get("mean_debt_blocks")})
    data["pressure"] = pressure

    ablation = []
    for kind in ("one-touch", "low-and-slow", "sharegpt", "borrowing"):
        attack = kind in ATTACKS
        full_cell = (cell("table1", kind, "prefixshield") if attack
                     else cell("fig3a", kind, "prefixshield"))
        noseg_cell = cell("fig3a", kind, "prefixshield-noseg")
        pick = victim if attack else (lambda c: summary(c)["totals"]["hit_fraction"])
        full = pick(full_cell)["candidate_mean"] * 100
        noseg = pick(noseg_cell)["candidate_mean"] * 100
        ablation.append({"trace": kind, "scope": "victim" if attack else "all", "full": full,
                         "noseg": noseg, "diff": full - noseg,
                         "paper": paper["segmentation_ablation_pp"][kind]})
    data["ablation"] = ablation

    delayed = []
    for frac in (0.0, 0.5, 1.0):
        for cand in ("prefixshield", "prefixshield-nogate", "lru"):
            cid = cell("fig3b", "delayed-replay", cand, params={"delay_fraction": frac})
            groups = [r["runs"]["candidate"]["metrics"]["groups"]
                      for r in _cell_receipts(out, cid)]
            promoted, denied = ((None, None) if cand == "lru"
                                else _ledger_promotions(out, cid, "attacker"))
            delayed.append({
                "delay": frac, "policy": cand, "promoted": promoted, "denied": denied,
                "attacker_evicted": _mean(g.get("attacker", {}).get("evictions_suffered", 0)
                                          for g in groups),
                "victim_evicted": _mean(g.get("victim", {}).get("evictions_suffered", 0)
                                        for g in groups),
                "victim_hit": victim(cid)["candidate_mean"] * 100})
    data["delayed"] = delayed

    data["tradeoff"] = _tradeoff(summary, cell)
    psb = []
    for kind in PSB_ATTACKS:
        cid = cell("psb-vs-ps", kind, "prefixshield-b")
        if cid is not None:
            below, level, above = _runs_compared(out, cid, "role:victim")
            psb.append({"trace": kind, "e": victim(cid), "runs": summary(cid)["num_runs"],
                        "below": below, "level": level, "above": above})
    data["psb"] = psb
    data["benign"] = _benign(summary, cell)
    data["losses"] = {
        "attack": [r for r in psb if r["e"]["diff_mean"] < 0 or r["below"]],
        "benign": [r for r in data["benign"] if r["gap_pp"] < 0]}
    failed = [{"cell": spec["id"], "trace": kind, "baseline": spec["baseline"],
               "candidate": label(spec["candidate"], spec["candidate_params"]),
               "capacity": spec["capacity"], **_failed_checks(out, spec["id"])}
              for _, kind, spec in todo if results[spec["id"]]["gate"] != "pass"]
    data["gates"] = {"cells": len(todo), "passed": len(todo) - len(failed), "failed": failed}
    return data


def _failed_checks(out: Path, cid: str) -> dict:
    """What failed in a cell's gate: its checks on the paired runs, and per check that
    failed in a run's own gate, how many runs it failed in (the cell's gate names only
    the run)."""
    paired = [c["name"] for c in _experiment(out, cid)["gate"]["checks"]
              if c["verdict"] == "fail" and c.get("run") == "paired"]
    recs = _cell_receipts(out, cid)
    count: dict[str, int] = {}
    for r in recs:
        for c in r["gate"]["checks"]:
            if c["verdict"] == "fail":
                count[c["name"]] = count.get(c["name"], 0) + 1
    return {"runs": len(recs), "paired": paired,
            "checks": [{"name": n, "runs": k} for n, k in count.items()]}


def _tradeoff(summary, cell) -> list[dict]:
    rows = []
    for kind in TRADEOFF_TRACES:
        attack = kind not in BENIGN
        pick = ((lambda s: s["roles"]["victim"]["hit_fraction"]) if attack
                else (lambda s: s["totals"]["hit_fraction"]))
        vals: dict[str, float | None] = {}
        for b in BOUNDS:
            e = pick(summary(cell("tradeoff", kind, "prefixshield-b",
                                  {"probationary_bound": b})))
            vals[f"b={b}"] = e["candidate_mean"]
            vals["lru"] = e["baseline_mean"]
        for cand in ("s3fifo", "prefixshield"):
            section = ("table1" if kind in ATTACKS else "table2" if not attack else "tradeoff")
            cid = cell(section, kind, cand)
            vals[cand] = None if cid is None else pick(summary(cid))["candidate_mean"]
        rows.append({"trace": kind, "scope": "victim" if attack else "all", "values": vals})
    return rows


def _benign(summary, cell) -> list[dict]:
    """Every benign trace and capacity: each policy's mean hit fraction (all requests),
    LRU's, runs, prefixshield-b's paired difference from LRU and its gap to the better
    of LRU and S3-FIFO (pp)."""
    rows = []
    cases = [(k, c, 16) for k in BENIGN for c in BENIGN_CAPACITIES]
    cases += [(k, c, r["block_tokens"]) for k, r in REAL.items()
              for c in (*r["capacities"], *TINY_REAL[k]["capacities"])]
    seen = set()
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
        if any(v is None for v in ids.values()) or (kind, cap, bs) in seen:
            continue
        seen.add((kind, cap, bs))
        v: dict = {"trace": kind, "capacity": cap, "block_tokens": bs}
        for pol, cid in ids.items():
            s = summary(cid)
            t = s["totals"]["hit_fraction"]
            v[pol], v["lru"], v["runs"] = t["candidate_mean"], t["baseline_mean"], s["num_runs"]
            if pol == "prefixshield-b":
                v["psb_vs_lru"] = t
        v["gap_pp"] = (v["prefixshield-b"] - max(v["lru"], v["s3fifo"])) * 100
        v["within"] = v["gap_pp"] >= -WITHIN_PP
        rows.append(v)
    return rows


def _real_meta(out: Path) -> dict:
    """How the real corpora were cut, read back from the traces' headers."""
    heads = {name: [json.loads(p.read_text().split("\n", 1)[0])["paper_reproduction"]
                    for p in sorted((out / "cells" / f"corpus-{name}").glob("*.jsonl"))]
             for name in REAL}
    moon, weka = heads["mooncake"], heads["weka"]
    return {"mooncake": {"windows": len(moon), "requests": moon[0]["lines"][1] -
                         moon[0]["lines"][0] + 1, "total": moon[-1]["lines"][1],
                         "block_tokens": REAL["mooncake"]["block_tokens"],
                         "tenants": REAL["mooncake"]["tenants"]},
            "weka": {"bundles": len(weka), "sessions": sum(len(h["sessions"]) for h in weka),
                     "per_bundle": len(weka[0]["sessions"]),
                     "block_tokens": REAL["weka"]["block_tokens"]}}


def _mean(values) -> float:
    values = list(values)
    return sum(values) / len(values)


def _experiment(out: Path, cid: str) -> dict:
    return {**json.loads((out / "cells" / cid / "receipt.json").read_text()), "_id": cid}


def _summary(out: Path, cid: str) -> dict:
    return _experiment(out, cid)["summary"]


def _cell_receipts(out: Path, cid: str) -> list[dict]:
    return [json.loads((out / "cells" / cid / r["receipt"]).read_text())
            for r in _experiment(out, cid)["runs"]]


def _ledger_promotions(out: Path, cid: str, group: str) -> tuple[float, float]:
    """Mean over runs of blocks the group's admissions promoted and were denied (candidate)."""
    promoted, denied = [], []
    for r in _experiment(out, cid)["runs"]:
        run_dir = out / "cells" / cid / Path(r["receipt"]).parent
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
    return _mean(promoted), _mean(denied)


def _runs_compared(out: Path, cid: str, scope: str) -> tuple[int, int, int]:
    """(runs where the candidate's hit fraction in ``scope`` is below, equal to, above
    the baseline's), from the cell's runs.csv."""
    vals: dict[str, dict[str, float]] = {}
    with open(out / "cells" / cid / "runs.csv", newline="") as f:
        for row in csv.DictReader(f):
            if row["scope"] == scope:
                vals.setdefault(row["run"], {})[row["policy_role"]] = float(row["hit_fraction"])
    d = [v["candidate"] - v["baseline"] for v in vals.values()]
    return sum(x < 0 for x in d), sum(x == 0 for x in d), sum(x > 0 for x in d)


def _attack_pressure(out: Path, cid: str) -> dict:
    """Means over a one-touch cell's traces: the observed creation-pressure ratio, the
    nominal mean debt, attack requests and the attack window (s). The ratio and debt come
    from the header where creation_pressure set them, otherwise they are computed the same
    way from the attacker's requests over the attack window."""
    rows = []
    for p in sorted((out / "cells" / cid / "traces").glob("*.jsonl")):
        lines = [json.loads(x) for x in p.read_text().splitlines()]
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
    return {k: _mean(r[i] for r in rows)
            for i, k in enumerate(("observed", "debt", "requests", "window"))}
