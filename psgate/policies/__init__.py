"""The policy registry: every eviction policy psgate can replay, by name.

One module per policy behind the interface in ``base``. Policies see the contract table and
their own family's invariant checkers (which they hand the engine), never an engine, a
trace reader or anything above: the engine tells them all they may know.
"""

from __future__ import annotations

from typing import Any

from psgate.errors import InputError

_REGISTRY: dict[str, type] = {}


def register(cls):
    if not cls.name or cls.name in _REGISTRY:
        raise ValueError(f"policy name missing or taken: {cls.name!r}")
    _REGISTRY[cls.name] = cls
    return cls


def unregister(name: str) -> None:
    """Forget a policy registered at run time (a test's stand-in), freeing its name."""
    del _REGISTRY[name]


def _load_builtin() -> None:
    """Import every policy module in this package for its @register side effect."""
    import importlib
    import pkgutil

    for mod in sorted(m.name for m in pkgutil.iter_modules(__path__)):
        if mod not in ("base", "queues"):
            importlib.import_module(f"{__name__}.{mod}")


def policy_names() -> list[str]:
    _load_builtin()
    return sorted(_REGISTRY)


def policy_class(name: str):
    _load_builtin()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise InputError(f"unknown policy '{name}'; registered: "
                         f"{', '.join(sorted(_REGISTRY))}") from None


def make_policy(name: str, params: dict[str, Any] | None = None):
    cls = policy_class(name)
    try:
        return cls(**(params or {}))
    except (TypeError, ValueError) as exc:
        raise InputError(f"policy '{name}': {exc}") from None
