"""Seeded, deterministic workload generators that write psgate-trace v1.

Each generator is registered here by KIND with its default parameters (fixed
before any policy is compared on it, and written into every trace header):

    psgate trace gen KIND --seed S [--param KEY=VALUE ...] [--cost-model FILE] -o FILE

Generators whose arrival rates derive from prefill capacity (C_prefill) take the
cost model too: the defaults unless a calibrated file is given, whose name and
SHA-256 then go into the header beside the derived rates. Their parameter ``rates``
picks which model: "service" (the per-request CostModel) or "step" (a StepRates: vLLM's
scheduler on the step cost model, whose C_prefill workloads.common measures with a
scheduler recurrence of its own).

Generators import the trace writer, the contract table and, of the engines, only the cost
models: a workload never depends on a policy or on how a replay runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import math

from psgate.errors import InputError
from psgate.trace.reader import (MAX_BLOCK_SIZE, MAX_BLOCKS_PER_REQUEST, MAX_JSON_INT,
                                 check_lines, check_seed)

# A generated trace is built in memory before it is checked and written, so what the
# parameters ask for is bounded before any work: requests, and blocks in all (a block is a
# hex hash of about 90 bytes in memory: 2^25 of them are about 3 GB).
MAX_GENERATED_REQUESTS = 2_000_000
MAX_GENERATED_BLOCKS = 1 << 25


@dataclass(frozen=True)
class Generator:
    kind: str
    summary: str
    defaults: dict
    make: Callable[..., list[dict]]
    uses_cost: bool = False


_GENERATORS: dict[str, Generator] = {}


def register_generator(kind: str, summary: str, defaults: dict, uses_cost: bool = False):
    def deco(fn):
        if kind in _GENERATORS:
            raise ValueError(f"generator '{kind}' registered twice")
        _GENERATORS[kind] = Generator(kind, summary, dict(defaults), fn, uses_cost)
        return fn
    return deco


def _load() -> None:
    import importlib
    import pkgutil

    for mod in sorted(m.name for m in pkgutil.iter_modules(__path__)):
        if mod != "common":
            importlib.import_module(f"{__name__}.{mod}")


def generators() -> dict[str, Generator]:
    _load()
    return dict(sorted(_GENERATORS.items()))


def generate(kind: str, params: dict, cost=None) -> list[dict]:
    """The trace lines of workload ``kind``; ``cost`` (a CostModel, or with ``rates=step``
    a StepRates) only for the kinds whose rates derive from C_prefill."""
    gens = generators()
    gen = gens.get(kind)
    if gen is None:
        raise InputError(f"unknown workload '{kind}'; known: {', '.join(gens)}", path="KIND")
    unknown = sorted(set(params) - set(gen.defaults))
    if unknown:
        raise InputError(f"unknown parameter(s) for '{kind}': {', '.join(unknown)}; known: "
                         f"{', '.join(gen.defaults)}", path="--param")
    for k, v in params.items():
        d = gen.defaults[k]
        if d is not None and type(v) is not type(d) and not (
                isinstance(d, float) and type(v) is int):
            raise InputError(f"'{k}' expects {type(d).__name__}, found {v!r}", path="--param")
        _check_value(k, v)
    _check_size(kind, {**gen.defaults, **params})
    if cost is not None and not gen.uses_cost:
        uses = ", ".join(k for k, g in gens.items() if g.uses_cost)
        raise InputError(f"workload '{kind}' does not derive its rates from a cost model; "
                         f"those that do: {uses}", path="--cost-model")
    try:
        lines = gen.make(cost=cost, **params) if gen.uses_cost else gen.make(**params)
    except (ArithmeticError, ValueError, IndexError) as exc:
        raise InputError(f"workload '{kind}': these parameters give no trace ({exc})",
                         path="--param") from None
    # What a generator writes must be what psgate reads: checked here, before any file.
    return check_lines(lines, f"workload '{kind}' output")


def _check_size(kind: str, p: dict) -> None:
    """Refuse parameters that ask for more than a generated trace may hold, naming the
    parameter and the bound. The estimate reads the parameters by their names, as every
    generator spells them: arrivals are ``duration_s`` over each ``*gap_s`` plus each rate
    (``rate``, ``*_rate``, ``rate_*``, per second) times ``duration_s``, plus each count of
    requests (``*requests``, ``conversations``); a request holds at most the largest
    ``*_blocks`` or ``*_tokens`` / ``block_size``. It is an order of magnitude, so only a
    request for far more than the bound is refused."""
    num = lambda v: type(v) in (int, float) and v > 0      # noqa: E731
    duration = p.get("duration_s") if num(p.get("duration_s")) else 0
    parts: list[tuple[float, str]] = []
    for k, v in p.items():
        if not num(v):
            continue
        if k.endswith("gap_s") and duration:
            parts.append((duration / v, f"'{k}'={v!r} over duration_s={duration!r}"))
        elif (k == "rate" or k.endswith("_rate") or k.startswith("rate_")) and duration:
            parts.append((v * duration, f"'{k}'={v!r} over duration_s={duration!r}"))
        elif k.endswith("requests") or k == "conversations":
            parts.append((v, f"'{k}'={v!r}"))
    bs = p.get("block_size") if num(p.get("block_size")) else 1
    for k, v in p.items():
        if not num(v):
            continue
        blocks = v if k.endswith("_blocks") else v / bs if k.endswith("_tokens") else 0
        if blocks > MAX_BLOCKS_PER_REQUEST:
            raise InputError(f"workload '{kind}': '{k}'={v!r} asks for {blocks:.3g} blocks in "
                             f"one request; a trace holds at most {MAX_BLOCKS_PER_REQUEST} "
                             f"(2^20) per request", path="--param")
    requests = sum(n for n, _ in parts)
    if requests > MAX_GENERATED_REQUESTS:
        n, why = max(parts)
        raise InputError(f"workload '{kind}': {why} asks for about {n:.3g} requests; a "
                         f"generated trace holds at most {MAX_GENERATED_REQUESTS} (it is "
                         f"built in memory)", path="--param")
    per_request = max([1.0] + [v if k.endswith("_blocks") else v / bs for k, v in p.items()
                               if num(v) and (k.endswith("_blocks") or k.endswith("_tokens"))])
    if requests * per_request > MAX_GENERATED_BLOCKS:
        raise InputError(f"workload '{kind}': about {requests:.3g} requests of up to "
                         f"{per_request:.3g} blocks ask for more than "
                         f"{MAX_GENERATED_BLOCKS} (2^25) blocks in all, the most a generated "
                         f"trace holds (it is built in memory)", path="--param")


def _check_value(key: str, v) -> None:
    """Generic bounds every generator relies on: counts, sizes, times, rates and fractions
    are never negative (a negative rate would walk arrival times backwards for ever);
    priorities may be; every number is finite and has an exact JSON form."""
    if key == "seed":
        check_seed(v, "--seed")
    elif key == "block_size":
        if not 1 <= v <= MAX_BLOCK_SIZE:
            raise InputError(f"'block_size' must be in 1..{MAX_BLOCK_SIZE}, found {v}",
                             path="--param")
    elif type(v) is float and not math.isfinite(v):
        raise InputError(f"'{key}' must be a finite number, found {v!r}", path="--param")
    elif type(v) in (int, float) and abs(v) > MAX_JSON_INT:
        raise InputError(f"'{key}' must be at most 2^53 - 1 in magnitude, found {v!r:.40}",
                         path="--param")
    elif type(v) in (int, float) and v < 0 and "priority" not in key:
        raise InputError(f"'{key}' must be >= 0, found {v!r}", path="--param")
