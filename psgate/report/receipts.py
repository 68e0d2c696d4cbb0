"""Loading a receipt directory and rebuilding the replay configuration it records.

A receipt is read back as evidence, possibly from someone else's disk: it is checked
against its schema (with whole numbers held to ``int``, so ``32.0`` or ``"32"`` for a
capacity is refused) before any command looks inside, and ledgers are read through
:func:`text_lines`, so a damaged file is one error naming the file and line, never a
traceback from deep inside a command.
"""

from __future__ import annotations

import dataclasses
import functools
import gzip
import hashlib
import zlib
from pathlib import Path
from typing import Iterator

import orjson

from psgate.api import ReplayConfig, contract_table, load_contracts_file
from psgate.engines.cost import COEFFICIENTS, CostModel
from psgate.engines import engine_class
from psgate.engines.step_cost import SchedulerParams, StepCostModel
from psgate.errors import InputError
from psgate.inputs import open_input, read_input
from psgate.policies import make_policy, resolve
from psgate.receipt.gate import Tolerances
from psgate.resources import BUNDLED_PREFIX, load_schema
from psgate.trace.future import future_uses
from psgate.trace.reader import (HashTable, Limits, TraceReader, TraceSource, duplicate_key,
                                 validate_trace)


@functools.cache
def _validator(name: str):
    """Draft 2020-12 with ``integer`` meaning a JSON integer: the default also accepts
    ``32.0``, which would reach the engine as a float."""
    import jsonschema

    base = jsonschema.Draft202012Validator
    strict = base.TYPE_CHECKER.redefine(
        "integer", lambda _checker, x: isinstance(x, int) and not isinstance(x, bool))
    return jsonschema.validators.extend(base, type_checker=strict)(load_schema(name))


# Keys the schemas require of receipts written now that receipts of the same format
# written by earlier versions lack; every reader takes their absence as the old default,
# so such a receipt still loads (and diffs against a new one).
ADDED_SINCE_FORMAT_1 = frozenset({"config.non_regression"})


def _added_later(e) -> bool:
    if e.validator != "required":
        return False
    where = ".".join(str(x) for x in e.absolute_path)
    missing = [k for k in e.validator_value if k not in e.instance]
    return all(f"{where}.{k}".lstrip(".") in ADDED_SINCE_FORMAT_1 for k in missing)


def receipt_problem(doc, name: str) -> tuple[str, str] | None:
    """The first violation of schema ``name`` by location, as (dotted path, message)."""
    errors = sorted((e for e in _validator(name).iter_errors(doc) if not _added_later(e)),
                    key=lambda e: [(isinstance(x, str), x) for x in e.absolute_path])
    if not errors:
        return None
    e = errors[0]
    loc = "".join(f"[{x}]" if isinstance(x, int) else f".{x}" for x in e.absolute_path)
    message = e.message if len(e.message) <= 160 else e.message[:157] + "..."
    return loc.lstrip(".") or "(top level)", message


def check_receipt(receipt, path: str) -> str:
    """``"receipt"`` or ``"experiment"``: which schema ``receipt`` matches, or InputError
    naming the file, the JSON path and what was expected."""
    if not isinstance(receipt, dict):
        kind = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}
        raise InputError(f"expected a JSON object (a psgate receipt), found "
                         f"{kind.get(type(receipt), 'a number')}", path=path)
    name = "experiment" if "psgate_experiment" in receipt else "receipt"
    if name == "receipt" and "psgate_receipt" not in receipt:
        raise InputError("not a psgate receipt: expected a 'psgate_receipt' or "
                         "'psgate_experiment' key", path=path)
    found = receipt_problem(receipt, name) or _config_problem(receipt["config"])
    if found:
        raise InputError(f"{found[1]} (expected as schemas/{name}.schema.json describes)",
                         path=path, field=None if found[0] == "(top level)" else found[0])
    return name


def _config_problem(cfg: dict) -> tuple[str, str] | None:
    """What the schemas leave open in ``config`` and a replay would trip over."""
    known = {f.name for f in dataclasses.fields(Limits)}
    limits = cfg.get("limits", {})
    if not isinstance(limits, dict):
        return "config.limits", f"expected an object, found {limits!r:.40}"
    for k, v in limits.items():
        if k not in known or isinstance(v, bool) or not isinstance(v, int) or v < 1:
            return (f"config.limits.{k}", f"expected one of {', '.join(sorted(known))} as a "
                    f"whole number >= 1, found {v!r:.40}")
    if not isinstance(cfg.get("cost_model"), dict):
        return "config.cost_model", f"expected an object, found {cfg.get('cost_model')!r:.40}"
    for k in COEFFICIENTS:
        v = cfg["cost_model"].get(k, 0.0)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
            return f"config.cost_model.{k}", f"expected a number >= 0, found {v!r:.40}"
    return None


def read_receipt_file(p: Path) -> dict:
    """One receipt.json, parsed and checked against its schema."""
    try:
        raw = read_input(p, "receipt file")
        receipt = orjson.loads(raw)
    except (FileNotFoundError, NotADirectoryError):
        raise InputError("no receipt.json here (an interrupted or foreign directory?)",
                         path=str(p.parent)) from None
    except IsADirectoryError:
        raise InputError("expected a file, found a directory", path=str(p)) from None
    except orjson.JSONDecodeError as exc:
        raise InputError(f"receipt.json is not valid JSON ({exc})", path=str(p)) from None
    dup = duplicate_key(raw, receipt)     # a parser keeps the last: two receipts in one
    if dup is not None:
        raise InputError("duplicate key in one JSON object", path=str(p), field=dup)
    check_receipt(receipt, str(p))
    return receipt


def load_receipt(directory: str | Path, experiment_ok: bool = False) -> dict:
    """A replay's receipt; an experiment's (matched runs) only where ``experiment_ok``:
    the commands that read one run's ledger are pointed at a run's own directory."""
    d = Path(directory)
    if not d.is_dir():
        raise InputError("not a receipt directory", path=str(d))
    receipt = read_receipt_file(d / "receipt.json")
    if "psgate_experiment" in receipt and not experiment_ok:
        first = receipt["runs"][0]["receipt"]
        raise InputError(f"an experiment receipt (matched runs); name one run's directory, "
                         f"e.g. {d / Path(first).parent}", path=str(d))
    return receipt


def text_lines(path: Path) -> Iterator[str]:
    """The lines of a CSV output (gzip or plain by its name), each decoded on its own so
    that bytes that are not UTF-8, or a gzip stream cut short or corrupt, are reported
    with the line they are on. A missing file raises FileNotFoundError as open does."""
    if path.name.endswith(".compact.csv.gz"):
        from psgate.receipt.compact import compact_lines
        yield from compact_lines(path)
        return
    n = 0
    fh = open_input(path, "output file")
    raw = gzip.open(fh, "rb") if path.name.endswith(".gz") else fh
    with fh, raw:
        try:
            for n, line in enumerate(raw, start=1):
                try:
                    yield line.decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise InputError(f"byte {exc.start + 1} of the line is not UTF-8 "
                                     f"(expected the UTF-8 CSV psgate writes)",
                                     path=str(path), line=n) from None
        except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
            raise InputError(f"not a complete gzip stream ({exc}; expected the gzip psgate "
                             f"writes)", path=str(path), line=n + 1) from None


def resolve_input(given: str, abspath: str | None, override: str | None, what: str,
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
                        gate: str | None = None, contracts: str | None = None) -> ReplayConfig:
    cfg = receipt["config"]
    env = receipt.get("environment", {})
    trace_path = resolve_input(receipt["trace"]["path"], env.get("trace_abspath"), trace,
                               "trace", receipt["trace"].get("sha256") or env.get("trace_sha256"),
                               receipt["trace"]["canonical_sha256"])
    gate_path = None
    if cfg.get("gate_file"):
        gate_path = resolve_input(cfg["gate_file"]["path"], env.get("gate_abspath"), gate,
                                  "gate", cfg["gate_file"]["sha256"])
    for run in ("baseline", "candidate"):      # the code is found here, or said where not
        try:
            resolve(policy_spec(cfg[run]), f"config.{run}.source.spec")
        except InputError as exc:
            raise InputError(f"{exc} (a receipt is re-run with the policy code found here: "
                             f"run from the directory the replay ran in, with the policy's "
                             f"package installed)") from None
    contracts_path = contracts_label = None
    if cfg.get("contracts_file"):
        contracts_label = cfg["contracts_file"]["path"]
        contracts_path = resolve_input(contracts_label, env.get("contracts_abspath"), contracts,
                                       "contracts", cfg["contracts_file"]["sha256"])
    return dataclasses.replace(
        replay_settings(receipt, out), trace=trace_path, gate_file=gate_path,
        trace_label=receipt["trace"]["path"],
        gate_label=cfg["gate_file"]["path"] if cfg.get("gate_file") else None,
        contracts_file=contracts_path, contracts_label=contracts_label)


def replay_settings(receipt: dict, out: Path) -> ReplayConfig:
    """How a (schema-checked) receipt says to replay, short of where its trace and gate
    file are: what the runs of an experiment share."""
    cfg = receipt["config"]
    cost = CostModel.from_json(cfg["cost_model"])
    return ReplayConfig(
        baseline=policy_spec(cfg["baseline"]), candidate=policy_spec(cfg["candidate"]),
        baseline_params=cfg["baseline"]["params"], candidate_params=cfg["candidate"]["params"],
        capacity=cfg["capacity"], engine=cfg["engine"], out=out, force=True,
        allow_unexercised=cfg["allow_unexercised"], paranoid=cfg["paranoid"],
        tolerances=Tolerances.from_json(cfg.get("non_regression")),
        ledger_hits=cfg.get("ledger_hits", False), cost=cost,
        ledger_rows=cfg.get("ledger", {}).get("rows", "all"),
        ledger_compression=cfg.get("ledger", {}).get("compression", "none"),
        ledger_level=cfg.get("ledger", {}).get("level"),
        limits=Limits(**cfg.get("limits", {})), replicas=cfg.get("replicas", 1),
        route=cfg.get("route", "round-robin"), **step_settings(cfg))


def policy_spec(record: dict) -> str:
    """How a receipt's run named its policy: the spec it recorded (a built-in's name,
    ``module:Class``, ``file.py:Class``, an entry point), or the name alone in a receipt
    made before specs were recorded. A file spec is read from where the replay ran."""
    source = record.get("source")
    return source["spec"] if source else record["name"]


def step_settings(cfg: dict) -> dict:
    """The scheduler a receipt's config records. A service-model receipt has no
    ``scheduler`` key, and says so explicitly here: the default replay model is the step
    scheduler, and a receipt must re-run under the model it was made with."""
    if "scheduler" not in cfg:
        return {"scheduler": "service"}
    return {"scheduler": "step", "sched": SchedulerParams(**cfg["scheduler"]),
            "step_cost": StepCostModel.from_json(cfg["step_cost_model"])}


def resimulation_refusal(receipt: dict, what: str) -> str | None:
    """Why ``what`` cannot re-simulate this receipt's runs, or None when it can.

    A ``vllm`` receipt records what the real runtime did (its cached tokens, its clock);
    a sim replay of the same trace would show sim's state under that receipt's name."""
    engine = receipt["config"]["engine"]
    replicas = receipt["config"].get("replicas", 1)
    if replicas > 1:
        return (f"{what} re-simulates one instance, and this receipt's runs were spread over "
                f"{replicas} (--replicas); its ledger names each instance's rows (run "
                f"baseline/r0, ...)")
    if engine != "vllm":
        return None
    return (f"{what} re-simulates the runs, and this receipt's engine '{engine}' recorded "
            f"observed results of the real vLLM runtime, which no simulation reproduces "
            f"(sim and vllm-pool receipts can be re-simulated: sim is what vllm-pool is "
            f"proven equal to by the conformance suite)")


def prepare_replay(receipt: dict, trace: str | None, what: str):
    """The receipt's configuration and its trace validated once: (cfg, header, summary,
    hashes), for any number of ``replay_run`` calls, which run sim."""
    refusal = resimulation_refusal(receipt, what)
    if refusal:
        raise InputError(refusal, field="config.engine")
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
    policy = make_policy(name, params, f"config.{run}.source.spec")
    src = TraceSource.resolve(cfg.trace)
    if policy.needs_future:
        policy.set_future(future_uses(src, hashes))
    step = ({"step_cost": cfg.step_cost, "sched": cfg.sched} if cfg.uses_steps else {})
    file = load_contracts_file(cfg)
    engine = engine_class("sim", "step" if step else "service")(
        header=header, hashes=hashes, capacity=cfg.capacity, policy=policy,
        contracts=contract_table(tuple(file.table()) if file else cfg.contracts, [policy]),
        done_ids=summary.done_ids,
        cost=cfg.cost, recorder=recorder, label=run, trace_path=receipt["trace"]["path"],
        groups=summary.groups, max_in_flight=cfg.limits.max_in_flight, **step)
    recorder.engine = engine
    with TraceReader(src, hashes, cfg.limits, validated=summary) as reader:
        events = reader.events()
        return engine.run(file.relabelled(events) if file else events)
