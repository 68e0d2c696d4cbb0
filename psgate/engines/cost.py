"""The prefill cost model behind every modeled millisecond.

    prefill_ms = fixed_ms
               + per_uncached_token_ms * u + per_cached_token_ms * c
               + per_uncached_token_sq_ms * u^2 + per_uncached_cached_token_ms * u * c
    completion = first token + out * per_output_token_ms

with u the prompt tokens computed (not served from the prefix cache) and c the
tokens served from it. The two attention terms are zero in the defaults and in
DESIGN section 3's linear form; a calibrated file (``psgate calibrate``) may set
them, since a new token attends to every earlier one.

Defaults are rough figures for Qwen2.5-1.5B on an NVIDIA L4 (the PrefixShield
paper's platform): a 1,536-token miss costs about 97 ms, so C_prefill is about
10.3 requests/s. Every time derived from a cost model is labelled *modeled* in
receipts; tokens avoided are the stable evidence, milliseconds are only as good as
the model, and a receipt made with a calibrated file records that file's SHA-256.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field, fields
from pathlib import Path

import orjson

from psgate.errors import InputError

COST_MODEL_FORMAT = "psgate-cost-model"
COST_MODEL_VERSION = 1
COEFFICIENTS = ("fixed_ms", "per_uncached_token_ms", "per_cached_token_ms",
                "per_uncached_token_sq_ms", "per_uncached_cached_token_ms",
                "per_output_token_ms")
DEFAULT_SOURCE = "psgate defaults (Qwen2.5-1.5B on NVIDIA L4, rough)"
# No coefficient reaches 1,000 s: beyond that it is no hardware's time, and near the float
# range (1e308) a modeled duration becomes infinite and has no nanosecond value at all.
MAX_COEFFICIENT_MS = 1e6


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
    if doc.get("version") != COST_MODEL_VERSION:
        raise InputError(f"this psgate reads version {COST_MODEL_VERSION}, found "
                         f"{doc.get('version')!r}", path=path, field="version")
    _one_line_schema_error(doc, path)


def load_cost_model(path: str | Path) -> CostModel:
    """A calibrated cost-model file (schemas/cost-model.schema.json) as a CostModel whose
    origin names the file by basename and SHA-256."""
    from psgate.trace.reader import require_utf8_name

    require_utf8_name(str(path))
    p = Path(path)
    try:
        raw = p.read_bytes()
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
    fit = doc["fit"]
    for k in COEFFICIENTS:
        if not (math.isfinite(fit[k]) and fit[k] <= MAX_COEFFICIENT_MS):
            raise InputError(f"expected a finite number >= 0 and <= {MAX_COEFFICIENT_MS:g}, "
                             f"found {fit[k]!r}", path=str(p), field=f"fit.{k}")
    origin = {"name": p.name, "sha256": hashlib.sha256(raw).hexdigest(),
              "model": doc["model"]["name"], "dtype": doc["dtype"],
              "device": doc["device"]["name"]}
    return CostModel(**{k: float(fit[k]) for k in COEFFICIENTS}, origin=origin)
