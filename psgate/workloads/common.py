"""Helpers shared by the generators: synthetic chained block hashes, arrivals, headers."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator

from psgate.engines.cost import CostModel

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
