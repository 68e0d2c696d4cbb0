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
                        CANDIDATES, FIELD, FIELD_TRACES, HOLD_PER_OUT_S, HOLD_S, PAPER_PRESSURES, PRESSURES_BEYOND,
                        PSB_ATTACKS, REAL, STEP_RATES, TINY, TINY_REAL, TRADEOFF_TRACES,
                        field_capacity, label, paper_values)
from psgate.contracts import DEFAULT_CONTRACTS
from psgate.receipt.ledger import open_text
from psgate.stats.bootstrap import LEVEL
from psgate.workloads.paper import mean_bucket_debt

# prefixshield-b on a benign trace counts as keeping up when it is at most this far
# (pp) below the better of LRU and S3-FIFO
WITHIN_PP = 1.0
# The service-model reproduction's numbers, kept when the replay model became vLLM's
# scheduler (HISTORY.md says how they were taken); "What changed" compares with them.
SERVICE = Path(__file__).resolve().parent / "service_model.json"
# A psgate value this close to the paper's (pp) counts as the gap closed.
CLOSE_PP = 2.0


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
                           if (k not in shrunk or shrunk[k] != v) and k not in STEP_RATES},
                          sort_keys=True),
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
    data["field"] = _field(summary, cell, tiny)
    data["losses"] = {
        "attack": [r for r in psb if r["e"]["diff_mean"] < 0 or r["below"]],
        "benign": [r for r in data["benign"] if r["gap_pp"] < 0]}
    failed = [{"cell": spec["id"], "trace": kind, "baseline": spec["baseline"],
               "candidate": label(spec["candidate"], spec["candidate_params"]),
               "capacity": spec["capacity"], **_failed_checks(out, spec["id"])}
              for _, kind, spec in todo if results[spec["id"]]["gate"] != "pass"]
    data["gates"] = {"cells": len(todo), "passed": len(todo) - len(failed), "failed": failed}
    data["model"] = _model(out, first_run, cell("table1", "one-touch", "prefixshield"))
    data["saturation"] = _saturation(out, todo)
    data["mechanism"] = {kind: mechanism(out, cell("table1", kind, "prefixshield"))
                         for kind in ATTACKS}
    if SERVICE.exists():
        data["changed"] = changed(data, json.loads(SERVICE.read_text()))
    return data


def _model(out: Path, run: dict, cid: str) -> dict:
    """The replay model of the cells (a run receipt's config) and the rates the step model
    set for one-touch (its first trace's header)."""
    cfg = run["config"]
    exp = _experiment(out, cid)
    head = json.loads((out / "cells" / cid / exp["runs"][0]["trace"]["path"]).read_text()
                      .split("\n", 1)[0])
    d = head["generator"]["derived"]
    return {"scheduler": "step" if cfg.get("scheduler") else "service",
            "sched": cfg.get("scheduler"), "step_cost": cfg.get("step_cost_model"),
            "rates": _rates(d),
            "rate_model": d.get("rate_model")}


def _saturation(out: Path, todo) -> dict:
    """How many replays (a run's baseline or candidate) psgate's saturation check calls
    saturated, in all and per (section, trace) where any is."""
    rows: dict[tuple, list[int]] = {}
    for section, kind, spec in todo:
        for r in _experiment(out, spec["id"])["runs"]:
            rec = json.loads((out / "cells" / spec["id"] / r["receipt"]).read_text())
            for role in ("baseline", "candidate"):
                v = (rec["runs"][role].get("saturation") or {}).get("verdict")
                n = rows.setdefault((section, kind), [0, 0])
                n[0] += v == "saturated"
                n[1] += 1
    return {"saturated": sum(n[0] for n in rows.values()),
            "replays": sum(n[1] for n in rows.values()),
            "rows": [{"section": s, "trace": k, "saturated": n[0], "replays": n[1]}
                     for (s, k), n in rows.items() if n[0]]}


def _rates(derived: dict) -> dict:
    """One-touch's rates from a trace header's ``derived``, with its attack window's length."""
    r = {k: derived[k] for k in ("c_prefill_per_s", "victim_rate_per_s", "attack_rate_per_s",
                                 "attack_window_s")}
    r["attack_window_len_s"] = r["attack_window_s"][1] - r["attack_window_s"][0]
    return r


def _verdict(service: float, step: float, paper: float | None) -> str:
    if paper is None:
        return "no paper value"
    before, after = abs(service - paper), abs(step - paper)
    if after <= CLOSE_PP:
        return "closed" if before > CLOSE_PP else "stays closed"
    if abs(after - before) < 0.005:
        return "unchanged"
    return "narrowed" if after < before else "widened"


def changed(data: dict, service: dict) -> dict:
    """Row by row, the service-model value (``service``: service_model.json), the step
    model's, the paper's and whether the gap to the paper closed (within CLOSE_PP),
    narrowed or widened; each row carries the numbers that say why (LRU's and the
    candidate's own moves, and for the attack traces the ledgers' counts)."""
    rows = []

    def add(section, row, svc, new, paper, why):
        rows.append({"section": section, "row": row, "service": svc, "step": new,
                     "paper": paper, "verdict": _verdict(svc, new, paper), "why": why,
                     "gap_service": None if paper is None else abs(svc - paper),
                     "gap_step": None if paper is None else abs(new - paper),
                     "narrowed_by": None if paper is None else abs(svc - paper) - abs(
                         new - paper)})

    for new, old in zip(data["table1"], service["table1"]):
        kind = new["trace"]
        add("Table I", f"{kind}, lru", old["lru"] * 100, new["lru"] * 100, new["paper_lru"],
            {"kind": "lru", "trace": kind})
        for rn, ro in zip(new["rows"], old["rows"]):
            add("Table I", f"{kind}, {rn['policy']}", ro["e"]["candidate_mean"] * 100,
                rn["e"]["candidate_mean"] * 100, rn["paper"],
                {"kind": "policy", "trace": kind, "policy": rn["policy"],
                 "lru": [old["lru"] * 100, new["lru"] * 100],
                 "gain": [ro["e"]["diff_mean"] * 100, rn["e"]["diff_mean"] * 100]})

    def gain_rows(section, key, fmt, new_rows, old_rows, paper_key):
        old_by = {r[key]: r for r in old_rows}
        for rn in new_rows:
            ro = old_by.get(rn[key])
            if ro is None:
                continue
            en, eo = rn["e"], ro["e"]
            add(section, fmt(rn[key]), eo["diff_mean"] * 100, en["diff_mean"] * 100,
                rn[paper_key], {"kind": "gain",
                                "lru": [eo["baseline_mean"] * 100, en["baseline_mean"] * 100],
                                "ps": [eo["candidate_mean"] * 100,
                                       en["candidate_mean"] * 100]})

    gain_rows("Fig. 2 capacity (gain, pp)", "capacity", lambda c: f"{c} blocks",
              data["capacity"], service["capacity"], "paper")
    gain_rows("Fig. 2 load (gain, pp)", "alpha", lambda a: f"alpha {a:g}", data["load"],
              service["load"], "paper")
    gain_rows("Fig. 2 creation pressure (gain, pp)", "ratio",
              lambda r: "default" if r is None else f"ratio {r:g}", data["pressure"],
              service["pressure"], "paper_gain")
    return {"rows": rows, "close_pp": CLOSE_PP, "service_mechanism": service["mechanism"],
            "step_mechanism": data["mechanism"], "service_rates": _rates(service["rates"]),
            "step_rates": data["model"]["rates"]}


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


# Every policy of the field table, in its column order; belady last (not deployable).
FIELD_COLUMNS = ("lru", "s3fifo", "static-quota", "prefixshield", "prefixshield-b", *FIELD,
                 "belady")


def _field(summary, cell, tiny: bool) -> list[dict]:
    """Every policy on every attack and benign trace at one capacity: its mean hit
    fraction (the victim's on attack traces, all requests' on benign ones) and its paired
    difference from LRU, the best deployable policy (ties: all of them) and its distance
    to belady. A policy no cell ran on a trace (static-quota on benign ones) is None."""
    rows = []
    for kind in (*FIELD_TRACES, *REAL):
        attack = kind in ATTACKS
        if kind in REAL:
            cap = field_capacity(kind, tiny)
            ids = {p: cell("real", kind, p, cap=cap) for p in BENIGN_POLICIES}
            ids.update({p: cell("field", kind, p, cap=cap) for p in (*FIELD, "belady")})
        else:
            cap = 512
            known = "table1" if attack else "table2"
            ids = {p: cell(known, kind, p) for p in ("s3fifo", "static-quota", "prefixshield",
                                                      "belady")}
            ids["prefixshield-b"] = cell("tradeoff", kind, "prefixshield-b",
                                         {"probationary_bound": "adaptive"})
            ids.update({p: cell("field", kind, p) for p in FIELD})
        if ids.get("belady") is None or any(ids.get(p) is None for p in FIELD):
            continue
        values, vs_lru, runs = {}, {}, None
        for pol in FIELD_COLUMNS:
            cid = ids.get(pol)
            if pol == "lru" or cid is None:
                continue
            sm = summary(cid)
            e = sm["roles"]["victim"]["hit_fraction"] if attack else sm["totals"]["hit_fraction"]
            values[pol], values["lru"], runs = e["candidate_mean"], e["baseline_mean"], \
                sm["num_runs"]
            vs_lru[pol] = e
        deployable = {p: v for p, v in values.items() if p != "belady"}
        top = max(deployable.values())
        rows.append({"trace": kind, "scope": "victim" if attack else "all", "capacity": cap,
                     "block_tokens": REAL[kind]["block_tokens"] if kind in REAL else 16,
                     "runs": runs,
                     "values": {p: values.get(p) for p in FIELD_COLUMNS},
                     "vs_lru": vs_lru,
                     "best": [p for p in FIELD_COLUMNS if deployable.get(p) == top],
                     "best_minus_belady_pp": (top - values["belady"]) * 100})
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


def mechanism(out: Path, cid: str) -> dict:
    """What a one-touch cell's ledgers show, per policy role (baseline, candidate), means
    over runs: the victim's hit fraction and P95 TTFT; its prefix blocks evicted (content
    blocks the victim group cached), split by the evicting request's group, and how many
    fell inside the attack window; blocks of generated tokens evicted (the step model caches
    them; none in the service model); preemptions; and the blocks requests held while they
    queued for prefill, averaged over the attack window (the service model admits at
    arrival and holds a request's blocks from then on; the step model's waiting requests
    hold nothing, so theirs is 0 by construction and is computed the same way: from each
    request's allocation and queue delay). ``held_hit_share``: the share of the victim's hit
    tokens taken while another victim request on the same prefix held it; ``no_hit_share``:
    measured victim requests that hit nothing. ``age_s``: mean seconds an evicted victim prefix
    block had been free (LRU's ``freed_t``; None where the policy records none);
    ``candidates``: mean evictable blocks at those evictions (the rest were held by
    requests)."""
    acc: dict[str, dict[str, list]] = {"baseline": {}, "candidate": {}}
    exp = _experiment(out, cid)
    for r in exp["runs"]:
        run_dir = out / "cells" / cid / Path(r["receipt"]).parent
        rec = json.loads((run_dir / "receipt.json").read_text())
        step = rec["config"].get("scheduler") is not None
        start, end = _attack_window(out, cid, r)
        ledger = rec["config"].get("ledger", {}).get("file", "ledger.csv")
        per = {role: {"prefix_by_attacker": 0, "prefix_by_victim": 0, "prefix_in_window": 0,
                      "output": 0, "ages": [], "alloc": {}, "cands": []} for role in acc}
        with open_text(run_dir / ledger) as fh:
            for row in csv.DictReader(fh):
                role = row["run"]
                if role not in per:
                    continue
                p = per[role]
                if row["kind"] == "evict":
                    if row["hash"] == "":
                        p["output"] += 1
                    elif row["owner"] == "victim":
                        p["prefix_by_attacker" if row["group"] == "attacker"
                          else "prefix_by_victim"] += 1
                        t = float(row["t"])
                        p["prefix_in_window"] += start <= t < end
                        p["cands"].append(int(row["num_candidates"]))
                        note = json.loads(row["rank"]) if row["rank"] else {}
                        if "freed_t" in note:
                            p["ages"].append(t - note["freed_t"])
                elif row["kind"] == "admit" and not step:
                    p["alloc"][row["request"]] = int(row["allocated"] or 0)
        queued = {role: 0.0 for role in acc}
        ttft_q = {role: [] for role in acc}
        reads: dict[str, list] = {role: [] for role in acc}
        prefix = {}
        for line in (out / "cells" / cid / r["trace"]["path"]).read_text().splitlines()[1:]:
            req = json.loads(line)
            if req.get("role") == "victim":
                prefix[req["id"]] = req["prefix"]
        with open(run_dir / "requests.csv", newline="") as fh:
            for row in csv.DictReader(fh):
                role = row["run"]
                if role not in per or not row["queue_ms"]:
                    continue
                t = float(row["t"])
                admit = t + float(row["wait_ms"] or 0) / 1000
                began = t + float(row["queue_ms"]) / 1000
                if not step:
                    overlap = max(0.0, min(began, end) - max(admit, start))
                    queued[role] += per[role]["alloc"].get(row["id"], 0) * overlap
                if row["role"] == "victim" and row["measure"] == "1":
                    ttft_q[role].append(float(row["queue_ms"]))
                if row["role"] == "victim" and row["done_t"]:
                    # where its lookup took hits: admission (service), first scheduling (step)
                    looked = began if step else admit
                    reads[role].append((prefix[row["id"]], looked, float(row["done_t"]),
                                        int(row["cached_tokens"] or 0), row["measure"] == "1"))
        for role in acc:
            p, runs = per[role], rec["runs"][role]
            v = runs["metrics"]["roles"]["victim"]
            vals = {"hit": v["hit_fraction"], "ttft_p95_ms": v["ttft_p95_ms"],
                    "queue_ms": _mean(ttft_q[role]) if ttft_q[role] else 0.0,
                    "prefix_evicted": p["prefix_by_attacker"] + p["prefix_by_victim"],
                    "prefix_by_attacker": p["prefix_by_attacker"],
                    "prefix_by_victim": p["prefix_by_victim"],
                    "prefix_in_window": p["prefix_in_window"], "output_evicted": p["output"],
                    "preemptions": runs["counts"].get("preemptions", 0),
                    "queued_blocks": queued[role] / (end - start) if end > start else 0.0,
                    **_pinned(reads[role]),
                    "candidates": _mean(p["cands"]) if p["cands"] else None,
                    "age_s": _mean(p["ages"]) if p["ages"] else None}
            for k, x in vals.items():
                acc[role].setdefault(k, []).append(x)
    return {role: {k: (None if any(x is None for x in xs) else _mean(xs))
                   for k, xs in d.items()} for role, d in acc.items()}


def _pinned(reads: list[tuple]) -> dict:
    """Of the measured victim requests (prefix, lookup time, done time, cached tokens,
    measured): the share with no hit, and the share of hit tokens taken while another victim
    request on the same prefix held its blocks (looked up earlier, not yet done), which no
    eviction order can take away."""
    by: dict[str, list] = {}
    for x in reads:
        by.setdefault(x[0], []).append(x)
    hit = held = misses = measured = 0
    for xs in by.values():
        for _, t, _, cached, m in xs:
            if not m:
                continue
            measured += 1
            misses += cached == 0
            hit += cached
            if cached and any(t2 < t < d2 for _, t2, d2, _, _ in xs):
                held += cached
    return {"no_hit_share": misses / measured if measured else 0.0,
            "held_hit_share": held / hit if hit else 0.0}


def _attack_window(out: Path, cid: str, run: dict) -> tuple[float, float]:
    """The attack window of a run's trace (its header's ``derived.attack_window_s``)."""
    path = out / "cells" / cid / run["trace"]["path"]
    head = json.loads(path.read_text().split("\n", 1)[0])
    start, end = head["generator"]["derived"]["attack_window_s"]
    return start, end
