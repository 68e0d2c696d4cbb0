"""Seeded, deterministic workload generators that write psgate-trace v1.

Each generator is registered here by KIND with its default parameters (fixed
before any policy is compared on it, and written into every trace header):

    psgate trace gen KIND --seed S [--param KEY=VALUE ...] [--cost-model FILE] -o FILE

Generators whose arrival rates derive from prefill capacity (C_prefill) take the
cost model too: the defaults unless a calibrated file is given, whose name and
SHA-256 then go into the header beside the derived rates.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from psgate.errors import InputError


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
    """The trace lines of workload ``kind``; ``cost`` (a CostModel) only for the kinds
    whose rates derive from C_prefill."""
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
    if gen.uses_cost:
        return gen.make(cost=cost, **params)
    if cost is not None:
        uses = ", ".join(k for k, g in gens.items() if g.uses_cost)
        raise InputError(f"workload '{kind}' does not derive its rates from a cost model; "
                         f"those that do: {uses}", path="--cost-model")
    return gen.make(**params)
