"""Engines replay a trace under one policy and report what happened.

``sim`` is psgate's own block pool and service model, reproducing vLLM v1's
block pool; ``vllm-pool`` runs the same service model on vLLM's own
KVCacheManager (needs vLLM, imported only when chosen). Engines never import the
receipt or the CLI.
"""

from __future__ import annotations

ENGINES = ("sim", "vllm-pool")


def engine_class(name: str):
    """The engine class for a name in ENGINES; vLLM is imported only for vllm-pool."""
    if name == "vllm-pool":
        from psgate.engines.vllm_pool import VllmPoolEngine
        return VllmPoolEngine
    from psgate.engines.sim import SimEngine
    return SimEngine


def engine_info(name: str) -> dict | None:
    """What a receipt records about the engine beyond its name (vLLM's version)."""
    if name == "sim":
        return None
    from psgate.engines.vllm_pool import vllm_version
    return {"vllm": vllm_version()}
