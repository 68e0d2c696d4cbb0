"""vllm: replay a trace on the real vLLM runtime and record what it decided.

A ``vllm.LLM`` with dummy (random) weights is built from a Hugging Face model
config (``--model-config``; the tiny Qwen2 bundled with psgate by default), with
``skip_tokenizer_init`` and prompts given as token ids synthesized from the
trace's block hashes, ``cache_salt`` per (group, scope) namespace, and the psgate
policy installed in the engine's block pool (:class:`~psgate.engines.vllm_live.LivePolicy`).
The scheduler runs with the step replay's settings (:class:`SchedulerParams`:
token budget, sequence cap, chunked prefill), passed explicitly and recorded. A request
generates ``out`` tokens (greedy, EOS ignored) and holds its blocks until it has, which is
the real scheduler's rule, not the trace's ``done`` events.

Two pacings decide when a request reaches the engine:

    wall      requests are submitted on the trace's clock compressed by
              ``time_compression`` (trace seconds per wall second) while the engine
              steps as fast as the device allows; times are observed (wall clock).
    lockstep  before each ``step()`` the requests due on a *modeled step clock* are
              added (cancels due abort theirs), then the clock advances by the
              :class:`StepCostModel` applied to what that step actually scheduled
              (prefill vs decode as the step replay protocol classifies them); with
              nothing running or waiting the clock jumps to the next arrival. vLLM's
              own scheduler, pool and model runner decide on the same clock as
              psgate's step scheduler, so a run is deterministic and comparable with
              it request by request. TTFT is the step-clock time of a request's first
              token (modeled); the wall-clock TTFT observed beside it is reported in
              the run's ``observed.wall_ttft_ms``.

The step's work is read from the engine core's own ``SchedulerOutput`` (in process:
``VLLM_ENABLE_V1_MULTIPROCESSING=0``): ``Scheduler.schedule`` is wrapped to see
``num_scheduled_tokens`` and each request's ``num_computed_tokens`` before the step
(``schedule`` has already advanced it, vllm/v1/core/sched/scheduler.py:1616-1629).

Each run is also predicted with ``vllm-pool`` on the same trace and policy, and every
request whose cached tokens differ is listed with a difference class, the first of these
that applies (the replay model admits at arrival, allocates a whole request at once,
caches prompt blocks only and never preempts; each class names the first of those
assumptions the real run broke before the request's prefix lookup):

    state                 the prediction admitted, rejected or dropped it differently
    preempted             the scheduler preempted this request (freed and re-acquired)
    output_block_hit      it hit a block holding generated tokens
    preemption            another request was preempted before its lookup, freeing and
                          re-acquiring blocks in an order the replay model never produces
    output_block_caching  before its lookup the engine evicted while a cached block of
                          generated tokens lay free (the replay model frees such blocks
                          uncached, so the two pools evicted different blocks)
    scheduling_order      its lookup followed a different set of earlier lookups than
                          predicted, or followed a request whose prompt was still only
                          partly allocated (chunked prefill; the model allocates whole)
    step_timing           the same lookups preceded it, but a different set of requests
                          had released their blocks by then, or in another order
                          (holding times: step durations on the modeled clock, or the
                          device's speed under wall pacing)
    decode_allocation     before its lookup a decoding request took a new block for its
                          generated tokens (the replay model reserves a request's output
                          blocks at admission, so it took those blocks earlier)
    unexplained           none of the above could be told from the run's data
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections import deque
from dataclasses import astuple
from pathlib import Path

from psgate.engines.cost import CostModel
from psgate.engines.results import (CANCELLED, COMPLETED, DROPPED, REJECTED, UNFINISHED,
                                    RequestOutcome, RunResult)
from psgate.engines.base import NullRecorder
from psgate.engines.kv_groups import format_kv_groups, parse_kv_groups
from psgate.engines.step_cost import SchedulerParams, StepCostModel
from psgate.engines.step_work import StepTally, recomputed_tokens
from psgate.engines.vllm_live import LivePolicy, model_kv_groups
from psgate.engines.vllm_pool import (VllmPoolEngine, namespace_salt, prompt_token_ids,
                                      vllm_version)
from psgate.errors import InputError
from psgate.policy import PoolInfo
from psgate.trace.keys import chain_key
from psgate.trace.model import CancelEvent, RequestEvent

PACINGS = ("wall", "lockstep")
DIFFERENCE_CLASSES = ("state", "preempted", "output_block_hit", "preemption",
                      "output_block_caching", "scheduling_order", "step_timing",
                      "decode_allocation", "unexplained")
NS_PER_MS = 1_000_000
# Steps in a row that schedule nothing, with no arrival left, before a run gives up on the
# requests still waiting (none should: a request that cannot fit an empty cache is rejected).
MAX_IDLE_STEPS = 1000


def default_model_config() -> Path:
    """The tiny Qwen2 config shipped in the package (examples/models/tiny-qwen2)."""
    from importlib import resources
    return Path(str(resources.files("psgate") / "data" / "models" / "tiny-qwen2"))


def current_device() -> str:
    """The device vLLM's platform runs on here ("cpu", "cuda", ...)."""
    from vllm.platforms import current_platform
    return "cpu" if current_platform.is_cpu() else str(current_platform.device_type)


def check_pacing(pacing: str) -> str:
    if pacing not in PACINGS:
        raise InputError(f"expected one of {', '.join(PACINGS)}, found '{pacing}'",
                         path="--pacing")
    return pacing


def engine_details(model_config: str | None, time_compression: float, pacing: str = "wall",
                   sched: SchedulerParams | None = None,
                   step_cost: StepCostModel | None = None) -> dict:
    """What a receipt records about a real-engine run (versions, device, model, pacing and
    the scheduler settings the engine ran under)."""
    import hashlib

    import torch
    path = Path(model_config) if model_config else default_model_config()
    cfg_bytes = (path / "config.json").read_bytes()
    sched = sched or SchedulerParams()
    info = {"vllm": vllm_version("vllm"), "torch": torch.__version__, "device": current_device(),
            "model": path.name, "model_config_sha256": hashlib.sha256(cfg_bytes).hexdigest(),
            "architectures": json.loads(cfg_bytes).get("architectures"),
            "weights": "dummy (random)", "pacing": check_pacing(pacing),
            "scheduler": sched.to_json()}
    if pacing == "lockstep":
        info["step_cost_model"] = (step_cost or StepCostModel()).to_json()
        info["times"] = ("modeled: time to first token on the step clock (the step cost "
                         "model applied to what each real step scheduled); the wall-clock "
                         "TTFT observed on this device is each run's observed.wall_ttft_ms")
    else:
        info["time_compression"] = time_compression
        info["times"] = ("observed: wall-clock time to first token on this device; "
                         "no modeled time is mixed in")
    return info


class _Clock:
    """The replay's clock: the modeled step clock (lockstep) or the compressed wall clock."""

    def __init__(self, lockstep: bool, t_first: int, compression: float) -> None:
        self.lockstep, self.t_first, self.compression = lockstep, t_first, compression
        self.now = t_first
        self.t0 = time.monotonic_ns()

    def __call__(self) -> int:
        if self.lockstep:
            return self.now
        return self.t_first + round((time.monotonic_ns() - self.t0) * self.compression)


class _EvictionTap:
    """The run's recorder, also noting evictions that cached output blocks took part in
    (evicted, or lying free and evictable when another block was chosen)."""

    def __init__(self, inner, on_eviction) -> None:
        self._inner, self._on_eviction = inner, on_eviction

    def eviction(self, now_ns, req, decision, block, hash_name, owner) -> None:
        self._on_eviction(block)
        self._inner.eviction(now_ns, req, decision, block, hash_name, owner)

    def __getattr__(self, name):
        return getattr(self._inner, name)


class VllmRealEngine:
    """Replays one trace on a real vLLM engine under one policy."""

    name = "vllm"

    def __init__(self, *, header, hashes, capacity: int, policy, contracts, done_ids,
                 cost: CostModel | None = None, recorder=None, paranoid: bool = False,
                 label: str = "run", trace_path: str = "trace", progress=None,
                 groups: tuple[str, ...] = (), max_in_flight: int = 1_000_000,
                 model_config: str | None = None, time_compression: float = 1.0,
                 pacing: str = "wall", step_cost: StepCostModel | None = None,
                 sched: SchedulerParams | None = None) -> None:
        self.header, self.hashes, self.capacity = header, hashes, capacity
        self.policy, self.contracts = policy, frozenset(contracts)
        self.done_ids, self.cost = done_ids, cost or CostModel()
        self.recorder = recorder or NullRecorder()
        self.label, self.trace_path, self.progress = label, trace_path, progress
        self.groups = groups
        self.pacing = check_pacing(pacing)
        self.step_cost = step_cost or StepCostModel()
        self.sched = sched or SchedulerParams()
        self.model_config = Path(model_config) if model_config else default_model_config()
        cfg_file = self.model_config / "config.json"
        try:
            self.max_positions = int(json.loads(cfg_file.read_text())
                                     .get("max_position_embeddings", 1 << 20))
        except (OSError, ValueError, TypeError) as exc:
            raise InputError(f"expected a Hugging Face model config directory with a readable "
                             f"config.json, found {type(exc).__name__}: {exc}",
                             path=str(cfg_file), field="--model-config") from None
        if not policy.work_conserving:
            raise InputError(f"policy '{policy.name}' makes requests wait (admission control), "
                             f"which vLLM's scheduler does not consult; replay it with "
                             f"--engine sim or vllm-pool", path=f"policy {policy.name}")
        self.bs = header.block_size
        vllm_version("vllm")
        self.device = current_device()
        if self.device == "cpu" and self.bs % 32:
            raise InputError(f"vLLM's CPU attention needs a block size that is a multiple of "
                             f"32; this trace has block_size {self.bs} (re-import or generate "
                             f"it with --block-size 32, or use --engine vllm-pool)",
                             path=trace_path, line=1, field="block_size")
        if not time_compression > 0:
            raise InputError(f"expected a time compression > 0, found {time_compression}",
                             path="--time-compression")
        self.compression = time_compression
        self.paranoid = paranoid
        self.max_in_flight = max_in_flight

    # -- the engine ---------------------------------------------------------------
    def _build(self, max_model_len: int):
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        from vllm import LLM
        s = self.sched
        if not s.enable_chunked_prefill and s.max_num_batched_tokens < max_model_len:
            raise InputError(f"without chunked prefill the token budget must hold the longest "
                             f"request: max_num_batched_tokens {s.max_num_batched_tokens} < "
                             f"{max_model_len}", path="scheduler.max_num_batched_tokens")
        # Synchronous scheduling: each step schedules, runs and updates before the next one
        # is scheduled (EngineCore.step, vllm/v1/engine/core.py:657-691), as the step
        # replay protocol steps.
        llm = LLM(model=str(self.model_config), load_format="dummy", skip_tokenizer_init=True,
                  enable_prefix_caching=True, block_size=self.bs,
                  num_gpu_blocks_override=self.capacity, max_model_len=max_model_len,
                  max_num_batched_tokens=s.max_num_batched_tokens, max_num_seqs=s.max_num_seqs,
                  enable_chunked_prefill=s.enable_chunked_prefill,
                  long_prefill_token_threshold=s.long_prefill_token_threshold,
                  watermark=s.watermark, async_scheduling=False, enforce_eager=True,
                  disable_log_stats=False, seed=0,
                  prefix_cache_retention_interval=s.prefix_cache_retention_interval)
        return llm

    def run(self, events) -> RunResult:
        events = list(events)
        bs, usable = self.bs, self.capacity - 1
        reqs = [ev for ev in events if type(ev) is RequestEvent]
        for ev in reqs:
            if ev.contract not in self.contracts:
                raise InputError(f"unknown contract '{ev.contract}'; the replay's contract "
                                 f"table has {', '.join(sorted(self.contracts))}",
                                 path=self.trace_path, line=ev.line, field="contract")
        # A request that cannot fit the cache or the model's positions is rejected, as sim
        # rejects one that cannot fit an empty cache.
        limit = min(usable * bs, self.max_positions)
        fits = {ev.id for ev in reqs if ev.prompt_tokens + max(1, ev.out) < limit}
        longest = max((ev.prompt_tokens + max(1, ev.out) for ev in reqs if ev.id in fits),
                      default=bs)
        max_model_len = min(limit, -(-(longest + 1) // bs) * bs)
        llm = self._build(max_model_len)
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        greedy = dict(temperature=0.0, ignore_eos=True)
        # One request first, so one-time start-up work (the first forward pass) is not
        # charged to the trace's first request; then an empty cache, as the trace expects.
        llm.generate([TokensPrompt(prompt_token_ids=[1] * (2 * bs))],
                     SamplingParams(max_tokens=2, **greedy), use_tqdm=False)
        llm.reset_prefix_cache()
        eng = llm.llm_engine
        core = eng.engine_core.engine_core
        scheduler = core.scheduler
        mgr = scheduler.kv_cache_manager
        self._check_kv_groups(scheduler.kv_cache_config)
        from vllm.v1.core.kv_cache_utils import get_group_id
        vocab = llm.llm_engine.model_config.get_vocab_size()
        lockstep = self.pacing == "lockstep"
        clock = _Clock(lockstep, events[0].t_ns if events else 0, self.compression)

        by_id = {ev.id: ev for ev in reqs}
        index = {ev.id: i for i, ev in enumerate(reqs)}
        ns_ids: dict[tuple[str, str], int] = {}
        for ev in reqs:     # numbered by first appearance, as sim and future_uses number them
            ns_ids.setdefault((ev.group, ev.scope), len(ns_ids))
        names = self.hashes.names

        def key_of(rid, pos, block):
            # the model generates its own tokens: past the prompt, never shared; a hybrid
            # model's groups each hold their own content (the group is in vLLM's key)
            ev = by_id[rid]
            group = get_group_id(block.block_hash) if block is not None else 0
            return chain_key(ev.blocks, ns_ids[(ev.group, ev.scope)], index[rid], pos, group)

        def name_of(rid, pos, block):
            ev = by_id[rid]
            return names[ev.blocks[pos]] if pos < len(ev.blocks) else f"output:{rid}:{pos}"

        def trace_id(rid: str) -> str:
            """vLLM suffixes the id it was given with a random tag; the trace's id is the
            one given, which may itself contain '-'."""
            return rid if rid in by_id else rid.rsplit("-", 1)[0]

        def describe(request):
            ev = by_id[trace_id(request.request_id)]
            return ev.group, ev.contract, ev.scope

        # -- what the run's difference classes need, in lookup order ----------------
        # ``seq`` counts prefix lookups (a request's first allocation); an event noted
        # with seq s happened after lookups 0..s-1 and before lookup s.
        seq = [0]
        lookup_seq: dict[str, int] = {}
        preemption_seq: list[int] = []
        output_eviction_seq: list[int] = []
        decode_allocation_seq: list[int] = []
        step_no = [0]
        idle = [0]      # consecutive steps that scheduled nothing
        # Each step that scheduled work: (P, C, D, K) as the step cost model reads them,
        # then the wall milliseconds ``step()`` took, so the model can be fitted to this
        # engine's own steps (tools/compare_real.py --fit-steps).
        step_work: list[tuple[int, int, int, int]] = []
        step_times: list[list] = []
        first_step: dict[str, int] = {}          # the step it was first scheduled in
        first_start: dict[str, int] = {}         # that step's start on the replay clock
        first_cached: dict[str, int] = {}        # vLLM's prefill stats at that scheduling
        released_at: dict[str, int] = {}         # steps begun before its blocks were freed,
                                                 # in release order
        partial_before: set[str] = set()         # looked up behind a partly allocated prompt
        preemptions: dict[str, int] = {}
        lost_tokens: dict[str, int] = {}    # preempted, not yet resumed: tokens it had
        recomputed: dict[str, int] = {}     # tokens computed again after its preemptions
        live_ref: list[LivePolicy] = []

        def on_eviction(block: int) -> None:
            live = live_ref[0]
            pool = live.pool
            if block in live.output_blocks or any(
                    pool.blocks[b].ref_cnt == 0 for b in live.output_blocks if b != block):
                output_eviction_seq.append(seq[0])

        recorder = _EvictionTap(self.recorder, on_eviction)
        live = LivePolicy(mgr, self.policy, clock_ns=clock, recorder=recorder,
                          key_of=key_of, name_of=name_of, describe=describe,
                          request_id=lambda request: trace_id(request.request_id),
                          future_known=True,
                          # Keys declared opaque (no key_shift): a block of generated tokens
                          # has an output_key, outside the (namespace << KEY_SHIFT) | hash
                          # layout that a policy's per-hash tables are sized by (prefixshield's
                          # PrefixHistory would grow to the key's low 32 bits). Verdicts are
                          # the same either way; only the policy's memory layout differs.
                          pool_info=PoolInfo(num_blocks=self.capacity, num_usable=usable,
                                             block_size=bs, groups=tuple(self.groups)))
        live_ref.append(live)

        allocate = mgr.allocate_slots
        pool = mgr.block_pool

        def allocate_slots(request, *args, **kwargs):
            tid = trace_id(request.request_id)
            if tid not in lookup_seq:
                lookup_seq[tid] = seq[0]
                seq[0] += 1
            if tid in lost_tokens and not request.num_computed_tokens:
                # a resumed request's lookup: what it had computed, less what it hits
                out = allocate(request, *args, **kwargs)
                if out is not None:
                    hits = kwargs.get("num_new_computed_tokens", args[1] if len(args) > 1
                                      else 0)
                    recomputed[tid] = (recomputed.get(tid, 0)
                                       + recomputed_tokens(lost_tokens.pop(tid), hits))
                return out
            if not (request.num_output_tokens and request.num_computed_tokens):
                return allocate(request, *args, **kwargs)
            # A decode (not a resumed recompute): no lookup, so fewer free blocks after
            # the call means it took new ones.
            free_before = pool.get_num_free_blocks()
            out = allocate(request, *args, **kwargs)
            if pool.get_num_free_blocks() < free_before:
                decode_allocation_seq.append(seq[0])
            return out

        mgr.allocate_slots = allocate_slots

        preempt = scheduler._preempt_request

        def preempt_request(request, *args, **kwargs):
            # vllm/v1/core/sched/scheduler.py:1571-1608: blocks freed, back to waiting.
            tid = trace_id(request.request_id)
            lost_tokens[tid] = request.num_computed_tokens
            preemptions[tid] = preemptions.get(tid, 0) + 1
            preemption_seq.append(seq[0])
            return preempt(request, *args, **kwargs)

        scheduler._preempt_request = preempt_request

        schedule = scheduler.schedule

        def schedule_step(*args, **kwargs):
            start = clock()
            out = schedule(*args, **kwargs)
            tally = StepTally()
            for rid, n in out.num_scheduled_tokens.items():
                request = scheduler.requests[rid]
                before = request.num_computed_tokens - n     # schedule() advanced it
                # Step replay protocol, step 4: a decode or a prefill chunk, as replays count
                tally.add(n, before, request.num_tokens, request.num_output_tokens)
                tid = trace_id(rid)
                if tid not in first_step:
                    first_step[tid] = step_no[0]
                    first_start[tid] = start
                    stats = request.prefill_stats
                    first_cached[tid] = stats.num_cached_tokens if stats is not None else 0
                    if any(q.request_id != rid and q.num_computed_tokens
                           < len(by_id[trace_id(q.request_id)].blocks) * bs
                           and trace_id(q.request_id) in lookup_seq
                           and lookup_seq[trace_id(q.request_id)] < lookup_seq.get(tid, 0)
                           for q in scheduler.running):
                        partial_before.add(tid)
            step_no[0] += 1
            idle[0] = idle[0] + 1 if not out.total_num_scheduled_tokens else 0
            work = tally.work()
            if out.total_num_scheduled_tokens:
                step_work.append(astuple(work))
            if lockstep:
                clock.now += self.step_cost.step_ns(work)
            return out

        scheduler.schedule = schedule_step

        tokens_cache: dict[int, list[int]] = {}
        outcomes: dict[str, RequestOutcome] = {}
        last_cached: dict[str, int] = {}
        first_token_ns: dict[str, int] = {}
        wall_ttft: dict[str, float] = {}
        counts = {"admitted": 0, "rejected": 0, "cancelled": 0, "dropped": 0,
                  "late_cancels": 0, "preempted": 0, "preemptions": 0, "unfinished": 0,
                  "steps": 0}
        rejected: list[str] = []
        pending = deque(events)
        submitted: set[str] = set()

        def submit(ev: RequestEvent) -> None:
            o = RequestOutcome(id=ev.id, group=ev.group, contract=ev.contract, role=ev.role,
                               measure=ev.measure, state=UNFINISHED, t_ns=ev.t_ns,
                               prompt_tokens=ev.prompt_tokens)
            outcomes[ev.id] = o
            if ev.id not in fits:
                o.state = REJECTED
                counts["rejected"] += 1
                rejected.append(ev.id)
                return
            toks = prompt_token_ids(ev, names, bs, tokens_cache, vocab)
            prompt = TokensPrompt(prompt_token_ids=toks,
                                  cache_salt=namespace_salt(ev.group, ev.scope))
            eng.add_request(ev.id, prompt, SamplingParams(max_tokens=max(1, ev.out), **greedy))
            submitted.add(ev.id)

        def cancel(ev: CancelEvent) -> None:
            if ev.id not in submitted:
                counts["late_cancels"] += 1
                return
            o = outcomes[ev.id]
            started = ev.id in first_step
            o.state = CANCELLED if started else DROPPED
            counts["cancelled" if started else "dropped"] += 1
            eng.abort_request([ev.id])
            submitted.discard(ev.id)
            o.release_ns = clock()
            released_at[ev.id] = step_no[0]
            if started:     # what vLLM reported for it: its last output, else its lookup
                o.cached_tokens = last_cached.get(ev.id, first_cached.get(ev.id, 0))

        def observe(out) -> None:
            rid = out.request_id
            o = outcomes.get(rid)
            if o is None or o.state in (CANCELLED, DROPPED):
                return
            if out.num_cached_tokens is not None:
                last_cached[rid] = out.num_cached_tokens
            if rid not in first_token_ns and any(c.token_ids for c in out.outputs):
                first_token_ns[rid] = clock()
                m = out.metrics
                if m is not None and m.first_token_ts:
                    wall_ttft[rid] = m.first_token_latency * 1000.0
            if not out.finished:
                return
            submitted.discard(rid)
            o.cached_tokens = out.num_cached_tokens or 0
            o.release_ns = clock()
            released_at[rid] = step_no[0]
            if o.state == UNFINISHED:
                o.state = COMPLETED

        while pending or eng.has_unfinished_requests():
            now = clock()
            while pending and pending[0].t_ns <= now:
                ev = pending.popleft()
                if self.progress is not None:
                    self.progress(ev.line)
                if type(ev) is RequestEvent:
                    submit(ev)
                elif type(ev) is CancelEvent:
                    cancel(ev)
            if eng.has_unfinished_requests():
                num_before = len(step_work)
                t0 = time.perf_counter()
                outs = eng.step()
                ms = (time.perf_counter() - t0) * 1e3
                if len(step_work) > num_before:
                    step_times.append([*step_work[-1], round(ms, 4)])
                for out in outs:
                    observe(out)
                if idle[0] >= MAX_IDLE_STEPS and not pending:
                    break       # nothing can be scheduled any more: the rest is unfinished
            elif pending:
                if lockstep:        # nothing running or waiting: on to the next arrival
                    clock.now = max(clock.now, pending[0].t_ns)
                    continue
                wait_ns = (pending[0].t_ns - clock()) / self.compression
                if wait_ns > 0:
                    time.sleep(min(wait_ns / 1e9, 0.5))
        end = clock()
        for rid, o in outcomes.items():
            o.preemptions = preemptions.get(rid, 0)
            o.preempt_recompute_tokens = recomputed.get(rid, 0)
            start = first_start.get(rid)
            tok = first_token_ns.get(rid)
            if lockstep:
                if start is not None:
                    o.queue_ms = (start - o.t_ns) / NS_PER_MS
                if tok is not None:
                    o.ttft_ms = (tok - o.t_ns) / NS_PER_MS
                    o.prefill_ms = (tok - start) / NS_PER_MS if start is not None else None
            elif rid in wall_ttft:
                o.ttft_ms = wall_ttft[rid]
        counts["admitted"] = len(first_step)
        counts["unfinished"] = len(submitted)
        counts["preempted"] = sum(1 for n in preemptions.values() if n)
        counts["preemptions"] = sum(preemptions.values())
        counts["steps"] = step_no[0]
        counts["evictions"] = live.num_evictions
        groups = list(dict.fromkeys([*self.groups, *live.groups]))
        evictions_by: dict[str, dict[str, int]] = {}
        for (g, og), n in sorted(live.evictions_by.items()):
            a = live.groups[g] if g >= 0 else ""
            b = live.groups[og] if og >= 0 else ""
            evictions_by.setdefault(a, {})[b] = n
        result = RunResult(
            label=self.label, policy=self.policy.describe(), usable_blocks=usable,
            requests=[outcomes[ev.id] for ev in reqs if ev.id in outcomes], groups=groups,
            evictions=live.num_evictions, evictions_by=evictions_by,
            occupancy_mean={}, occupancy_max={}, counts=counts,
            invariants={"no_pinned_eviction": live.pinned}, orphans={},
            rejected_ids=rejected, start_ns=clock.t_first, end_ns=end)
        run = _RunTrace(index=index, lookup_seq=lookup_seq, preemption_seq=preemption_seq,
                        output_eviction_seq=output_eviction_seq,
                        decode_allocation_seq=decode_allocation_seq, first_step=first_step,
                        released_at=released_at, partial_before=partial_before,
                        preemptions=preemptions, output_hits=live.output_hits)
        result.observed = self._compare(events, result, run)
        result.observed["pacing"] = self.pacing
        ttfts = sorted(wall_ttft[o.id] for o in result.requests if o.id in wall_ttft)
        result.observed["wall_ttft_ms"] = {
            "n": len(ttfts),
            "p50": round(statistics.median(ttfts), 3) if ttfts else None,
            "p95": round(ttfts[min(len(ttfts) - 1, int(0.95 * len(ttfts)))], 3)
            if ttfts else None}
        result.observed["step_wall_ms"] = {
            "columns": ["prefill_tokens", "context_tokens", "decodes",
                        "decode_context_tokens", "wall_ms"],
            "rows": step_times}
        if lockstep:    # beside each request's modeled TTFT (requests.csv), its wall one
            result.observed["wall_ttft_ms"]["by_request"] = {
                o.id: round(wall_ttft[o.id], 3) for o in result.requests if o.id in wall_ttft}
        del llm
        return result

    def _check_kv_groups(self, kv_cache_config) -> None:
        """The model's KV-cache groups must be the ones the replay was given (the receipt
        records them, and the step replays of the same receipt model them)."""
        model = model_kv_groups(kv_cache_config)
        try:
            parse_kv_groups(model, where=None)
        except InputError:
            raise InputError(f"the model's KV-cache groups are {model}; psgate models "
                             f"full-attention and sliding-window groups only",
                             path="--model-config") from None
        given = format_kv_groups(self.sched.kv_groups)
        if model != given:
            raise InputError(f"the model's KV-cache groups are {model}, the replay's "
                             f"{given}; pass --kv-groups {model}", path="--kv-groups")

    # -- observed vs predicted ------------------------------------------------------
    def _compare(self, events, result: RunResult, run: "_RunTrace") -> dict:
        """Predict the same run with vllm-pool (vllm-sched for a hybrid model, which
        vllm-pool does not model) and classify every difference (the rules are the module
        docstring's)."""
        policy = type(self.policy)(**dict(self.policy.params))     # a fresh instance
        if self.sched.hybrid:
            from psgate.engines.vllm_sched import VllmSchedEngine
            by = "vllm-sched"
            pool = VllmSchedEngine(header=self.header, hashes=self.hashes,
                                   capacity=self.capacity, policy=policy,
                                   contracts=self.contracts, done_ids=frozenset(),
                                   cost=self.cost, label=self.label,
                                   trace_path=self.trace_path, sched=self.sched,
                                   step_cost=self.step_cost)
        else:
            by = "vllm-pool"
            pool = VllmPoolEngine(header=self.header, hashes=self.hashes,
                                  capacity=self.capacity, policy=policy,
                                  contracts=self.contracts, done_ids=frozenset(),
                                  cost=self.cost, label=self.label, trace_path=self.trace_path)
        predicted = {o.id: o for o in pool.run(iter(events)).requests}
        differences = []
        num_equal = num_comparable = num_comparable_equal = 0
        preemptions, output_hits = run.preemptions, run.output_hits
        for o in result.requests:
            p = predicted.get(o.id)
            equal = p is not None and p.state == o.state and p.cached_tokens == o.cached_tokens
            # The replay model covers a request the scheduler never preempted and that hit
            # no block of generated tokens; that set is held to exact equality.
            covered = not preemptions.get(o.id) and not output_hits.get(o.id)
            num_equal += equal
            num_comparable += covered
            num_comparable_equal += covered and equal
            if equal:
                continue
            differences.append({"id": o.id, "observed_cached_tokens": o.cached_tokens,
                                "predicted_cached_tokens": p.cached_tokens if p else None,
                                "observed_state": o.state,
                                "predicted_state": p.state if p else None,
                                "class": run.classify(o, p, predicted)})
        by_class = {c: sum(1 for d in differences if d["class"] == c)
                    for c in DIFFERENCE_CLASSES}
        return {"predicted_by": by, "num_requests": len(result.requests),
                "num_equal": num_equal, "num_comparable": num_comparable,
                "num_comparable_equal": num_comparable_equal,
                "comparable_equal_fraction": (round(num_comparable_equal / num_comparable, 6)
                                              if num_comparable else None),
                "differences_by_class": by_class, "differences": differences,
                "preempted_ids": sorted(i for i, n in preemptions.items() if n)}


class _RunTrace:
    """What the real run recorded about its lookups, releases and preemptions, and the
    difference classes derived from it."""

    def __init__(self, **fields) -> None:
        self.__dict__.update(fields)

    def classify(self, o: RequestOutcome, p: RequestOutcome | None, predicted: dict) -> str:
        gone = (REJECTED, DROPPED)
        if p is None or (p.state in gone) != (o.state in gone):
            return "state"
        if self.preemptions.get(o.id):
            return "preempted"
        if self.output_hits.get(o.id):
            return "output_block_hit"
        mine = self.lookup_seq.get(o.id)
        if mine is None:
            return "unexplained"
        if any(s <= mine for s in self.preemption_seq):
            return "preemption"
        if any(s <= mine for s in self.output_eviction_seq):
            return "output_block_caching"
        # Lookups before this one, real (first allocation order) and predicted (vllm-pool
        # looks a request up when it admits it: at arrival, or after its wait).
        real_before = {q for q, s in self.lookup_seq.items() if s < mine}

        def lookup_at(q: RequestOutcome) -> tuple[int, int]:
            return q.t_ns + round(q.wait_ms * NS_PER_MS), self.index[q.id]

        pred_admitted = [q for q in predicted.values() if q.state not in gone]
        pred_before = {q.id for q in pred_admitted if lookup_at(q) < lookup_at(p)}
        if real_before != pred_before or o.id in self.partial_before:
            return "scheduling_order"
        # Releases before this lookup, in release order (a freed request's blocks join the
        # eviction order when it is freed, so the order matters as well as the set).
        step = self.first_step.get(o.id)
        real_released = [q for q, s in self.released_at.items()
                         if step is not None and s <= step and q != o.id
                         and q in self.lookup_seq]
        pred_released = [q.id for q in sorted(
                             (q for q in pred_admitted if q.release_ns is not None),
                             key=lambda q: (q.release_ns, self.index[q.id]))
                         if q.id != o.id and q.release_ns <= lookup_at(p)[0]]
        if real_released != pred_released:
            return "step_timing"
        if any(s <= mine for s in self.decode_allocation_seq):
            return "decode_allocation"
        return "unexplained"
