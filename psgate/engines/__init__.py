"""Engines replay a trace under one policy and report what happened.

``sim`` is psgate's own block pool and service model, reproducing vLLM v1's
block pool; ``vllm-pool`` runs the same service model on vLLM's own
KVCacheManager; ``vllm-sched`` runs vLLM's own Scheduler on the modeled step clock;
``vllm`` replays on the real vLLM runtime and records observed results (the vLLM
engines need vLLM, imported only when chosen).

Engines import traces, the hard invariant checker, errors, resources and, of the policies,
only the interface and the registry: a policy family's own checkers come from the policy
(``invariant_auditors``), so no engine knows a policy's parameters. Engines never import
the receipt, the reports or the CLI.
"""

from __future__ import annotations

ENGINES = ("sim", "vllm-pool", "vllm-sched", "vllm")


def engine_class(name: str, scheduler: str = "service"):
    """The engine class for a name in ENGINES (``sim`` with ``scheduler="step"``: its step
    scheduler); vLLM is imported only for its engines."""
    if name == "vllm":
        from psgate.engines.vllm_real import VllmRealEngine
        return VllmRealEngine
    if name == "vllm-pool":
        from psgate.engines.vllm_pool import VllmPoolEngine
        return VllmPoolEngine
    if name == "vllm-sched":
        from psgate.engines.vllm_sched import VllmSchedEngine
        return VllmSchedEngine
    if scheduler == "step":
        from psgate.engines.sched import StepSimEngine
        return StepSimEngine
    from psgate.engines.sim import SimEngine
    return SimEngine


def engine_info(name: str, model_config: str | None = None,
                time_compression: float = 1.0, pacing: str = "wall", sched=None,
                step_cost=None) -> dict | None:
    """What a receipt records about the engine beyond its name (vLLM's version; for the
    real engine also torch, the device, the model config, the pacing, the scheduler
    settings and the time compression or the step cost model)."""
    if name == "sim":
        return None
    if name == "vllm":
        from psgate.engines.vllm_real import engine_details
        return engine_details(model_config, time_compression, pacing, sched, step_cost)
    from psgate.engines.vllm_pool import vllm_version
    return {"vllm": vllm_version(name)}
