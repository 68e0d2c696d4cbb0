"""Loading a receipt directory and rebuilding the replay configuration it records."""

from __future__ import annotations

import hashlib
from pathlib import Path

import orjson

from psgate.api import ReplayConfig, contract_table
from psgate.engines.cost import CostModel
from psgate.engines.sim import SimEngine
from psgate.errors import InputError
from psgate.policies import make_policy
from psgate.resources import BUNDLED_PREFIX
from psgate.trace.future import future_uses
from psgate.trace.reader import HashTable, Limits, TraceReader, TraceSource, validate_trace


def load_receipt(directory: str | Path, experiment_ok: bool = False) -> dict:
    """A replay's receipt; an experiment's (matched runs) only where ``experiment_ok``:
    the commands that read one run's ledger are pointed at a run's own directory."""
    d = Path(directory)
    p = d / "receipt.json"
    if not d.is_dir():
        raise InputError("not a receipt directory", path=str(d))
    try:
        receipt = orjson.loads(p.read_bytes())
    except FileNotFoundError:
        raise InputError("no receipt.json here (an interrupted or foreign directory?)",
                         path=str(d)) from None
    except orjson.JSONDecodeError as exc:
        raise InputError(f"receipt.json is not valid JSON ({exc})", path=str(p)) from None
    if isinstance(receipt, dict) and "psgate_experiment" in receipt and not experiment_ok:
        first = (receipt.get("runs") or [{}])[0].get("receipt", "runs/<id>/receipt.json")
        raise InputError(f"an experiment receipt (matched runs); name one run's directory, "
                         f"e.g. {d / Path(first).parent}", path=str(d))
    return receipt


def _resolve(given: str, abspath: str | None, override: str | None, what: str,
             sha256: str | None, canonical_sha256: str | None = None) -> str:
    """The file a receipt names: the override, else the path as recorded (relative to
    here), else the absolute path recorded in the environment; its bytes must match, or,
    for a trace, its canonical digest (the same content re-serialized is the same trace)."""
    if override:
        candidates = [override]
    elif given.startswith(BUNDLED_PREFIX):
        return given
    else:
        candidates = [given] + ([abspath] if abspath else [])
    for c in candidates:
        p = Path(c)
        if p.is_file():
            if sha256 is not None:
                digest = hashlib.sha256(p.read_bytes()).hexdigest()
                if digest != sha256 and canonical_sha256 is not None:
                    canonical = validate_trace(c)[1].canonical_sha256
                    if canonical == canonical_sha256:
                        return c
                    raise InputError(f"{what} has canonical digest {canonical[:16]}..., the "
                                     f"receipt was made from {canonical_sha256[:16]}...; pass "
                                     f"the original with --{what}", path=c)
                if digest != sha256:
                    raise InputError(f"{what} has SHA-256 {digest[:16]}..., the receipt was made "
                                     f"from {sha256[:16]}...; pass the original with --{what}",
                                     path=c)
            return c
    raise InputError(f"the receipt's {what} is not here (tried {', '.join(candidates)}); "
                     f"pass it with --{what}", path=given)


def config_from_receipt(receipt: dict, out: Path, trace: str | None = None,
                        gate: str | None = None) -> ReplayConfig:
    cfg = receipt["config"]
    env = receipt.get("environment", {})
    trace_path = _resolve(receipt["trace"]["path"], env.get("trace_abspath"), trace, "trace",
                          receipt["trace"].get("sha256") or env.get("trace_sha256"),
                          receipt["trace"]["canonical_sha256"])
    gate_path = None
    if cfg.get("gate_file"):
        gate_path = _resolve(cfg["gate_file"]["path"], env.get("gate_abspath"), gate, "gate",
                             cfg["gate_file"]["sha256"])
    cost = CostModel.from_json(cfg["cost_model"])
    return ReplayConfig(
        trace=trace_path, baseline=cfg["baseline"]["name"], candidate=cfg["candidate"]["name"],
        baseline_params=cfg["baseline"]["params"], candidate_params=cfg["candidate"]["params"],
        capacity=cfg["capacity"], engine=cfg["engine"], out=out, force=True, gate_file=gate_path,
        allow_unexercised=cfg["allow_unexercised"], paranoid=cfg["paranoid"],
        ledger_hits=cfg.get("ledger_hits", False), cost=cost,
        ledger_rows=cfg.get("ledger", {}).get("rows", "all"),
        ledger_compression=cfg.get("ledger", {}).get("compression", "none"),
        trace_label=receipt["trace"]["path"], limits=Limits(**cfg.get("limits", {})),
        gate_label=cfg["gate_file"]["path"] if cfg.get("gate_file") else None)


def prepare_replay(receipt: dict, trace: str | None = None):
    """The receipt's configuration and its trace validated once: (cfg, header, summary,
    hashes), for any number of ``replay_run`` calls."""
    cfg = config_from_receipt(receipt, Path("."), trace=trace)
    hashes = HashTable()
    header, summary = validate_trace(cfg.trace, hashes, cfg.limits)
    return cfg, header, summary, hashes


def replay_run(receipt: dict, prepared, run: str, recorder):
    """Replay one run of a receipt with ``recorder``; it gets ``recorder.engine`` before
    the first event, so it can look at the pool while the replay goes on."""
    cfg, header, summary, hashes = prepared
    name = cfg.baseline if run == "baseline" else cfg.candidate
    params = cfg.baseline_params if run == "baseline" else cfg.candidate_params
    policy = make_policy(name, params)
    src = TraceSource.resolve(cfg.trace)
    if policy.needs_future:
        policy.set_future(future_uses(src, hashes))
    engine = SimEngine(header=header, hashes=hashes, capacity=cfg.capacity, policy=policy,
                       contracts=contract_table(cfg.contracts, [policy]),
                       done_ids=summary.done_ids, cost=cfg.cost, recorder=recorder, label=run,
                       trace_path=receipt["trace"]["path"], groups=summary.groups,
                       max_in_flight=cfg.limits.max_in_flight)
    recorder.engine = engine
    with TraceReader(src, hashes, cfg.limits) as reader:
        return engine.run(reader.events())
