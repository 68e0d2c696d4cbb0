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

Two more switches, each usable alone (see :mod:`psgate.capture` and :mod:`psgate.shadow`)::

    PSGATE_CAPTURE=DIR                   write a redacted trace of the live traffic to DIR
      PSGATE_CAPTURE_KEY_FILE=FILE       the hash key (or PSGATE_HASH_KEY, hex); required
      PSGATE_CAPTURE_MAX_BYTES / _MAX_SECONDS / _QUEUE   rotation and queue bounds
    PSGATE_SHADOW=prefixshield           run a shadow policy beside the live eviction
      PSGATE_SHADOW_DIR=DIR              its reports (default: the capture dir, else .)
      PSGATE_SHADOW_INTERVAL_S=60        how often a summary line is written
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
ENV_SHADOW = "PSGATE_SHADOW"
ENV_SHADOW_DIR = "PSGATE_SHADOW_DIR"
ENV_SHADOW_INTERVAL = "PSGATE_SHADOW_INTERVAL_S"
ENV_CAPTURE = "PSGATE_CAPTURE"
ENV_KEY_FILE = "PSGATE_CAPTURE_KEY_FILE"
ENV_MAX_BYTES = "PSGATE_CAPTURE_MAX_BYTES"
ENV_MAX_SECONDS = "PSGATE_CAPTURE_MAX_SECONDS"
ENV_QUEUE = "PSGATE_CAPTURE_QUEUE"
LEDGER_COLUMNS = ("t_s", "request", "group", "contract", "victim_block", "victim_group",
                  "queue", "position", "num_candidates", "responsible", "rank")


_installing: list = []      # managers being set up by install(), innermost last


def register() -> None:
    """vLLM's entry point: patch only when PSGATE_POLICY, PSGATE_CAPTURE or PSGATE_SHADOW
    is set; otherwise vLLM is left exactly as it is."""
    if not any(os.environ.get(v) for v in (ENV_POLICY, ENV_CAPTURE, ENV_SHADOW)):
        return
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    if getattr(KVCacheManager, "_psgate_installs", None) is not None:
        return
    original = KVCacheManager.__init__

    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        # The shadow's own model-less manager is built inside install(): leave it alone.
        if self.enable_caching and not _installing:
            _installing.append(self)
            try:
                KVCacheManager._psgate_installs.append(install(self))
            finally:
                _installing.pop()

    KVCacheManager.__init__ = __init__
    KVCacheManager._psgate_installs = []
    if os.environ.get(ENV_CAPTURE):
        _patch_scheduler()


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


def install(mgr) -> dict:
    """Install what the environment asks for into one KVCacheManager: the policy
    (PSGATE_POLICY), the shadow (PSGATE_SHADOW) and the capture hooks (PSGATE_CAPTURE)."""
    from psgate.engines.vllm_live import DEFAULT_CONTRACT, LivePolicy, identify
    from psgate.policies import make_policy

    params = load_params(os.environ.get(ENV_CONFIG))
    done: dict = {}

    def describer(policy):
        known = policy.contract_table()

        def describe(request):
            group, contract, scope = identify(request)
            if known is not None and contract not in known:
                contract = DEFAULT_CONTRACT
            return group, contract, scope
        return describe

    name = os.environ.get(ENV_POLICY)
    if name:
        policy = make_policy(name, params)
        ledger = os.environ.get(ENV_LEDGER)
        done["policy"] = LivePolicy(mgr, policy, clock_ns=time.monotonic_ns,
                                    describe=describer(policy),
                                    recorder=EvictionLedger(ledger) if ledger else None)
    shadow = os.environ.get(ENV_SHADOW)
    if shadow:
        from psgate.shadow import ShadowRunner
        policy = make_policy(shadow, params if not name else {})
        done["shadow"] = ShadowRunner(
            mgr, policy, os.environ.get(ENV_SHADOW_DIR) or os.environ.get(ENV_CAPTURE) or ".",
            live_policy=name or "native", describe=describer(policy),
            interval_s=float(os.environ.get(ENV_SHADOW_INTERVAL, "60")))
    if os.environ.get(ENV_CAPTURE):
        done["capture"] = _CaptureHooks(mgr)
    return done


# -- capture ------------------------------------------------------------------------------
def _capture_key() -> bytes:
    from psgate.trace.redact import KEY_ENV
    path = os.environ.get(ENV_KEY_FILE)
    if path:
        return Path(path).read_bytes().strip()
    if os.environ.get(KEY_ENV):
        return bytes.fromhex(os.environ[KEY_ENV].strip())
    raise ValueError(f"{ENV_CAPTURE} is set but there is no hash key: set {ENV_KEY_FILE} "
                     f"(a file) or {KEY_ENV} (hex), at least 16 bytes")


class _CaptureHooks:
    """Per KV cache manager: the writer, and what the scheduler saw per request."""

    def __init__(self, mgr) -> None:
        import vllm

        from psgate.capture import CaptureWriter
        bs = mgr.kv_cache_config.kv_cache_groups[0].kv_cache_spec.block_size
        env = os.environ
        self.writer = CaptureWriter(
            env[ENV_CAPTURE], _capture_key(), bs, source=f"psgate capture (vLLM {vllm.__version__})",
            max_bytes=int(env.get(ENV_MAX_BYTES, 64 << 20)),
            max_seconds=float(env.get(ENV_MAX_SECONDS, 3600)),
            queue_size=int(env.get(ENV_QUEUE, 65536)))
        self.arrival: dict[str, float] = {}
        self.cached: dict[str, int] = {}
        self.first_token: dict[str, float] = {}
        mgr._psgate_capture = self
        allocate = mgr.allocate_slots

        def allocate_slots(request, *args, **kwargs):
            rid = request.request_id
            before = request.num_computed_tokens
            out = allocate(request, *args, **kwargs)
            if out is not None:
                if before == 0 and rid not in self.cached:
                    self.cached[rid] = kwargs.get("num_new_computed_tokens",
                                                  args[1] if len(args) > 1 else 0)
                elif request.num_output_tokens >= 1 and rid not in self.first_token:
                    self.first_token[rid] = self.writer.now()
            return out

        mgr.allocate_slots = allocate_slots

    def arrived(self, request, model: str) -> None:
        from psgate.engines.vllm_live import identify
        group, contract, _ = identify(request)
        lora = getattr(request, "lora_request", None)
        scope = (model, "", getattr(lora, "lora_name", "") or "", request.cache_salt or "")
        self.arrival[request.request_id] = self.writer.now()
        self.writer.request(request.request_id, group, contract, scope,
                            request.prompt_token_ids, request.max_tokens)

    def finished(self, request) -> None:
        rid = request.request_id
        arrival = self.arrival.pop(rid, None)
        cached = self.cached.pop(rid, None)
        first = self.first_token.pop(rid, None)
        from vllm.v1.request import RequestStatus
        if request.status == RequestStatus.FINISHED_ABORTED:
            self.writer.cancel(rid)
            return
        if first is None and request.num_output_tokens >= 1:
            first = self.writer.now()          # one output token: its time is the end
        ttft = None if first is None or arrival is None else (first - arrival) * 1000.0
        self.writer.done(rid, cached, ttft, request.num_output_tokens,
                         getattr(request, "num_preemptions", 0))


def _patch_scheduler() -> None:
    from vllm.v1.core.sched.scheduler import Scheduler
    add, free = Scheduler.add_request, Scheduler._free_request

    def add_request(self, request):
        hooks = getattr(self.kv_cache_manager, "_psgate_capture", None)
        if hooks is not None and request.request_id not in self.requests:
            hooks.arrived(request, str(self.vllm_config.model_config.model))
        return add(self, request)

    def _free_request(self, request, *args, **kwargs):
        hooks = getattr(self.kv_cache_manager, "_psgate_capture", None)
        if hooks is not None:
            hooks.finished(request)
        return free(self, request, *args, **kwargs)

    Scheduler.add_request, Scheduler._free_request = add_request, _free_request
