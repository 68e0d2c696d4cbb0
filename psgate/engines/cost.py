"""The prefill cost model behind every modeled millisecond.

    prefill_ms = fixed_ms
               + per_uncached_token_ms * u + per_cached_token_ms * c
               + per_uncached_token_sq_ms * u^2 + per_uncached_cached_token_ms * u * c
    completion = first token + out * per_output_token_ms

with u the prompt tokens computed (not served from the prefix cache) and c the
tokens served from it. The two attention terms are zero in the defaults and in
docs/design.md section 3's linear form; a calibrated file (``psgate calibrate``) may set
them, since a new token attends to every earlier one.

Defaults are rough figures for Qwen2.5-1.5B on an NVIDIA L4 (the PrefixShield
paper's platform): a 1,536-token miss costs about 97 ms, so C_prefill is about
10.3 requests/s. Every time derived from a cost model is labelled *modeled* in
receipts; tokens avoided are the stable evidence, milliseconds are only as good as
the model, and a receipt made with a calibrated file records that file's SHA-256.
The same files carry the step replay's model (psgate/engines/step_cost.py), which
``load_step_cost_model`` reads.
"""

from __future__ import annotations

import hashlib
import math
import sys
from dataclasses import dataclass, field, fields
from pathlib import Path

import orjson

from psgate.engines.step_cost import STEP_COEFFICIENTS, StepCostModel
from psgate.errors import InputError
from psgate.inputs import read_capped

COST_MODEL_FORMAT = "psgate-cost-model"
COST_MODEL_VERSION = 2              # what psgate calibrate writes
READABLE_VERSIONS = (1, 2)
COEFFICIENTS = ("fixed_ms", "per_uncached_token_ms", "per_cached_token_ms",
                "per_uncached_token_sq_ms", "per_uncached_cached_token_ms",
                "per_output_token_ms")
DEFAULT_SOURCE = "psgate defaults (Qwen2.5-1.5B on NVIDIA L4, rough)"
# No coefficient reaches 1,000 s: beyond that it is no hardware's time, and near the float
# range (1e308) a modeled duration becomes infinite and has no nanosecond value at all.
MAX_COEFFICIENT_MS = 1e6
# The largest calibrated file shipped is about 230 KB; a file past this is a wrong path,
# refused before it is read into memory.
MAX_COST_MODEL_BYTES = 16 << 20


@dataclass(frozen=True, slots=True)
class CostModel:
    fixed_ms: float = 5.0
    per_uncached_token_ms: float = 0.06
    per_cached_token_ms: float = 0.002
    per_output_token_ms: float = 10.0
    per_uncached_token_sq_ms: float = 0.0
    per_uncached_cached_token_ms: float = 0.0
    # Where the coefficients came from: None for the defaults or --cost-param, else the
    # calibrated file's name, SHA-256, model, dtype and device (recorded in receipts).
    origin: dict | None = field(default=None, compare=False)

    def prefill_ms(self, uncached_tokens: int, cached_tokens: int) -> float:
        u, c = uncached_tokens, cached_tokens
        ms = (self.fixed_ms + self.per_uncached_token_ms * u + self.per_cached_token_ms * c)
        if self.per_uncached_token_sq_ms or self.per_uncached_cached_token_ms:
            ms += self.per_uncached_token_sq_ms * u * u + self.per_uncached_cached_token_ms * u * c
        return ms

    def coefficients(self) -> dict:
        return {k: getattr(self, k) for k in COEFFICIENTS}

    def to_json(self) -> dict:
        if self.origin is None:
            return {"label": "modeled", "source": DEFAULT_SOURCE, **self.coefficients()}
        return {"label": "modeled", "source": "cost-model file", "file": dict(self.origin),
                **self.coefficients()}

    @classmethod
    def from_json(cls, doc: dict) -> "CostModel":
        """The cost model a receipt's ``config.cost_model`` records (older receipts lack
        the attention terms: they were zero)."""
        known = {f.name for f in fields(cls)} - {"origin"}
        return cls(**{k: v for k, v in doc.items() if k in known}, origin=doc.get("file"))


def _one_line_schema_error(doc: dict, path: str) -> None:
    from psgate.resources import first_schema_error

    found = first_schema_error(doc, "cost-model")
    if found:
        loc, message = found
        raise InputError(message, path=path, field=loc)


def validate_cost_model_doc(doc: dict, path: str) -> None:
    """Schema check, then what a schema cannot say: finite numbers and a monotone fit."""
    if not isinstance(doc, dict):
        raise InputError(f"expected a JSON object, found {type(doc).__name__}", path=path)
    if doc.get("format") != COST_MODEL_FORMAT:
        raise InputError(f"expected '{COST_MODEL_FORMAT}', found {doc.get('format')!r}",
                         path=path, field="format")
    if doc.get("version") not in READABLE_VERSIONS:
        raise InputError(f"this psgate reads versions 1 and 2, found "
                         f"{doc.get('version')!r}", path=path, field="version")
    _one_line_schema_error(doc, path)


def read_cost_model_doc(path: str | Path) -> tuple[dict, bytes]:
    """A cost-model file's validated document and its bytes."""
    from psgate.trace.reader import require_utf8_name

    require_utf8_name(str(path))
    p = Path(path)
    try:
        raw = read_capped(p, "cost-model file", MAX_COST_MODEL_BYTES)
    except FileNotFoundError:
        raise InputError("no such cost-model file", path=str(p)) from None
    except IsADirectoryError:
        raise InputError("expected a cost-model file, found a directory", path=str(p)) from None
    except OSError as exc:
        raise InputError(f"cannot read the cost-model file ({exc.strerror})",
                         path=str(p)) from None
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InputError(f"not valid JSON ({exc})", path=str(p)) from None
    validate_cost_model_doc(doc, str(p))
    return doc, raw


def _coefficients(doc: dict, section: str, names, path: Path) -> dict:
    fit = doc[section]
    for k in names:
        if not (math.isfinite(fit[k]) and fit[k] <= MAX_COEFFICIENT_MS):
            raise InputError(f"expected a finite number >= 0 and <= {MAX_COEFFICIENT_MS:g}, "
                             f"found {fit[k]!r}", path=str(path), field=f"{section}.{k}")
    return {k: float(fit[k]) for k in names}


def _origin(doc: dict, raw: bytes, path: Path) -> dict:
    return {"name": path.name, "sha256": hashlib.sha256(raw).hexdigest(),
            "model": doc["model"]["name"], "dtype": doc["dtype"],
            "device": doc["device"]["name"]}


def load_cost_model(path: str | Path) -> CostModel:
    """A calibrated cost-model file (schemas/cost-model.schema.json) as the per-request
    CostModel of the service replay, whose origin names the file by basename and SHA-256:
    a version-1 file's ``fit``, a version-2 file's ``request_fit`` (the same model, fitted
    to the steps that hold one prefill chunk alone). The step replay reads a file with
    ``load_step_cost_model`` instead."""
    p = Path(path)
    doc, raw = read_cost_model_doc(p)
    section = "fit" if doc["version"] == 1 else "request_fit"
    return CostModel(**_coefficients(doc, section, COEFFICIENTS, p), origin=_origin(doc, raw, p))


# A version-1 file describes steps of one request only. Read as a step model it is converted
# by the rule below, exact on every step it describes: a step of one prefill chunk of u new
# tokens over c cached ones costs prefill_ms(u, c) = fixed + a*u + b*c in both models, and a
# step of one decode costs per_output_token_ms in both (fixed_ms + per_decode_ms; when a file's
# per_output_token_ms is below its fixed_ms, per_decode_ms is 0 and that step costs fixed_ms).
# Batches of several requests are the step model's additivity, never measured in version 1.
# Its attention terms (u^2, u*c) have no step-model counterpart: a file that sets them is
# refused; ``psgate calibrate --convert FILE`` refits the step model to the timings it keeps.
V1_STEP_RULE = ("fixed_ms <- fixed_ms, per_prefill_token_ms <- per_uncached_token_ms, "
                "per_context_token_ms <- per_cached_token_ms, per_decode_ms <- "
                "max(0, per_output_token_ms - fixed_ms), per_decode_context_token_ms <- 0")


def step_cost_from_v1(coefficients: dict) -> dict:
    """The step coefficients of a version-1 fit without attention terms (V1_STEP_RULE)."""
    return {"fixed_ms": coefficients["fixed_ms"],
            "per_prefill_token_ms": coefficients["per_uncached_token_ms"],
            "per_context_token_ms": coefficients["per_cached_token_ms"],
            "per_decode_ms": max(0.0, coefficients["per_output_token_ms"]
                                 - coefficients["fixed_ms"]),
            "per_decode_context_token_ms": 0.0}


def load_step_cost_model(path: str | Path, notice=None) -> StepCostModel:
    """A cost-model file as the step replay's StepCostModel (origin as load_cost_model's).

    Version 2: its ``fit``. Version 1: converted by V1_STEP_RULE, with one notice line on
    stderr (or to ``notice``) saying so; refused, naming the file and the field, when its
    attention terms are not zero."""
    p = Path(path)
    doc, raw = read_cost_model_doc(p)
    origin = _origin(doc, raw, p)
    if doc["version"] != 1:
        return StepCostModel(**_coefficients(doc, "fit", STEP_COEFFICIENTS, p), origin=origin)
    v1 = _coefficients(doc, "fit", COEFFICIENTS, p)
    for k in ("per_uncached_token_sq_ms", "per_uncached_cached_token_ms"):
        if v1[k]:
            raise InputError(f"a version-1 attention-form fit ({k} = {v1[k]:g}) has no "
                             f"step-model equivalent; refit its timings as version 2 with: "
                             f"psgate calibrate --convert {p} -o NEW.json",
                             path=str(p), field=f"fit.{k}")
    line = (f"{p}: version-1 cost model read as a step model by the one-request rule "
            f"({V1_STEP_RULE})")
    if notice is None:
        sys.stderr.write(f"psgate: {line}\n")
    else:
        notice(line)
    return StepCostModel(**step_cost_from_v1(v1), origin=origin)


def checked_coefficients(params: dict, known: tuple[str, ...], option: str) -> dict:
    """KEY=VALUE milliseconds overriding a cost model's defaults, each known and in range."""
    for k, v in params.items():
        if k not in known:
            raise InputError(f"unknown cost-model parameter '{k}'; known: "
                             f"{', '.join(known)}", path=option)
        if type(v) not in (int, float) or not 0 <= v <= MAX_COEFFICIENT_MS:
            raise InputError(f"'{k}' must be a number >= 0 and <= {MAX_COEFFICIENT_MS:g}, "
                             f"found {v!r}", path=option)
    return {k: float(v) for k, v in params.items()}


def step_cost_from_params(params: dict, option: str = "--cost-param") -> StepCostModel:
    """A StepCostModel from KEY=VALUE overrides of the defaults (STEP_COEFFICIENTS only)."""
    return StepCostModel(**checked_coefficients(params, STEP_COEFFICIENTS, option))
