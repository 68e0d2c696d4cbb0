"""vLLM plugin: serve with the policy the gate tested.

Registered as the ``vllm.general_plugins`` entry point ``psgate``; vLLM calls
:func:`register` in each of its processes. With ``PSGATE_POLICY``, ``PSGATE_CAPTURE`` and
``PSGATE_SHADOW`` unset it does nothing at all, so vLLM's native eviction is untouched:
unsetting the variables and restarting is the way back. With it set::

    PSGATE_POLICY=prefixshield               a policy spec, as psgate replay takes one (a
                                             built-in name but belady, an installed entry
                                             point, module:Class or path/file.py:Class)
    PSGATE_POLICY_CONFIG=policy.json         optional: {"params": {...}} (JSON or TOML), and
                                             "contracts": "contracts.toml" (a contracts
                                             file, relative to it: psgate contracts suggest)
    PSGATE_LEDGER=/var/log/psgate-ledger.csv optional: one CSV row per eviction

every KVCacheManager the engine core builds gets the policy installed as its
block pool's free-block queue (:class:`psgate.engines.vllm_live.LivePolicy`):
the same policy code ``psgate replay`` gated. A request's tenant is its
``SamplingParams.extra_args`` ``psgate_group``/``psgate_contract``, else its
``cache_salt`` (``group`` or ``group<NUL>scope``); a contract the policy does not
know is served as ``standard``. Its retention hints are ``extra_args``
``psgate_retention`` (token ranges, a list or a JSON string) and ``psgate_retention_s``
(seconds): the policy sees them as a replay's policy does, and a capture writes them. Every newly cached full block, prompt or output,
is charged to the request's group.

With vLLM's multiprocessing on, the policy lives in the engine-core process, so
its decisions reach the operator through the ledger file.

Two more switches, each usable alone (see :mod:`psgate.capture` and :mod:`psgate.shadow`)::

    PSGATE_CAPTURE=DIR                   write a redacted trace of the live traffic to DIR
      PSGATE_CAPTURE_KEY_FILE=FILE       the hash key, hex (or PSGATE_HASH_KEY); required
      PSGATE_CAPTURE_MAX_BYTES / _MAX_SECONDS / _QUEUE   rotation and queue bounds
    PSGATE_SHADOW=prefixshield           run a shadow policy (a spec) beside the live eviction
      PSGATE_SHADOW_DIR=DIR              its reports (default: DIR/shadow of the capture,
                                         else ./psgate-shadow)
      PSGATE_SHADOW_INTERVAL_S=60        how often a summary line is written
    PSGATE_FLUSH_S=1                     capture and shadow files reach the disk at least
                                         this often (and every 1,024 capture events)
    PSGATE_SHUTDOWN_GRACE_S=10           the engine core's time to finish them at shutdown

Shutdown. The files are finished on the engine core's own shutdown path: first thing
in ``EngineCore.shutdown``, which vLLM calls once its SIGTERM/SIGINT handler has
stopped the busy loop and every request is finished or aborted (the scheduler's
``shutdown`` closes them too, should another path reach it). vLLM's default
``--shutdown-timeout 0`` makes the process manager send SIGTERM and SIGKILL to the
engine core at once, which would leave no time for that; the plugin therefore gives
the engine core a grace window (``PSGATE_SHUTDOWN_GRACE_S``) in that mode, the way
vLLM itself does on ROCm. The wait ends as soon as the engine core has exited.
"""

from __future__ import annotations

import atexit
import csv
import hashlib
import json
import logging
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
ENV_HASH_KEY = "PSGATE_HASH_KEY"
ENV_MAX_BYTES = "PSGATE_CAPTURE_MAX_BYTES"
ENV_MAX_SECONDS = "PSGATE_CAPTURE_MAX_SECONDS"
ENV_QUEUE = "PSGATE_CAPTURE_QUEUE"
ENV_FLUSH = "PSGATE_FLUSH_S"
ENV_GRACE = "PSGATE_SHUTDOWN_GRACE_S"
DEFAULT_GRACE_S = 10.0
SHADOW_SUBDIR = "shadow"          # corpus replay (--trace DIR) reads top-level *.jsonl only
LEDGER_COLUMNS = ("t_s", "request", "group", "contract", "victim_block", "victim_group",
                  "queue", "position", "num_candidates", "responsible", "rank", "t0_unix")

# vLLM's own logger tree, so the line shows in the server log with vLLM's format.
logger = logging.getLogger("vllm.psgate")

_installing: list = []      # managers being set up by install(), innermost last
_external: dict[str, str] = {}      # vLLM's internal request id -> the client's request id
_origin: list[tuple[float, float]] = []     # (monotonic, unix) at this process's t = 0
_closer: list = []          # close_installed, once registered with atexit


def _active() -> bool:
    return any(os.environ.get(v) for v in (ENV_POLICY, ENV_CAPTURE, ENV_SHADOW))


def register() -> None:
    """vLLM's entry point: patch only when PSGATE_POLICY, PSGATE_CAPTURE or PSGATE_SHADOW
    is set; otherwise vLLM is left exactly as it is. A policy spec that does not load
    stops the process here, at start, with psgate's one-line error (exit 2)."""
    if not _active():
        return
    check_specs()
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
    _patch_scheduler(capture=bool(os.environ.get(ENV_CAPTURE)))
    _give_engine_core_time_to_finish()


def check_specs() -> None:
    """Resolve PSGATE_POLICY and PSGATE_SHADOW (and their parameters) now: a server that
    cannot serve the policy it was told to must not start with vLLM's own eviction.

    ``vllm serve`` calls :func:`register` while it builds its argument parser (every
    ``vllm`` command does), before it parses the command line or configures its logging,
    and lets the SystemExit through: the process exits 2 with this one line on stderr and
    no engine is started. The line is logged too only where logging already has a handler
    (an engine core, an application's own logging); before that, a log record would reach
    stderr a second time through Python's last-resort handler."""
    from psgate.errors import InputError, PsgateError
    from psgate.policies import make_policy
    try:
        params = load_params(os.environ.get(ENV_CONFIG))
        contracts = load_contracts_file(os.environ.get(ENV_CONFIG))
        for env in (ENV_POLICY, ENV_SHADOW):
            spec = os.environ.get(env)
            if spec:
                policy = make_policy(spec, _with_contracts(
                    spec, params if env == ENV_POLICY or not os.environ.get(ENV_POLICY)
                    else {}, contracts), env)
                # What LivePolicy refuses in the engine core (a traceback there), here.
                if policy.needs_future:
                    raise InputError(f"policy '{spec}': it needs the trace's future and "
                                     f"cannot run inside a live engine", path=env)
                if not policy.work_conserving:
                    raise InputError(f"policy '{spec}': it makes requests wait (admission "
                                     f"control), which vLLM's scheduler does not ask a "
                                     f"block pool about; replay it with --engine sim or "
                                     f"vllm-pool", path=env)
    except (PsgateError, OSError, ValueError) as exc:
        import sys
        line = f"psgate: error: {exc}".replace("\n", " ")
        if logger.hasHandlers():
            logger.error("%s", line)
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
        raise SystemExit(2) from None


def _give_engine_core_time_to_finish() -> None:
    """In vLLM's abort mode (``--shutdown-timeout 0``, the default) the process manager
    SIGKILLs the engine core right after its SIGTERM; give it a grace window instead, so
    its shutdown finishes the capture, ledger and shadow files. Takes effect in the front
    end, where the process manager lives; elsewhere it is never called."""
    try:
        from vllm.v1.engine import utils as engine_utils
        original = engine_utils.get_engine_process_shutdown_timeout
    except (ImportError, AttributeError):
        import vllm
        logger.warning(
            "psgate: vLLM %s has no engine shutdown timeout to extend; run `vllm serve` "
            "with --shutdown-timeout 20 (or more) or the capture, ledger tail and shadow "
            "report are lost when the server is stopped", vllm.__version__)
        return
    grace = float(os.environ.get(ENV_GRACE, DEFAULT_GRACE_S))

    def shutdown_timeout(request_timeout, process_timeout):
        got = original(request_timeout, process_timeout)
        if request_timeout == 0 and not got:
            logger.info("psgate: the engine core gets up to %g s (%s) to finish psgate's "
                        "files before it is killed", grace, ENV_GRACE)
            return grace
        return got

    engine_utils.get_engine_process_shutdown_timeout = shutdown_timeout


def _config_doc(path: str | None) -> dict:
    if not path:
        return {}
    p = Path(path)
    if p.suffix == ".toml":
        import tomllib
        return tomllib.loads(p.read_text())
    return json.loads(p.read_text())


def load_params(path: str | None) -> dict:
    params = _config_doc(path).get("params", {})
    if not isinstance(params, dict):
        raise ValueError(f"{path}: field 'params': expected a table of policy parameters, "
                         f"found {type(params).__name__}")
    return params


def load_contracts_file(path: str | None):
    """The policy config's ``contracts`` file (psgate.contracts, a path relative to the
    config file), or None. Its group names are matched as served and, when a capture key
    is set, as that key pseudonymizes them, so a file suggested from a capture applies."""
    doc = _config_doc(path)
    name = doc.get("contracts")
    if name is None:
        return None
    if not isinstance(name, str) or not name:
        raise ValueError(f"{path}: field 'contracts': expected the path of a contracts file, "
                         f"found {name!r}")
    from psgate.contracts import load_contracts
    return load_contracts(str(Path(path).parent / name))


def contract_namer(file, key: bytes | None):
    """A request's (group, label) -> the contract the contracts file gives its group."""
    if file is None:
        return None
    if key is None:
        return lambda group, label: file.contract_of(group)
    from psgate.trace.redact import pseudonym
    key = key[:64]      # as the capture writer keys its pseudonyms

    def name(group: str, label: str) -> str:
        if group in file.groups:
            return file.contract_of(group)
        return file.contract_of(pseudonym("g", group, key))
    return name


def origin() -> tuple[float, float]:
    """(monotonic seconds, unix seconds) of t = 0 in this process: the capture's clock,
    which the ledger and the shadow share, so their times line up with the capture's."""
    if not _origin:
        _origin.append((time.monotonic(), time.time()))
    return _origin[0]


def client_id(request_id: str) -> str:
    """The id the client gave or was given (vLLM's external request id) for an internal one."""
    return _external.get(request_id, request_id)


class EvictionLedger:
    """Eviction rows to a CSV file, flushed per row (the engine may be killed any time).

    ``t_s`` is seconds on the capture's clock and ``t0_unix`` the wall-clock time of its
    zero, the same in every row of one server run: rows appended by a later run differ
    there."""

    hits = False

    def __init__(self, path: str) -> None:
        p = Path(path)
        header = ",".join(LEDGER_COLUMNS)
        if p.exists() and p.stat().st_size:
            with open(p, newline="") as f:
                first = f.readline().rstrip("\r\n")
            if first != header:       # an older layout: keep it aside, start afresh
                old = p.with_name(f"{p.name}.{int(time.time())}.old")
                os.replace(p, old)
                logger.warning("psgate: %s had other columns; moved it to %s", p, old)
        new = not p.exists() or p.stat().st_size == 0
        self.t0, t0_unix = origin()
        self._t0_unix = f"{t0_unix:.6f}"
        self._f = open(p, "a", newline="", buffering=1)
        self._w = csv.writer(self._f, lineterminator="\n")
        if new:
            self._w.writerow(LEDGER_COLUMNS)

    def eviction(self, now_ns, req, d, block, hash_name, owner) -> None:
        self._w.writerow([f"{time.monotonic() - self.t0:.6f}",
                          client_id(req.id) if req else "",
                          req.group if req else "", req.contract if req else "", block, owner,
                          d.queue, d.position, d.num_candidates, d.responsible or "",
                          json.dumps(d.rank, sort_keys=True), self._t0_unix])

    def admission(self, *args) -> None:
        pass

    def close(self) -> None:
        if not self._f.closed:
            self._f.close()


def params_digest(policy) -> str:
    """A short digest of the policy's full parameters (defaults included), for the log."""
    doc = json.dumps(policy.describe(), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(doc.encode()).hexdigest()[:12]


def code_digest(spec: str) -> str:
    """The first 16 hex digits of the SHA-256 over the policy's source files, as a replay's
    receipt records it in full (``config.candidate.source.sha256``): which code serves."""
    from psgate.policies import resolve
    return resolve(spec).sha256[:16]


def install(mgr) -> dict:
    """Install what the environment asks for into one KVCacheManager: the policy
    (PSGATE_POLICY), the shadow (PSGATE_SHADOW) and the capture hooks (PSGATE_CAPTURE)."""
    from psgate.engines.vllm_live import DEFAULT_CONTRACT, LivePolicy, identify
    from psgate.policies import make_policy

    params = load_params(os.environ.get(ENV_CONFIG))
    contracts = load_contracts_file(os.environ.get(ENV_CONFIG))
    key = None
    if contracts is not None and (os.environ.get(ENV_KEY_FILE)
                                  or os.environ.get(ENV_HASH_KEY)):
        key = _capture_key()
    namer = contract_namer(contracts, key)
    done: dict = {"manager": mgr}
    t0 = origin()[0]
    flush_s = float(os.environ.get(ENV_FLUSH, "1"))

    def describer(policy):
        known = policy.contract_table()

        def describe(request):
            group, contract, scope = identify(request)
            if namer is not None:
                contract = namer(group, contract)
            if known is not None and contract not in known:
                contract = DEFAULT_CONTRACT
            return group, contract, scope
        return describe

    said = []
    name = os.environ.get(ENV_POLICY)
    if name:
        policy = make_policy(name, _with_contracts(name, params, contracts), ENV_POLICY)
        ledger = os.environ.get(ENV_LEDGER)
        done["ledger"] = EvictionLedger(ledger) if ledger else None
        done["policy"] = LivePolicy(mgr, policy, clock_ns=time.monotonic_ns,
                                    describe=describer(policy), recorder=done["ledger"])
        said.append(f"policy {name} (params sha256:{params_digest(policy)}, code "
                    f"sha256:{code_digest(name)}), ledger {ledger or 'off'}")
    else:
        said.append("policy: vLLM's own eviction")
    capture = os.environ.get(ENV_CAPTURE)
    shadow = os.environ.get(ENV_SHADOW)
    if shadow:
        from psgate.shadow import ShadowRunner
        policy = make_policy(shadow, _with_contracts(shadow, params if not name else {},
                                                     contracts), ENV_SHADOW)
        directory = os.environ.get(ENV_SHADOW_DIR) or (
            str(Path(capture) / SHADOW_SUBDIR) if capture else "psgate-shadow")
        done["shadow"] = ShadowRunner(
            mgr, policy, directory, live_policy=name or "native", describe=describer(policy),
            interval_s=float(os.environ.get(ENV_SHADOW_INTERVAL, "60")), t0=t0,
            flush_s=flush_s)
        said.append(f"shadow {shadow} (params sha256:{params_digest(policy)}, code "
                    f"sha256:{code_digest(shadow)}) -> {Path(directory).resolve()}")
    if capture:
        done["capture"] = _CaptureHooks(mgr, flush_s)
        said.append(f"capture -> {Path(capture).resolve()}")
    logger.info("psgate: %s", "; ".join(said))
    if not _closer:
        _closer.append(atexit.register(close_installed))
    return done


def close_installed(manager=None) -> None:
    """Finish the capture, ledger and shadow files of one KV cache manager, or of every
    one in this process (idempotent): called from the engine core's and the scheduler's
    shutdown, and at interpreter exit when vLLM runs in process."""
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    for done in getattr(KVCacheManager, "_psgate_installs", None) or ():
        if manager is not None and done["manager"] is not manager or done.get("closed"):
            continue
        done["closed"] = True
        closed = []
        for key in ("capture", "shadow", "ledger"):
            part = done.get(key)
            if part is None:
                continue
            try:
                part.close()
                closed.append(key)
            except Exception:       # one part failing must not keep the others open
                logger.exception("psgate: closing the %s failed", key)
        if closed:      # DEBUG: in process, vLLM logs to stdout, where callers print results
            logger.debug("psgate: %s complete", ", ".join(closed))


def _with_contracts(spec: str, params: dict, contracts) -> dict:
    """``params`` with the contracts file's table where the policy takes one."""
    if contracts is None:
        return params
    from psgate.contracts import contracts_params
    from psgate.policies import resolve
    return contracts_params(params, getattr(resolve(spec).cls, "defaults", {}), contracts,
                            ENV_CONFIG)


# -- capture ------------------------------------------------------------------------------
def _capture_key() -> bytes:
    from psgate.trace.redact import load_key
    return load_key(os.environ.get(ENV_KEY_FILE), unkeyed=False)


def _hybrid_groups(mgr) -> str | None:
    """The served model's KV-cache groups when it has more than one full-attention group
    (a capture's header records them, and its replay must model them)."""
    from psgate.engines.vllm_live import model_kv_groups
    groups = model_kv_groups(mgr.kv_cache_config)
    return None if groups == "full" else groups


class _CaptureHooks:
    """Per KV cache manager: the writer, and what the scheduler saw per request."""

    def __init__(self, mgr, flush_s: float) -> None:
        import vllm

        from psgate.capture import CaptureWriter
        bs = mgr.kv_cache_config.kv_cache_groups[0].kv_cache_spec.block_size
        env = os.environ
        t0, t0_unix = origin()
        self.writer = CaptureWriter(
            env[ENV_CAPTURE], _capture_key(), bs,
            source=f"psgate capture (vLLM {vllm.__version__})",
            max_bytes=int(env.get(ENV_MAX_BYTES, 64 << 20)),
            max_seconds=float(env.get(ENV_MAX_SECONDS, 3600)),
            queue_size=int(env.get(ENV_QUEUE, 65536)), t0=t0, t0_unix=t0_unix,
            flush_s=flush_s, kv_groups=_hybrid_groups(mgr))
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
                elif rid not in self.first_token and request.num_output_tokens >= 1:
                    self.first_token[rid] = self.writer.now()
            return out

        mgr.allocate_slots = allocate_slots

    def close(self) -> None:
        self.writer.close()

    def arrived(self, request, model: str) -> None:
        from psgate.engines.vllm_live import identify
        group, contract, _ = identify(request)
        lora = getattr(request, "lora_request", None)
        scope = (model, "", getattr(lora, "lora_name", "") or "", request.cache_salt or "")
        rid = request.request_id
        self.arrival[rid] = self.writer.now()
        sp = getattr(request, "sampling_params", None)
        self.writer.request(rid, group, contract, scope, request.prompt_token_ids,
                            request.max_tokens, client_id=client_id(rid),
                            extra_args=getattr(sp, "extra_args", None) if sp else None)

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
                         getattr(request, "num_preemptions", 0), request.output_token_ids)


def _patch_scheduler(capture: bool) -> None:
    """Keep each request's client id, feed the capture, and finish every file on the
    scheduler's shutdown (the engine core's own shutdown path)."""
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.engine.core import EngineCore
    from vllm.v1.request import Request
    core_shutdown = EngineCore.shutdown
    add, free, shutdown = Scheduler.add_request, Scheduler._free_request, Scheduler.shutdown
    from_core = Request.from_engine_core_request.__func__

    def from_engine_core_request(cls, request, *args, **kwargs):
        req = from_core(cls, request, *args, **kwargs)
        external = getattr(request, "external_req_id", None)
        if external and external != req.request_id:
            _external[req.request_id] = external
        return req

    def add_request(self, request):
        hooks = getattr(self.kv_cache_manager, "_psgate_capture", None)
        if hooks is not None and request.request_id not in self.requests:
            hooks.arrived(request, str(self.vllm_config.model_config.model))
        return add(self, request)

    def _free_request(self, request, *args, **kwargs):
        hooks = getattr(self.kv_cache_manager, "_psgate_capture", None)
        if hooks is not None:
            hooks.finished(request)
        try:
            return free(self, request, *args, **kwargs)
        finally:
            _external.pop(request.request_id, None)

    def shutdown_(self, *args, **kwargs):
        try:
            return shutdown(self, *args, **kwargs)
        finally:
            close_installed(self.kv_cache_manager)

    def engine_shutdown(self, *args, **kwargs):
        # Before the executor's teardown, which on some platforms waits seconds for its
        # workers: the busy loop has stopped, so nothing reaches the scheduler any more.
        scheduler = getattr(self, "scheduler", None)
        if scheduler is not None:
            close_installed(scheduler.kv_cache_manager)
        return core_shutdown(self, *args, **kwargs)

    Request.from_engine_core_request = classmethod(from_engine_core_request)
    Scheduler._free_request, Scheduler.shutdown = _free_request, shutdown_
    EngineCore.shutdown = engine_shutdown
    if capture:
        Scheduler.add_request = add_request
