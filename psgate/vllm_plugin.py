"""vLLM plugin: serve with the policy the gate tested.

Registered as the ``vllm.general_plugins`` entry point ``psgate``; vLLM calls
:func:`register` in each of its processes. With ``PSGATE_POLICY`` unset it does
nothing at all, so vLLM's native eviction is untouched: unsetting the variable
and restarting is the way back. With it set::

    PSGATE_POLICY=prefixshield               any registered policy but belady
    PSGATE_POLICY_CONFIG=policy.json         optional: {"params": {...}} (JSON or TOML)
    PSGATE_LEDGER=/var/log/psgate-ledger.csv optional: one CSV row per eviction

every KVCacheManager the engine core builds gets the policy installed as its
block pool's free-block queue (:class:`psgate.engines.vllm_live.LivePolicy`):
the same policy code ``psgate replay`` gated. A request's tenant is its
``SamplingParams.extra_args`` ``psgate_group``/``psgate_contract``, else its
``cache_salt`` (``group`` or ``group<NUL>scope``); a contract the policy does not
know is served as ``standard``. Every newly cached full block, prompt or output,
is charged to the request's group.

With vLLM's multiprocessing on, the policy lives in the engine-core process, so
its decisions reach the operator through the ledger file.
"""

from __future__ import annotations

import csv
import json
import os
import time
from pathlib import Path

ENV_POLICY = "PSGATE_POLICY"
ENV_CONFIG = "PSGATE_POLICY_CONFIG"
ENV_LEDGER = "PSGATE_LEDGER"
LEDGER_COLUMNS = ("t_s", "request", "group", "contract", "victim_block", "victim_group",
                  "queue", "position", "num_candidates", "responsible", "rank")


def register() -> None:
    """vLLM's entry point: patch KVCacheManager only when PSGATE_POLICY is set."""
    if not os.environ.get(ENV_POLICY):
        return
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    if getattr(KVCacheManager, "_psgate_installs", None) is not None:
        return
    original = KVCacheManager.__init__

    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        if self.enable_caching:
            KVCacheManager._psgate_installs.append(install(self))

    KVCacheManager.__init__ = __init__
    KVCacheManager._psgate_installs = []


def load_params(path: str | None) -> dict:
    if not path:
        return {}
    p = Path(path)
    if p.suffix == ".toml":
        import tomllib
        doc = tomllib.loads(p.read_text())
    else:
        doc = json.loads(p.read_text())
    params = doc.get("params", {})
    if not isinstance(params, dict):
        raise ValueError(f"{path}: field 'params': expected a table of policy parameters, "
                         f"found {type(params).__name__}")
    return params


class EvictionLedger:
    """Eviction rows to a CSV file, flushed per row (the engine may be killed any time)."""

    hits = False

    def __init__(self, path: str) -> None:
        new = not Path(path).exists() or Path(path).stat().st_size == 0
        self._f = open(path, "a", newline="", buffering=1)
        self._w = csv.writer(self._f, lineterminator="\n")
        if new:
            self._w.writerow(LEDGER_COLUMNS)

    def eviction(self, now_ns, req, d, block, hash_name, owner) -> None:
        self._w.writerow([f"{now_ns / 1e9:.6f}", req.id if req else "",
                          req.group if req else "", req.contract if req else "", block, owner,
                          d.queue, d.position, d.num_candidates, d.responsible or "",
                          json.dumps(d.rank, sort_keys=True)])

    def admission(self, *args) -> None:
        pass


def install(mgr):
    """Install the configured policy into one KVCacheManager; returns the LivePolicy."""
    from psgate.engines.vllm_live import DEFAULT_CONTRACT, LivePolicy, identify
    from psgate.policies import make_policy

    policy = make_policy(os.environ[ENV_POLICY], load_params(os.environ.get(ENV_CONFIG)))
    known = policy.contract_table()

    def describe(request):
        group, contract, scope = identify(request)
        if known is not None and contract not in known:
            contract = DEFAULT_CONTRACT
        return group, contract, scope

    ledger = os.environ.get(ENV_LEDGER)
    return LivePolicy(mgr, policy, clock_ns=time.monotonic_ns, describe=describe,
                      recorder=EvictionLedger(ledger) if ledger else None)
