"""``psgate calibrate --from-receipt``: the step cost model fitted to a real engine's own steps.

A calibration through transformers (``--model-config``) times eager forward passes, which on a
CPU run several times slower than vLLM's own CPU backend: a replay priced that way queues
where the real engine does not. A lockstep replay on the real engine (``psgate replay
--engine vllm --pacing lockstep``) records the wall time of every step the engine took beside
what it scheduled (``runs.<run>.observed.step_wall_ms``: prefill tokens P, the context C
those chunks attend to, decodes D and their context K, psgate/engines/vllm_real.py), so
the step model can be fitted to the engine itself, its kernels and scheduling overhead
included:

    check the receipt as psgate verify does first (its schema, every output's SHA-256)
    refuse anything but --engine vllm --pacing lockstep with step rows
    points = every step of every run (runs by name, steps in the order the engine took them)
    hold out one point in three (the second, fifth, ...), fit step_ms(P, C, D, K) to the rest
    derive the per-request model of the service replay from the step fit (no fit of its own)

A receipt records the SHA-256 of its outputs, not of itself, so the step rows in
receipt.json are held to the receipt schema and to the row checks here, no more. The receipt
is read by the caller (the CLI) through the report package and handed over with its digest
check, so calibration imports nothing above the engines' cost models. Pure and
deterministic: the same receipt gives the same document, byte for byte.
"""

from __future__ import annotations

import hashlib
import math
import statistics
from pathlib import Path

from psgate import __version__
from psgate.engines.cost import COEFFICIENTS, COST_MODEL_FORMAT, COST_MODEL_VERSION
from psgate.engines.cost import validate_cost_model_doc
from psgate.engines.step_cost import STEP_COEFFICIENTS
from psgate.errors import InputError

COLUMNS = ["prefill_tokens", "context_tokens", "decodes", "decode_context_tokens", "wall_ms"]
# At least five kept points for the five coefficients and one held out: 7 steps.
MIN_STEPS = 7
RECEIPT_HOLDOUT = ("one step in three, the second, fifth, ... of the receipt's steps in order "
                   "(runs by name, each run's steps in the order the engine took them); "
                   "never used by the step fit")
REQUEST_HOLDOUT = ("no fit of its own: its errors are the derived prefill model's on the "
                   "steps that hold prefill chunks and no decodes, in each split of the step "
                   "fit")
DERIVED_RULE = ("derived from the step fit, linear: a prefill of u new tokens over c cached "
                "ones is one step of that chunk alone (fixed_ms + per_prefill_token_ms*u + "
                "per_context_token_ms*c); each output token is one decode step alone "
                "(fixed_ms + per_decode_ms + per_decode_context_token_ms*k, k the median "
                "context per decode over the receipt's steps with decodes)")
STEP_WEIGHTING = "relative (rows scaled by 1/wall_ms); coefficients >= 0"


def resolve_receipt_path(path: str | Path) -> tuple[Path, Path]:
    """(the receipt's directory, its receipt.json) for a directory or the file itself."""
    p = Path(path)
    if p.is_dir():
        return p, p / "receipt.json"
    return p.parent, p


def check_lockstep(receipt: dict, where: str) -> dict:
    """The real engine's description, or InputError: only a lockstep run on the real
    engine times steps the way the step model prices them (one step at a time on the
    modeled clock, so each wall time is one step's and nothing else's)."""
    if "psgate_experiment" in receipt:
        raise InputError("expected one replay's receipt, found an experiment receipt "
                         "(matched runs); name one run's directory", path=where)
    cfg = receipt["config"]
    if cfg["engine"] != "vllm":
        raise InputError(f"expected a receipt of --engine vllm --pacing lockstep (the real "
                         f"engine's timed steps), found engine '{cfg['engine']}'",
                         path=where, field="config.engine")
    info = cfg.get("engine_info")
    if not isinstance(info, dict):
        raise InputError("missing (the real engine records it)", path=where,
                         field="config.engine_info")
    if info.get("pacing") != "lockstep":
        raise InputError(f"expected --pacing lockstep (one step at a time, each timed alone), "
                         f"found '{info.get('pacing')}'", path=where,
                         field="config.engine_info.pacing")
    for k in ("vllm", "torch", "device", "model", "model_config_sha256", "scheduler"):
        if k not in info:
            raise InputError("missing (a lockstep receipt records it)", path=where,
                             field=f"config.engine_info.{k}")
    return info


def _is_count(v) -> bool:
    return type(v) is int and v >= 0


def step_rows(receipt: dict, where: str) -> list[tuple[str, int, int, int, int, float]]:
    """Every timed step as (run, P, C, D, K, wall_ms), runs by name, each run's steps in
    the order the engine took them; a malformed row is named by its field."""
    rows = []
    for run in sorted(receipt["runs"]):
        field = f"runs.{run}.observed.step_wall_ms"
        table = (receipt["runs"][run].get("observed") or {}).get("step_wall_ms")
        if not isinstance(table, dict) or not isinstance(table.get("rows"), list):
            raise InputError("missing: no step timings (a lockstep replay on the real engine "
                             "records them)", path=where, field=field)
        if table.get("columns") != COLUMNS:
            raise InputError(f"expected columns {COLUMNS}, found {table.get('columns')!r:.120}",
                             path=where, field=f"{field}.columns")
        for i, r in enumerate(table["rows"]):
            if not (isinstance(r, list) and len(r) == 5 and all(map(_is_count, r[:4]))
                    and type(r[4]) in (int, float) and math.isfinite(r[4]) and r[4] > 0):
                raise InputError(f"expected four token counts >= 0 and a wall time > 0 ms, "
                                 f"found {r!r:.120}", path=where, field=f"{field}.rows.{i}")
            rows.append((run, *r[:4], float(r[4])))
    if len(rows) < MIN_STEPS:
        raise InputError(f"{len(rows)} timed steps in all; the step fit needs at least "
                         f"{MIN_STEPS} (five terms and held-out steps): replay a longer trace",
                         path=where, field="runs.*.observed.step_wall_ms.rows")
    return rows


def _points(rows) -> list[dict]:
    return [{"run": run, "prefill_tokens": p, "context_tokens": c, "decodes": d,
             "decode_context_tokens": k, "split": "holdout" if i % 3 == 1 else "fit",
             "median_ms": ms, "times_ms": [ms]}
            for i, (run, p, c, d, k, ms) in enumerate(rows)]


def derived_request_fit(points: list[dict], fit: dict, where: str) -> dict:
    """The service replay's per-request model derived from the step fit (DERIVED_RULE),
    with the prefill part's errors on the prefill-only steps of each split."""
    from psgate.calibrate.fit import Fit, relative_errors
    from psgate.calibrate.grid import FORMS

    contexts = [p["decode_context_tokens"] / p["decodes"] for p in points if p["decodes"]]
    k = statistics.median(contexts) if contexts else 0.0
    coefficients = {"fixed_ms": fit["fixed_ms"],
                    "per_uncached_token_ms": fit["per_prefill_token_ms"],
                    "per_cached_token_ms": fit["per_context_token_ms"],
                    "per_uncached_token_sq_ms": 0.0, "per_uncached_cached_token_ms": 0.0}
    prefill = Fit("linear", coefficients)
    errors = {}
    for split in ("fit", "holdout"):
        ps = [p for p in points if p["split"] == split and p["decodes"] == 0]
        if not ps:
            raise InputError(f"no step of prefill chunks alone among the {split} steps, so "
                             f"the per-request model cannot be checked: replay a trace whose "
                             f"requests do not always arrive while others decode", path=where,
                             field="runs.*.observed.step_wall_ms.rows")
        errors[split] = (len(ps), relative_errors(
            prefill, [p["prefill_tokens"] for p in ps], [p["context_tokens"] for p in ps],
            [p["median_ms"] for p in ps]))
    coefficients["per_output_token_ms"] = (fit["fixed_ms"] + fit["per_decode_ms"]
                                           + fit["per_decode_context_token_ms"] * k)
    (n_fit, kept), (n_held, held) = errors["fit"], errors["holdout"]
    return {"form": "linear", "terms": list(FORMS["linear"]), "weighting": "none (derived)",
            "derived": DERIVED_RULE,
            **{c: float(coefficients[c]) for c in COEFFICIENTS},
            "num_fit_points": n_fit, "num_holdout_points": n_held,
            "fit_median_rel_error": float(statistics.median(kept)),
            "holdout_median_rel_error": float(statistics.median(held)),
            "holdout_max_rel_error": float(max(held))}


def receipt_document(path: str | Path, *, read_receipt, outputs_difference,
                     notes: str | None = None) -> dict:
    """The version-2 cost-model document fitted to the steps of the lockstep receipt at
    ``path`` (a receipt directory or its receipt.json).

    ``read_receipt(receipt_json_path)`` parses it and checks it against the receipt schema;
    ``outputs_difference(directory, receipt)`` names the first output whose bytes are not
    those the receipt records (psgate verify's first check), or returns None. Both raise
    InputError on input that cannot be read. An altered output is refused here, exit 2."""
    from psgate.calibrate.run import step_fit_section

    directory, receipt_json = resolve_receipt_path(path)
    where = str(receipt_json)
    try:
        raw = receipt_json.read_bytes()
    except FileNotFoundError:
        raise InputError("no receipt.json here (give a receipt directory or its receipt.json)",
                         path=str(path)) from None
    except OSError as exc:
        raise InputError(f"cannot read the receipt ({exc.strerror})", path=where) from None
    receipt = read_receipt(receipt_json)
    if "psgate_experiment" not in receipt:
        diff = outputs_difference(directory, receipt)
        if diff:
            raise InputError(f"the receipt does not match its outputs: {diff}",
                             path=str(directory))
    info = check_lockstep(receipt, where)
    if info["device"] not in ("cpu", "cuda"):
        raise InputError(f"expected a cpu or cuda device, found '{info['device']}'",
                         path=where, field="config.engine_info.device")
    rows = step_rows(receipt, where)
    points = _points(rows)
    fit = step_fit_section(points)
    fit["weighting"] = STEP_WEIGHTING
    env = receipt.get("environment") or {}
    trace = receipt["trace"]
    clock = info.get("step_cost_model") or {}
    method = {
        "source": "receipt", "engine": receipt["config"]["engine"], "pacing": info["pacing"],
        "vllm": info["vllm"], "torch": info["torch"], "device": info["device"],
        "receipt": {"name": receipt_json.name, "sha256": hashlib.sha256(raw).hexdigest(),
                    "psgate": receipt["tool"]["version"]},
        "trace": {"path": trace["path"], "sha256": env.get("trace_sha256"),
                  "canonical_sha256": trace["canonical_sha256"]},
        "runs": sorted(receipt["runs"]), "num_steps": len(points),
        "scheduler": info["scheduler"],
        "clock_step_cost_model": {k: clock[k] for k in STEP_COEFFICIENTS if k in clock},
        "statistic": "single",
        "steps": "every step the real engine scheduled work in, as it ran them: the prefill "
                 "tokens P it computed, the context C those chunks attend to, the decodes D "
                 "and their context K (psgate/engines/vllm_real.py); arrivals on the modeled "
                 "step clock of clock_step_cost_model",
        "timer": "wall clock (perf_counter) around one LLMEngine.step() (schedule, "
                 "forward pass, output processing), recorded by the replay in "
                 "runs.<run>.observed.step_wall_ms; each step timed once, so a loaded "
                 "machine shows in the errors",
        "holdout": RECEIPT_HOLDOUT,
        "request_holdout": REQUEST_HOLDOUT,
    }
    model = {"name": info["model"], "config_sha256": info["model_config_sha256"],
             "architecture": (info.get("architectures") or ["?"])[0],
             "weights": str(info.get("weights", "not recorded")),
             "source": "the receipt's config.engine_info (the config file is not read)"}
    doc = {
        "format": COST_MODEL_FORMAT, "version": COST_MODEL_VERSION, "model": model,
        "dtype": "auto",
        "device": {"kind": info["device"],
                   "name": f"{info['device']} ({env.get('platform', 'platform not recorded')})",
                   "threads": None},
        "software": {"python": env.get("python"), "torch": info["torch"],
                     "vllm": info["vllm"], "transformers": None, "attn_implementation": None,
                     "psgate": __version__},
        "method": method, "points": points, "fit": fit,
        "request_fit": derived_request_fit(points, fit, where),
    }
    if notes:
        doc["notes"] = notes
    validate_cost_model_doc(doc, where)
    return doc
