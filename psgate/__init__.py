"""psgate: a policy receipt and release gate for KV prefix-cache eviction."""

__version__ = "0.1.0"

from psgate import core  # noqa: E402 - PSGATE_CORE=0 acts before any other psgate module

core.run_interpreted()
