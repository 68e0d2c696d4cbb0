"""A replay's receipt, assembled from what its runs produced.

The receipt's key order is part of its bytes (golden receipts compare them), so every
section is built here, in one place, in the order a reviewer reads it: what was
replayed, how, what each run did, the comparison, the verdict, the outputs' digests and,
last, the environment (the only part that differs between two identical replays).
"""

from __future__ import annotations

import os
import platform
import sys
import time
from pathlib import Path

from psgate import __version__, core
from psgate.engines import engine_info
from psgate.receipt.ledger import file_sha256, ledger_name
from psgate.receipt.receipt import RECEIPT_FORMAT
from psgate.stats.metrics import paired_difference
from psgate.trace.reader import TraceSource

REPLAY_MODEL = ("psgate replay model v1: blocks held from admission, "
                "ceil((prompt+out)/block_size) per request, prompt blocks cached")
STEP_REPLAY_MODEL = ("psgate replay model v2: vLLM 0.32's scheduler step by step on a modeled "
                     "clock (lookup at scheduling, token budget, chunked prefill, decode "
                     "blocks, preemption, output blocks cached)")



def ledger_config(cfg) -> dict:
    """config.ledger: what the ledger holds, its file, and for a compressed one the zlib
    level its bytes (and so its digest) were written at (absent where the receipt being
    re-run had none: those were written at LEGACY_GZIP_LEVEL)."""
    out = {"rows": cfg.ledger_rows, "compression": cfg.ledger_compression,
           "file": ledger_name(cfg.ledger_compression)}
    if cfg.ledger_compression != "none" and cfg.ledger_level is not None:
        out["level"] = cfg.ledger_level
    return out

def run_record(result, metrics: dict, saturation: dict | None = None,
               replicas: list[dict] | None = None) -> dict:
    """One run's entry in ``runs``: its engine result with the metrics computed from it,
    whether its modeled instance saturated (psgate.stats.saturation) and, for a run spread
    over several instances (``--replicas``), each instance's own numbers."""
    record = {
        "policy": result.policy,
        "aborted": result.aborted,
        "metrics": metrics,
        "counts": result.counts,
        "invariants": {n: v.to_json() for n, v in sorted(result.invariants.items())},
        "orphans": result.orphans,
        "rejected_ids": result.rejected_ids,
        "span_s": round((result.end_ns - result.start_ns) / 1e9, 9),
    }
    if result.observed is not None:
        record["observed"] = result.observed
    if saturation is not None:
        record["saturation"] = saturation
    if replicas is not None:
        record["replicas"] = replicas
    return record


def policy_record(policy, source) -> dict:
    """config.baseline / config.candidate: the policy's name and parameters as it
    describes itself, and its code (psgate.policies.PolicySource)."""
    return {**policy.describe(), "source": source.to_json()}


def assemble_receipt(cfg, *, src: TraceSource, header, summary, policies: dict, sources: dict,
                     contracts: list[str], gate_name: str | None, gate_sha: str | None,
                     tolerances, runs: dict, gate: dict, outputs: dict[str, Path],
                     started: float, contracts_file=None) -> dict:
    """The receipt of a replay configured by ``cfg`` (a ReplayConfig): ``runs`` as
    :func:`run_record` made them, ``gate`` the evaluated verdict, ``outputs`` the files
    written beside the receipt (name -> path, hashed here)."""
    receipt = {
        "psgate_receipt": RECEIPT_FORMAT,
        "tool": {"name": "psgate", "version": __version__},
        "trace": {
            "path": src.display, "canonical_sha256": summary.canonical_sha256,
            "block_size": header.block_size, "hashing": header.hashing,
            "source": header.source, "partial": header.partial,
            "num_lines": summary.num_lines, "num_requests": summary.num_requests,
            "num_cancels": summary.num_cancels, "num_dones": summary.num_dones,
            "num_distinct_blocks": summary.num_distinct_blocks,
            "num_skipped_unknown": summary.num_skipped_unknown,
        },
        "config": {
            "engine": cfg.engine, "capacity": cfg.capacity, "usable_blocks": cfg.capacity - 1,
            "block_size": header.block_size, "contracts": contracts,
            "cost_model": cfg.cost.to_json(),
            "baseline": policy_record(policies["baseline"], sources["baseline"]),
            "candidate": policy_record(policies["candidate"], sources["candidate"]),
            "seeds": {}, "allow_unexercised": cfg.allow_unexercised,
            "paranoid": cfg.paranoid, "ledger_hits": cfg.ledger_hits,
            "ledger": ledger_config(cfg),
            "limits": cfg.limits.to_json(),
            "gate_file": {"path": gate_name, "sha256": gate_sha} if cfg.gate_file else None,
            "non_regression": tolerances.to_json(),
            "replay_model": REPLAY_MODEL,
        },
        "runs": runs,
        "comparison": paired_difference(runs["baseline"]["metrics"],
                                        runs["candidate"]["metrics"]),
        "gate": gate,
        "outputs": {name: {"sha256": file_sha256(path)} for name, path in outputs.items()},
    }
    if cfg.uses_steps:
        receipt["config"]["replay_model"] = STEP_REPLAY_MODEL
        receipt["config"]["scheduler"] = cfg.sched.to_json()
        receipt["config"]["step_cost_model"] = cfg.step_cost.to_json()
    info = engine_info(cfg.engine, cfg.model_config, cfg.time_compression,
                       cfg.pacing, cfg.sched, cfg.step_cost)
    if info is not None:     # sim receipts stay as they were: no key at all
        receipt["config"]["engine_info"] = info
    if contracts_file is not None:     # none: the trace's labels, and no key at all
        receipt["config"]["contracts_file"] = contracts_file.to_json()
    if getattr(cfg, "replicas", 1) > 1:     # one instance: the receipt as it always was
        receipt["config"]["replicas"] = cfg.replicas
        receipt["config"]["route"] = cfg.route
    receipt["environment"] = environment(src, cfg.out, started, cfg.gate_file,
                                         summary.sha256)
    if contracts_file is not None:
        receipt["environment"]["contracts_abspath"] = str(Path(cfg.contracts_file).resolve())
    receipt["environment"]["policy_files"] = {label: list(s.paths)
                                              for label, s in sources.items()}
    return receipt


def environment(src: TraceSource, out: Path, started: float, gate: str | None,
                trace_sha256: str) -> dict:
    """Where and how this replay ran, including the trace file's own SHA-256: a trace
    re-serialized with another key order or spacing is the same evidence (same canonical
    digest), so the file's bytes belong here, not in the deterministic part."""
    pkgs = {}
    for name in ("typer", "rich", "orjson", "jsonschema", "rfc8785"):
        try:
            from importlib.metadata import version
            pkgs[name] = version(name)
        except Exception:  # noqa: BLE001 - a missing version is not an error here
            pkgs[name] = None
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "machine": platform.machine(),
        "packages": pkgs,
        "replay_code": core.describe(),      # compiled core or the Python engine
        "trace_abspath": str(src.path.resolve()),
        "trace_sha256": trace_sha256,
        "gate_abspath": str(Path(gate).resolve()) if gate else None,
        "out_dir": str(out.resolve()),
        "cwd": os.getcwd(),
        "started_unix": round(started, 3),
        "wall_s": round(time.time() - started, 3),
    }
