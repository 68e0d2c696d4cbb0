"""Helpers shared by the generators: parameters and their checks, request lines,
synthetic chained block hashes, arrivals, headers."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator

from psgate.engines.cost import CostModel
from psgate.errors import InputError

SYNTHETIC_HASHING = "synthetic-blake2b-128"


def chain(label: str, num_blocks: int, parent: str | None = None, start: int = 0) -> list[str]:
    """Chained hashes for synthetic content: block j of ``label`` after ``parent``.

    Generators have no tokens; hashing (parent, label, j) gives what real hashing
    gives: equal content at equal depth after equal parents is equal, and a
    hash determines its parent.
    """
    out = []
    prev = bytes.fromhex(parent) if parent else bytes(16)
    for j in range(start, start + num_blocks):
        h = hashlib.blake2b(prev + f"{label}/{j}".encode(), digest_size=16).digest()
        out.append(h.hex())
        prev = h
    return out


def poisson(rng: random.Random, start: float, end: float, rate: float) -> Iterator[float]:
    """Arrival times of a Poisson process of ``rate`` per second in [start, end)."""
    t = start
    while True:
        t += rng.expovariate(rate)
        if t >= end:
            return
        yield t


def cost_or_default(cost: CostModel | None) -> CostModel:
    return cost if cost is not None else CostModel()


def cost_provenance(cost: CostModel) -> dict:
    """For a header's ``derived``: which calibrated file set the rates (nothing for the
    defaults, so default traces stay byte-identical)."""
    if cost.origin is None:
        return {}
    return {"cost_model": {k: cost.origin[k] for k in ("name", "sha256", "model", "dtype",
                                                       "device")}}


def unique_prefill_rate(cost: CostModel, prompt_tokens: int, n: int = 32) -> float:
    """C_prefill: requests/s when ``n`` distinct-prefix requests of ``prompt_tokens``
    (no hits) are served back to back by one FIFO prefill server under ``cost``."""
    total_ms = n * cost.prefill_ms(prompt_tokens, 0)
    return n / (total_ms / 1000.0)


def resolve_params(kind: str, defaults: dict, overrides: dict) -> dict:
    """The defaults with ``overrides`` on top. generate() refuses unknown parameters
    first; a generator called directly refuses them the same way."""
    unknown = sorted(set(overrides) - set(defaults))
    if unknown:
        raise InputError(f"unknown parameter(s) for '{kind}': {', '.join(unknown)}; known: "
                         f"{', '.join(defaults)}", path="--param")
    return {**defaults, **overrides}


def need(kind: str, ok: bool, key: str, what: str, value) -> None:
    """Refuses parameter ``key`` of workload ``kind`` unless ``ok``: bad input, in the
    words of generate()'s own checks, so every refusal reads alike."""
    if not ok:
        raise InputError(f"workload '{kind}': '{key}' expects {what}, found {value!r}",
                         path="--param")


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def positive(kind: str, p: dict, *keys: str) -> None:
    for k in keys:
        need(kind, _number(p[k]) and p[k] > 0, k, "a value > 0", p[k])


def nonneg(kind: str, p: dict, *keys: str) -> None:
    for k in keys:
        need(kind, _number(p[k]) and p[k] >= 0, k, "a value >= 0", p[k])


def fraction(kind: str, p: dict, *keys: str) -> None:
    for k in keys:
        need(kind, _number(p[k]) and 0 <= p[k] <= 1, k, "a fraction in [0, 1]", p[k])


def ordered(kind: str, p: dict, lo: str, hi: str) -> None:
    need(kind, p[lo] <= p[hi], hi, f"a value >= {lo} ({p[lo]})", p[hi])


def whole_block(kind: str, p: dict, *keys: str) -> None:
    """Token counts that must hold at least one full block (a prompt's shared part)."""
    bs = p["block_size"]
    for k in keys:
        need(kind, p[k] >= bs, k, f"at least one block ({bs} tokens)", p[k])


def distinct(kind: str, p: dict, *keys: str) -> None:
    """Groups that must differ: a victim measured against itself measures nothing."""
    for i, k in enumerate(keys):
        need(kind, p[k] not in [p[j] for j in keys[:i]], k,
             f"a group other than {' and '.join(keys[:i])}", p[k])


def request(t: float, rid: str, group: str, contract: str, blocks: list[str], tail: int,
            out: int, prefix: str, role: str, *, measure: bool = True, scope: str = "m",
            **extra) -> dict:
    """A request line (``t`` to the microsecond); ``measure`` is written only when false
    and ``extra`` (priority hints, ...) last, so lines without them stay as they were."""
    r = {"t": round(t, 6), "op": "request", "id": rid, "group": group, "contract": contract,
         "scope": scope, "blocks": blocks, "tail": tail, "out": out, "prefix": prefix,
         "role": role}
    if not measure:
        r["measure"] = False
    r.update(extra)
    return r
