"""Run the pre-registered evaluation of prefixshield-b (protocol.toml beside this file).

    python examples/paper/evaluate.py                      # held-out set, registered rule
    python examples/paper/evaluate.py --set tuning         # the declared tuning set
    python examples/paper/evaluate.py --set tuning --rule-params '{"evidence_fill": 0.25}'
    python examples/paper/evaluate.py --report examples/paper/REPORT.md   # also the report

Every cell of the chosen set replays each of its runs (seeds, Mooncake windows, WEKA
bundles) under the protocol's policies and the rule, on psgate's sim engine with vLLM's
scheduler (``--scheduler step``, default settings and step cost model), checking every
hard invariant. Per cell: each policy's mean hit fraction (over runs; a run's is the mean
over its measured requests of the scope), the rule's paired difference from each with its
95% percentile-bootstrap interval over runs, and the criterion's verdict (protocol
[criteria]). It writes OUT/results.json and OUT/results.md and, with --report, replaces the
section between the held-out markers of that REPORT.md (appending it once).

The held-out set runs the registered rule only: --rule-params is refused there, so that
the set's numbers are never a tuning signal. A cell whose traces are under shared: is
skipped, and named, when ../shared/traces is absent.

Exit status: 0 every criterion met, 1 some criterion not met (or an invariant broke),
2 bad protocol or options.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import statistics
import sys
import tempfile
import tomllib
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from psgate.atomic import write_atomic  # noqa: E402
from psgate.bench.traces import load  # noqa: E402
from psgate.contracts import CONTRACT_NAMES, contracts_params, parse_contracts  # noqa: E402
from psgate.engines import engine_class  # noqa: E402
from psgate.engines.cost import CostModel  # noqa: E402
from psgate.engines.replicas import merge_results, replicas_of  # noqa: E402
from psgate.experiment import derive_seed  # noqa: E402
from psgate.policies import make_policy, policy_names  # noqa: E402
from psgate.stats.bootstrap import bootstrap_ci  # noqa: E402
from psgate.stats.metrics import run_metrics  # noqa: E402
from psgate.stats.saturation import SATURATED, SaturationMeter  # noqa: E402
from psgate.suggest import SuggestConfig, rest_lines, split_time_s, suggest  # noqa: E402
from psgate.sweep import code_digest  # noqa: E402
from psgate.trace.future import future_uses  # noqa: E402
from psgate.trace.importers import import_trace  # noqa: E402
from psgate.trace.reader import TraceSource  # noqa: E402
from psgate.trace.writer import write_trace  # noqa: E402
from psgate.workloads import generate, generators  # noqa: E402

from experiment import import_sessions, with_hold  # noqa: E402  (examples/paper)
from report import best_names  # noqa: E402  (examples/paper)

PROTOCOL = Path(__file__).resolve().parent / "protocol.toml"
SHARED = ROOT.parent / "shared" / "traces"
BEGIN, END = "<!-- heldout:begin -->", "<!-- heldout:end -->"
SPLIT_BEGIN, SPLIT_END = "<!-- split:begin -->", "<!-- split:end -->"
DEFAULTS = "default contracts"     # --split: the split policy with the built-in table
SUGGEST_KEYS = ("window_s", "quantile", "headroom", "max_burst_share", "min_refill",
                "min_burst", "default")
MOONCAKE_TENANTS = 6
RULE = "rule"
REPORT_SEEDS = 10       # the paper reproduction's runs: derive_seed(0, i), i < 10 (tuning)


class ProtocolError(Exception):
    """A protocol file or option that cannot be run: one line, exit 2."""


class Unmeasurable(Exception):
    """A cell left with fewer than 2 runs that have a measured request."""


# -- the protocol --------------------------------------------------------------------
def load_protocol(path: Path) -> dict:
    try:
        proto = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ProtocolError(f"{path}: {exc}") from None
    for key in ("version", "rule", "replay", "statistics", "criteria", "tuning", "heldout"):
        if key not in proto:
            raise ProtocolError(f"{path}: missing '{key}'")
    if proto["version"] != 1:
        raise ProtocolError(f"{path}: version: expected 1, found {proto['version']!r}")
    if proto["replay"].get("scheduler") != "step":
        raise ProtocolError(f"{path}: replay.scheduler: expected 'step', found "
                            f"{proto['replay'].get('scheduler')!r}")
    for set_name in ("tuning", "heldout"):
        for i, cell in enumerate(proto[set_name]):
            where = f"{path}: {set_name}[{i}]"
            for key in ("name", "kind", "capacities"):
                if key not in cell:
                    raise ProtocolError(f"{where}: missing '{key}'")
            if cell["kind"] not in ("attack", "benign"):
                raise ProtocolError(f"{where}.kind: expected 'attack' or 'benign', found "
                                    f"{cell['kind']!r}")
            if "workload" in cell:
                if cell["workload"] not in generators():
                    raise ProtocolError(f"{where}.workload: unknown generator "
                                        f"{cell['workload']!r}")
                first, count = cell.get("seeds", [None, None])
                if type(first) is not int or type(count) is not int or count < 2:
                    raise ProtocolError(f"{where}.seeds: expected [first, count >= 2], found "
                                        f"{cell.get('seeds')!r}")
            elif cell.get("format") not in ("mooncake", "weka"):
                raise ProtocolError(f"{where}: expected 'workload' or format 'mooncake' or "
                                    f"'weka', found {cell.get('format')!r}")
    _check_reported(proto, path)
    _check_disjoint(proto, path)
    _check_split(proto, path)
    return proto


def _check_split(proto: dict, path: Path) -> None:
    """[split] (optional): the time-split rule, a PrefixShield-family policy replayed on
    the rest of each trace with contracts suggested from its first part."""
    sp = proto.get("split")
    if sp is None:
        return
    extra = sorted(set(sp) - {"history", "policy", "params", "suggest"})
    if extra:
        raise ProtocolError(f"{path}: split.{extra[0]}: unknown key")
    if not isinstance(sp.get("history"), float) or not 0 < sp["history"] < 1:
        raise ProtocolError(f"{path}: split.history: expected a fraction in (0, 1), found "
                            f"{sp.get('history')!r}")
    if sp.get("policy") not in ("prefixshield", "prefixshield-b"):
        raise ProtocolError(f"{path}: split.policy: expected prefixshield or "
                            f"prefixshield-b, found {sp.get('policy')!r}")
    bad = sorted(set(sp.get("suggest", {})) - set(SUGGEST_KEYS))
    if bad:
        raise ProtocolError(f"{path}: split.suggest.{bad[0]}: unknown key (expected one of "
                            f"{', '.join(SUGGEST_KEYS)})")


def _trace_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_bytes().splitlines()]


def _check_reported(proto: dict, path: Path) -> None:
    """[report] policies (optional): known names, each once, none of them judged."""
    names = proto.get("report", {}).get("policies", [])
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ProtocolError(f"{path}: report.policies: expected a list of policy names, "
                            f"found {names!r}")
    known = set(policy_names())
    judged = set(proto["replay"].get("policies", [])) | {proto["rule"]["policy"]}
    for n in names:
        if n not in known:
            raise ProtocolError(f"{path}: report.policies: unknown policy {n!r}")
        if n in judged or names.count(n) > 1:
            raise ProtocolError(f"{path}: report.policies: {n!r} is already replayed "
                                f"(judged or named twice)")


def reported(proto: dict) -> list[str]:
    """The protocol's reported, never judged, policies in its order."""
    return list(proto.get("report", {}).get("policies", []))


def _seeds(cell: dict) -> list[int]:
    first, count = cell["seeds"]
    return list(range(first, first + count))


def _check_disjoint(proto: dict, path: Path) -> None:
    """No held-out generated run is a tuning run: seeds per workload (the paper
    reproduction's derived seeds count as tuning too). The real traces' selections (other
    Mooncake lines, other WEKA sessions) are disjoint as the protocol states them; the
    repository's samples are copies of parts of ../shared's files, so that is not checked
    here."""
    tuned: dict[str, set[int]] = {}
    for cell in proto["tuning"]:
        if "workload" in cell:
            tuned.setdefault(cell["workload"], set()).update(_seeds(cell))
    report = {derive_seed(0, i) for i in range(REPORT_SEEDS)}
    for cell in proto["heldout"]:
        if "workload" in cell:
            seen = (tuned.get(cell["workload"], set()) | report) & set(_seeds(cell))
            if seen:
                raise ProtocolError(f"{path}: heldout '{cell['name']}': seeds "
                                    f"{sorted(seen)} are tuning seeds")


# -- building a cell's runs ----------------------------------------------------------
def _source(cell: dict) -> Path | None:
    """The cell's trace source, or None when it is under shared: and that is absent."""
    src = cell["source"]
    base, _, rel = src.partition(":")
    if base == "repo":
        return ROOT / rel
    if base == "shared":
        p = SHARED / rel
        return p if p.exists() else None
    raise ProtocolError(f"source: expected 'repo:PATH' or 'shared:PATH', found {src!r}")


def _with_hold(lines: list[dict], note: dict) -> list[dict]:
    """The paper reproduction's hold times (experiment.with_hold), noted as this
    evaluation's."""
    return with_hold(lines, note, key="evaluation")


def weka_sessions(src: Path, sel: dict) -> list[Path]:
    """The selected session files: by size (then name), after skipping the ``skip``
    smallest, leaving out every ``exclude_every``-th file in name order (0: none), the
    first ``count``."""
    files = sorted(src.glob("trace_*.json"))
    every = sel.get("exclude_every", 0)
    excluded = set(files[::every]) if every else set()
    by_size = sorted(files, key=lambda f: (f.stat().st_size, f.name))[sel.get("skip", 0):]
    picked = [f for f in by_size if f not in excluded][:sel["count"]]
    if len(picked) < sel["count"]:
        raise ProtocolError(f"{src}: {len(picked)} sessions selected, {sel['count']} "
                            f"expected")
    return picked


def build_runs(cell: dict, rates: str, tmp: Path) -> list[tuple[str, Path]]:
    """(run label, trace path) of every run of ``cell``, written under ``tmp``."""
    out = []
    if "workload" in cell:
        kind = cell["workload"]
        uses_cost = generators()[kind].uses_cost
        for seed in _seeds(cell):
            params = {**cell.get("params", {}), "seed": seed,
                      **({"rates": rates} if uses_cost else {})}
            path = tmp / f"{kind}-{seed}-{len(out)}.jsonl"
            write_trace(path, generate(kind, params, cost=CostModel() if uses_cost else None))
            out.append((f"seed {seed}", path))
        return out
    src = _source(cell)
    if cell["format"] == "mooncake":
        w = cell["windows"]
        lines = src.read_bytes().splitlines(keepends=True)
        first, n = w["first_line"] - 1, w["requests"]
        for k in range(w["count"]):
            lo, hi = first + k * n, first + (k + 1) * n
            if hi > len(lines):
                raise ProtocolError(f"{src}: window {k} needs lines {lo + 1}-{hi}, the file "
                                    f"has {len(lines)}")
            raw = tmp / f"mooncake-{lo + 1}.raw.jsonl"
            raw.write_bytes(b"".join(lines[lo:hi]))
            imported = import_trace("mooncake", raw, group_by=f"hash-mod:{MOONCAKE_TENANTS}",
                                    contracts_cycle=True)
            path = tmp / f"mooncake-{lo + 1}.jsonl"
            write_trace(path, _with_hold(imported, {"source": cell["source"],
                                                    "lines": [lo + 1, hi]}))
            out.append((f"lines {lo + 1}-{hi}", path))
        return out
    files = weka_sessions(src, cell["sessions"])
    for k in range(cell["bundles"]):
        picked = files[k::cell["bundles"]]
        imported = import_sessions(picked, tmp / f"weka-{len(out)}")
        path = tmp / f"weka-{len(out)}.jsonl"
        write_trace(path, _with_hold(imported, {"source": cell["source"],
                                                "sessions": [f.name for f in picked]}))
        out.append(("sessions " + " ".join(f.stem.split("_")[-1] for f in picked), path))
    return out


# -- one replay ----------------------------------------------------------------------
def replay(loaded, capacity: int, policy: str, params: dict, replicas: int,
           scope: str, path: Path, contracts=None) -> dict:
    """One policy on one loaded trace (read from ``path``): the scope's mean hit
    fraction, whether every hard invariant held on every instance, and how many instances
    saturated. A clairvoyant policy gets each instance's future, as replay gives it."""
    cls = engine_class("sim", "step")
    events, names = loaded.events, CONTRACT_NAMES
    if contracts is not None:       # the file decides every group's contract
        params = contracts_params(params, make_policy(policy).defaults, contracts, policy)
        events, names = list(contracts.relabelled(events)), tuple(contracts.table())
    instances = replicas_of(policy, replicas, "round-robin",
                            lambda: make_policy(policy, params), make_policy(policy, params))
    results, saturated, metrics = [], 0, None
    for rep in instances:
        if rep.policy.needs_future:
            rep.policy.set_future(future_uses(TraceSource(str(path), path), loaded.hashes,
                                              rep.lookahead))
        eng = cls(header=loaded.header, hashes=loaded.hashes, capacity=capacity,
                  policy=rep.policy, contracts=names,
                  done_ids=loaded.summary.done_ids, groups=loaded.summary.groups,
                  cost=CostModel())
        res = eng.run(rep.select(iter(events)))
        results.append(res)
        metrics = run_metrics(res, CostModel())
        meter = SaturationMeter().extend(res.requests)
        saturated += meter.verdict(metrics["totals"]["ttft_p95_ms"])["verdict"] == SATURATED
    merged = merge_results(policy, instances, results)
    if len(results) > 1:                 # one instance: its metrics are the run's
        metrics = run_metrics(merged, CostModel())
    part = metrics["totals"] if scope == "all" else metrics["roles"].get(scope, {})
    ok = merged.aborted is None and all(v.holds for v in merged.invariants.values()
                                        if v.hard)
    return {"hit_fraction": part.get("hit_fraction"), "invariants_hold": ok,
            "saturated_instances": saturated, "requests": part.get("requests", 0),
            "rejected": part.get("rejected", 0)}


def _replay_job(args):
    """Every policy on one run's trace at one capacity: the trace is loaded once. With a
    split (the full trace, where its history ends, the suggest settings), ``path`` is the
    rest and the RULE label runs under contracts suggested from the history."""
    key, path, capacity, policies, replicas, scope, split = args
    loaded = load(Path(path))
    contracts = None
    if split is not None:
        full, t_s, settings = split
        found = suggest(SuggestConfig(trace=full, capacity=capacity, until_s=t_s,
                                      replicas=replicas, **settings))
        contracts = parse_contracts(found.text(Path(full).name), "suggested")
    return key, {label: replay(loaded, capacity, name, params, replicas, scope, Path(path),
                               contracts if label == RULE else None)
                 for label, name, params in policies}


# -- a set ---------------------------------------------------------------------------
def _paired(a: list[float], b: list[float], resamples: int, seed: int) -> dict:
    d = [100 * (x - y) for x, y in zip(a, b)]
    ci = bootstrap_ci(d, resamples, random.Random(seed))
    return {"mean_pp": round(statistics.fmean(d), 4),
            "ci_pp": None if ci is None else [round(ci[0], 4), round(ci[1], 4)],
            "below": sum(x < 0 for x in d), "level": sum(x == 0 for x in d),
            "above": sum(x > 0 for x in d)}


def judge(cell: dict, values: dict[str, list[float]], proto: dict) -> dict:
    """The criterion of the cell's kind, with what was found and what was expected."""
    st = proto["statistics"]
    mean = {p: 100 * statistics.fmean(v) for p, v in values.items()}
    judged = proto["replay"]["policies"] + ([DEFAULTS] if DEFAULTS in values else [])
    paired = {p: _paired(values[RULE], values[p], st["resamples"], st["bootstrap_seed"])
              for p in judged}
    # a reported policy against LRU (policy minus LRU), the way the report reads it
    versus_lru = {p: _paired(values[p], values["lru"], st["resamples"], st["bootstrap_seed"])
                  for p in reported(proto) if p in values}
    if cell["kind"] == "benign":
        c = proto["criteria"]["benign"]
        best = max(mean["lru"], mean["s3fifo"])
        found = mean[RULE] - best
        met = found >= -c["margin_pp"]
        text = (f"rule minus max(LRU, S3-FIFO) {found:+.2f} pp, expected >= "
                f"-{c['margin_pp']} pp")
    else:
        c = proto["criteria"]["attack"]
        ci = paired[c["reference"]]["ci_pp"]
        found = ci[0]
        met = found >= c["min_ci_low_pp"]
        text = (f"rule minus {c['reference']}: interval low {found:+.3f} pp, expected >= "
                f"{c['min_ci_low_pp']} pp")
    return {"means_pct": {p: round(m, 4) for p, m in mean.items()}, "paired": paired,
            "reported_minus_lru": versus_lru,
            "found_pp": round(found, 4), "met": met, "verdict": text}


def run_set(proto: dict, set_name: str, rule_params: dict, workers: int,
            only: list[str] | None, split: dict | None = None) -> dict:
    if split is None:
        policies = [(p, {}) for p in proto["replay"]["policies"] + reported(proto)]
        policies.append((RULE, {**proto["rule"].get("params", {}), **rule_params}))
        rule_policy = proto["rule"]["policy"]
    else:   # the split policy with the built-in table beside it, then with suggested ones
        rule_policy = split["policy"]
        params = {**split.get("params", {}), **rule_params}
        policies = [(p, {}) for p in proto["replay"]["policies"]]
        policies += [(DEFAULTS, params), (RULE, params)]
    cells, skipped, jobs = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for ci, cell in enumerate(proto[set_name]):
            if only and not any(o in cell["name"] for o in only):
                continue
            if "source" in cell and _source(cell) is None:
                skipped.append(f"{cell['name']}: {cell['source']} absent "
                               f"({SHARED} not found)")
                continue
            d = tmp / f"cell-{ci}"
            d.mkdir()
            runs = build_runs(cell, proto["replay"]["rates"], d)
            scope = (proto["criteria"]["attack"]["scope"] if cell["kind"] == "attack"
                     else proto["criteria"]["benign"]["scope"])
            for cap in cell["capacities"]:
                cells.append({"cell": cell, "capacity": cap, "runs": [r for r, _ in runs]})
                named = [(label, rule_policy if label in (RULE, DEFAULTS) else label, params)
                         for label, params in policies]
                for ri, (_, path) in enumerate(runs):
                    cut = None
                    if split is not None:
                        lines = _trace_lines(path)
                        t_s = split_time_s(lines, split["history"])
                        rest = path.with_suffix(".rest.jsonl")
                        if not rest.exists():
                            write_trace(rest, rest_lines(lines, t_s))
                        cut = (str(path), t_s, split.get("suggest", {}))
                        path = rest
                    jobs.append(((len(cells) - 1, ri), str(path), cap, named,
                                 cell.get("replicas", 1), scope, cut))
        done: dict[tuple, dict] = {}
        with ProcessPoolExecutor(max_workers=workers,
                                 mp_context=get_context("spawn")) as pool:
            for n, ((i, ri), rows) in enumerate(pool.map(_replay_job, jobs, chunksize=1), 1):
                for label, row in rows.items():
                    done[(i, ri, label)] = row
                if n % 5 == 0 or n == len(jobs):
                    print(f"[{n}/{len(jobs)}] runs ({len(policies)} policies each)",
                          file=sys.stderr, flush=True)
    out = []
    for i, c in enumerate(cells):
        cell = c["cell"]
        labels = [p for p, _ in policies]
        rows = {p: [done[(i, r, p)] for r in range(len(c["runs"]))] for p in labels}
        try:
            kept, excluded = _measurable(cell, c, rows, labels)
        except Unmeasurable as exc:
            if split is None:       # the whole trace: a protocol error, as registered
                raise ProtocolError(str(exc)) from None
            # the rest of a trace can hold only requests larger than the pool (a WEKA
            # session's late turns): the cell is named, judged for no policy
            skipped.append(f"{exc} (the rest of each trace after the split)")
            continue
        rows = {p: [rows[p][r] for r in kept] for p in labels}
        values = {p: [x["hit_fraction"] for x in rows[p]] for p in labels}
        verdict = judge(cell, values, proto)
        holds = all(x["invariants_hold"] for p in labels for x in rows[p])
        out.append({"name": cell["name"], "kind": cell["kind"], "capacity": c["capacity"],
                    "runs": [c["runs"][r] for r in kept], "excluded": excluded, "values": {p: [round(v, 6) for v in values[p]]
                                                  for p in labels},
                    "invariants_hold": holds,
                    "saturated_instances": {p: sum(x["saturated_instances"] for x in rows[p])
                                            for p in labels},
                    "replicas": cell.get("replicas", 1),
                    **verdict, "met": verdict["met"] and holds})
    return {"set": set_name, "cells": out, "skipped": skipped,
            "reported": reported(proto) if split is None else [],
            "rule": {"policy": rule_policy, "params": policies[-1][1]},
            **({"split": split} if split is not None else {})}


def _measurable(cell: dict, c: dict, rows: dict[str, list[dict]],
                labels: list[str]) -> tuple[list[int], list[str]]:
    """The runs a cell is judged on, and the ones it leaves out, named with why. A run
    whose scope has requests but every one rejected (each prompt needs more blocks than
    the capacity has, so it is rejected under any policy) has no hit fraction: it is left
    out of the cell for every policy alike, never scored 0. A scope with no request at all
    (an attack cell over a trace without a victim) is a protocol error, as is a cell left
    with fewer than 2 runs (no interval)."""
    kept, excluded = [], []
    where = f"cell '{cell['name']}' at {c['capacity']} blocks"
    for r, run in enumerate(c["runs"]):
        got = [rows[p][r] for p in labels]
        if all(x["hit_fraction"] is not None for x in got):
            kept.append(r)
        elif all(x["requests"] > 0 and x["rejected"] == x["requests"] for x in got):
            excluded.append(f"{run}: all {got[0]['requests']} requests rejected under "
                            f"every policy (larger than the pool)")
        else:
            raise ProtocolError(f"{where}: no measured request in its scope in run {run}")
    if len(kept) < 2:
        raise Unmeasurable(f"{where}: {len(kept)} run(s) with measured requests, at least 2 "
                           f"needed; left out: {'; '.join(excluded)}")
    return kept, excluded


# -- output --------------------------------------------------------------------------
def _fmt_ci(p: dict) -> str:
    ci = p["ci_pp"]
    return f"{p['mean_pp']:+.2f} [{ci[0]:+.2f}, {ci[1]:+.2f}]"


def _verdict_lines(res: dict) -> list[str]:
    """How many cells met each criterion, the ones that did not, and the cells skipped."""
    benign = [c for c in res["cells"] if c["kind"] == "benign"]
    attack = [c for c in res["cells"] if c["kind"] == "attack"]
    lines = ["",
             f"Benign criterion: met on {sum(c['met'] for c in benign)} of {len(benign)} "
             f"cells; attack criterion: met on {sum(c['met'] for c in attack)} of "
             f"{len(attack)} cells."]
    lost = [c for c in res["cells"] if not c["met"]]
    if lost:
        lines.append("Cells not met: " + "; ".join(
            f"{c['name']} at {c['capacity']} blocks "
            f"({c['found_pp']:+.{3 if c['kind'] == 'attack' else 2}f} pp)" for c in lost)
            + ".")
    return lines + [f"Skipped: {s}." for s in res["skipped"]]


def render(res: dict, meta: dict) -> str:
    rule = res["rule"]
    params = json.dumps(rule["params"], sort_keys=True) if rule["params"] else "defaults"
    head = "held-out" if res["set"] == "heldout" else "tuning"
    lines = [
        f"## prefixshield-b on the pre-registered {head} set",
        "",
        f"Protocol `examples/paper/protocol.toml` (registered {meta['registered']}, SHA-256 "
        f"`{meta['protocol_sha256'][:16]}`), rule `{rule['policy']}` ({params}), replay "
        f"code digest `{meta['code_digest'][:16]}`; command `{meta['command']}`. "
        + ("Every number in this section is held out: no rule was tuned on these seeds, "
           "windows or sessions. " if res["set"] == "heldout" else
           "These are the tuning set's numbers, not held out. ")
        + "Hit fractions in %, mean over runs; differences paired over runs (rule minus "
          "policy) in pp with 95% percentile-bootstrap intervals. Attack cells: the "
          "victim's hit fraction, met when the interval of rule minus PrefixShield has "
          f"its lower bound >= {meta['attack_low']} pp. Benign cells: all requests' hit "
          f"fraction, met when the rule's mean is within {meta['benign_margin']} pp of the "
          "better of LRU and S3-FIFO.",
        "",
        "| cell | kind | configured blocks | runs | LRU | S3-FIFO | PrefixShield | "
        "prefixshield-b | ps-b minus LRU | ps-b minus S3-FIFO | ps-b minus PrefixShield | "
        "criterion | met |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in res["cells"]:
        m, p = c["means_pct"], c["paired"]
        sat = sum(n for p, n in c["saturated_instances"].items()
                  if p not in res.get("reported", ()))
        note = "" if c["invariants_hold"] else " (an invariant broke)"
        note += f" ({sat} saturated instance replays)" if sat else ""
        lines.append(
            f"| {c['name']} | {c['kind']} | {c['capacity']}"
            + (f" x {c['replicas']} instances" if c["replicas"] > 1 else "")
            + f" | {len(c['runs'])} | {m['lru']:.2f} | {m['s3fifo']:.2f} | "
            f"{m['prefixshield']:.2f} | {m[RULE]:.2f} | {_fmt_ci(p['lru'])} | "
            f"{_fmt_ci(p['s3fifo'])} | {_fmt_ci(p['prefixshield'])} | "
            f"{c['found_pp']:+.{3 if c['kind'] == 'attack' else 2}f}{note} | "
            f"{'yes' if c['met'] else '**no**'} |")
    lines += _verdict_lines(res)
    for c in res["cells"]:
        for x in c.get("excluded", []):
            lines.append(f"Left out of {c['name']} at {c['capacity']} blocks: {x}.")
    return "\n".join(lines + reported_table(res)) + "\n"


def render_split(res: dict, meta: dict) -> str:
    """The time-split rule's section: per cell, the split policy with the built-in table
    and with contracts suggested from each trace's history, against LRU, S3-FIFO and
    PrefixShield, all replayed on the rest of the trace."""
    sp, rule = res["split"], res["rule"]
    params = json.dumps(rule["params"], sort_keys=True) if rule["params"] else "defaults"
    head = "held-out" if res["set"] == "heldout" else "tuning"
    lines = [
        f"## Contracts from data: the time-split rule on the {head} set",
        "",
        f"Protocol `examples/paper/protocol.toml` (SHA-256 `{meta['protocol_sha256'][:16]}`), "
        f"policy `{rule['policy']}` ({params}) with contracts that `psgate contracts "
        f"suggest` sized from the first {sp['history']:g} of each trace's arrival span "
        f"(settings {json.dumps(sp.get('suggest', {}), sort_keys=True)}), replayed with "
        f"every other policy on the rest; replay code digest `{meta['code_digest'][:16]}`; "
        f"command `{meta['command']}`. "
        + ("Held out: no rule was tuned on these seeds, windows or sessions. "
           if res["set"] == "heldout" else "These are the tuning set's numbers. ")
        + "Hit fractions in %, mean over runs, of the requests after the split. Attack "
          "cells: the victim's, met when the interval of suggested minus PrefixShield "
          f"(built-in table) has its lower bound >= {meta['attack_low']} pp. Benign cells: "
          f"all requests', met when the suggested mean is within {meta['benign_margin']} pp "
          "of the better of LRU and S3-FIFO.",
        "",
        f"| cell | kind | configured blocks | runs | LRU | S3-FIFO | PrefixShield | "
        f"{rule['policy']}, built-in table | {rule['policy']}, suggested | suggested minus "
        f"built-in | suggested minus PrefixShield | criterion | met |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in res["cells"]:
        m, p = c["means_pct"], c["paired"]
        note = "" if c["invariants_hold"] else " (an invariant broke)"
        lines.append(
            f"| {c['name']} | {c['kind']} | {c['capacity']}"
            + (f" x {c['replicas']} instances" if c["replicas"] > 1 else "")
            + f" | {len(c['runs'])} | {m['lru']:.2f} | {m['s3fifo']:.2f} | "
            f"{m['prefixshield']:.2f} | {m[DEFAULTS]:.2f} | {m[RULE]:.2f} | "
            f"{_fmt_ci(p[DEFAULTS])} | {_fmt_ci(p['prefixshield'])} | "
            f"{c['found_pp']:+.{3 if c['kind'] == 'attack' else 2}f}{note} | "
            f"{'yes' if c['met'] else '**no**'} |")
    return "\n".join(lines + _verdict_lines(res)) + "\n"


def _clairvoyant(name: str) -> bool:
    return make_policy(name).needs_future


def reported_table(res: dict) -> list[str]:
    """The reported policies beside the judged ones, per cell: each one's mean, the best
    deployable policy (any but a clairvoyant one) and its distance to the clairvoyant
    reference; nothing when the protocol reports none."""
    names = res.get("reported", [])
    if not names or not res["cells"]:
        return []
    rule = res["rule"]["policy"]
    label = {RULE: rule}
    order = [p for p in res["cells"][0]["means_pct"] if p != RULE] + [RULE]
    oracle = [p for p in order if p != RULE and _clairvoyant(p)]
    lines = ["", f"### Every policy on the {'held-out' if res['set'] == 'heldout' else 'tuning'}"
             " set, reported and not judged", "",
             "The same runs replayed under the field's policies (`psgate policies` names "
             "each one's source; their sources' defaults, none tuned on either set). Hit "
             "fractions in %, mean over runs, of the criterion's scope (attack cells: the "
             "victim; benign: all requests). *best* is the highest mean among the "
             "deployable policies" + (f"; *minus {oracle[0]}* is its distance to "
                                      f"{oracle[0]}, the clairvoyant reference heuristic "
                                      "(a point of comparison, not a bound)" if oracle
                                      else "") + ".", "",
             "| cell | configured blocks | " + " | ".join(label.get(p, p) for p in order)
             + " | best | " + (f"best minus {oracle[0]} |" if oracle else ""),
             "|---|---|" + "---|" * (len(order) + 1 + bool(oracle))]
    wins: dict[str, int] = {}
    for c in res["cells"]:
        m = c["means_pct"]
        deployable = [p for p in order if p not in oracle]
        top = max(m[p] for p in deployable)
        best = [label.get(p, p) for p in deployable if m[p] == top]
        for b in best:
            wins[b] = wins.get(b, 0) + 1
        shown = best_names(best, short=True)
        lines.append(f"| {c['name']} | {c['capacity']}"
                     + (f" x {c['replicas']}" if c["replicas"] > 1 else "") + " | "
                     + " | ".join(f"{m[p]:.2f}" for p in order)
                     + f" | {shown} | "
                     + (f"{top - m[oracle[0]]:+.2f} |" if oracle else ""))
    lines += ["", "Best deployable policy (ties counted for each): " + "; ".join(
        f"{p} in {n} of {len(res['cells'])} cells"
        for p, n in sorted(wins.items(), key=lambda kv: (-kv[1], kv[0]))) + "."]
    return lines


def update_report(report: Path, section: str, marks: tuple[str, str] = (BEGIN, END)) -> None:
    """Replace the marked section of ``report`` (append it, marked, when absent)."""
    begin, end = marks
    text = report.read_text() if report.exists() else ""
    block = f"{begin}\n{section}{end}\n"
    if begin in text and end in text:
        a, b = text.index(begin), text.index(end) + len(end)
        text = text[:a] + block.rstrip("\n") + text[b:]
    else:
        text = text.rstrip("\n") + "\n\n" + block
    write_atomic(report, (text if text.endswith("\n") else text + "\n").encode())


def _split_settings(proto: dict, args) -> dict:
    """The protocol's [split], with the tuning set's overrides."""
    if "split" not in proto:
        raise ProtocolError("--split: the protocol has no [split] table")
    split = json.loads(json.dumps(proto["split"]))
    if args.split_policy or args.suggest:
        if args.set_name == "heldout":
            raise ProtocolError("--split-policy, --suggest: the held-out set runs the "
                                "registered split rule only; tune on --set tuning")
        if args.split_policy:
            if args.split_policy not in ("prefixshield", "prefixshield-b"):
                raise ProtocolError(f"--split-policy: expected prefixshield or "
                                    f"prefixshield-b, found {args.split_policy!r}")
            if args.split_policy != split["policy"]:
                split["params"] = {}
            split["policy"] = args.split_policy
        if args.suggest:
            try:
                extra = json.loads(args.suggest)
            except json.JSONDecodeError as exc:
                raise ProtocolError(f"--suggest: not JSON ({exc})") from None
            bad = sorted(set(extra) - set(SUGGEST_KEYS)) if isinstance(extra, dict) else [""]
            if bad:
                raise ProtocolError(f"--suggest: expected an object with keys among "
                                    f"{', '.join(SUGGEST_KEYS)}, found {args.suggest!r}")
            split["suggest"] = {**split.get("suggest", {}), **extra}
    return split


def _rerender(args) -> int:
    try:
        saved = json.loads(args.from_results.read_text())
        res = {k: saved[k] for k in ("set", "cells", "skipped", "rule")}
        if "split" in saved:
            res["split"] = saved["split"]
        res["reported"] = saved.get("reported", [])
        meta = {k: saved[k] for k in ("registered", "protocol_sha256", "code_digest",
                                      "command", "attack_low", "benign_margin")}
    except (OSError, ValueError, KeyError) as exc:
        print(f"evaluate: error: {args.from_results}: not a results.json of evaluate.py "
              f"({exc})", file=sys.stderr)
        return 2
    section = render_split(res, meta) if "split" in res else render(res, meta)
    if args.report:
        update_report(args.report, section,
                      (SPLIT_BEGIN, SPLIT_END) if "split" in res else (BEGIN, END))
    print(section)
    return 0 if all(c["met"] for c in res["cells"]) else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--protocol", type=Path, default=PROTOCOL)
    ap.add_argument("--set", choices=("heldout", "tuning"), default="heldout", dest="set_name")
    ap.add_argument("--rule-params", default=None, metavar="JSON",
                    help="the rule's parameters over the protocol's (tuning set only)")
    ap.add_argument("--only", action="append", default=None, metavar="TEXT",
                    help="only cells whose name contains TEXT (repeatable)")
    ap.add_argument("--split", action="store_true",
                    help="the time-split rule (protocol [split]): contracts suggested from "
                         "each trace's first part, every policy judged on the rest")
    ap.add_argument("--split-policy", default=None, metavar="NAME",
                    help="--split on the tuning set: prefixshield or prefixshield-b instead "
                         "of the protocol's")
    ap.add_argument("--suggest", default=None, metavar="JSON",
                    help="--split on the tuning set: suggest settings over the protocol's")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None,
                    help="where results.json and results.md go (default: a temporary "
                         "directory, printed)")
    ap.add_argument("--report", type=Path, default=None,
                    help="also replace the held-out section of this REPORT.md")
    ap.add_argument("--from-results", type=Path, default=None, metavar="RESULTS_JSON",
                    help="replay nothing: render a results.json of an earlier run (and "
                         "--report) again")
    args = ap.parse_args(argv)
    if args.from_results is not None:
        return _rerender(args)
    try:
        proto = load_protocol(args.protocol)
        rule_params = {}
        if args.rule_params is not None:
            if args.set_name == "heldout":
                raise ProtocolError("--rule-params: the held-out set runs the registered "
                                    "rule only; tune on --set tuning")
            try:
                rule_params = json.loads(args.rule_params)
            except json.JSONDecodeError as exc:
                raise ProtocolError(f"--rule-params: not JSON ({exc})") from None
            if not isinstance(rule_params, dict):
                raise ProtocolError(f"--rule-params: expected a JSON object, found "
                                    f"{args.rule_params!r}")
        split = None
        if args.split:
            split = _split_settings(proto, args)
        elif args.split_policy or args.suggest:
            raise ProtocolError("--split-policy and --suggest go with --split")
        res = run_set(proto, args.set_name, rule_params, args.workers, args.only, split)
    except ProtocolError as exc:
        print(f"evaluate: error: {exc}", file=sys.stderr)
        return 2
    if not res["cells"]:
        print("evaluate: error: no cell ran" + "".join(f"; skipped {s}"
                                                        for s in res["skipped"]),
              file=sys.stderr)
        return 2
    crit = proto["criteria"]
    meta = {"registered": proto["registered"],
            "protocol_sha256": hashlib.sha256(args.protocol.read_bytes()).hexdigest(),
            "code_digest": code_digest(),
            "command": "python examples/paper/evaluate.py"
                       + ("" if args.set_name == "heldout" else " --set tuning")
                       + (" --split" if args.split else "")
                       + (f" --split-policy {args.split_policy}" if args.split_policy else "")
                       + (f" --suggest '{args.suggest}'" if args.suggest else "")
                       + (f" --rule-params '{args.rule_params}'" if args.rule_params else "")
                       + "".join(f" --only '{o}'" for o in args.only or []),
            "attack_low": crit["attack"]["min_ci_low_pp"],
            "benign_margin": crit["benign"]["margin_pp"]}
    out = args.out or Path(tempfile.mkdtemp(prefix="psgate-eval-"))
    out.mkdir(parents=True, exist_ok=True)
    section = render_split(res, meta) if args.split else render(res, meta)
    write_atomic(out / "results.json",
                 (json.dumps({**meta, **res}, indent=1, sort_keys=True) + "\n").encode())
    write_atomic(out / "results.md", section.encode())
    if args.report:
        update_report(args.report, section,
                      (SPLIT_BEGIN, SPLIT_END) if args.split else (BEGIN, END))
    print(section)
    print(f"{out / 'results.json'}", file=sys.stderr)
    return 0 if all(c["met"] for c in res["cells"]) else 1


if __name__ == "__main__":
    sys.exit(main())
