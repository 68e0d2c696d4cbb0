"""vllm: replay a trace on the real vLLM runtime and record what it *observed*.

A ``vllm.LLM`` with dummy (random) weights is built from a Hugging Face model
config (``--model-config``; the tiny Qwen2 bundled with psgate by default), with
``skip_tokenizer_init`` and prompts given as token ids synthesized from the
trace's block hashes, ``cache_salt`` per (group, scope) namespace, and the psgate
policy installed in the engine's block pool (:class:`~psgate.engines.vllm_live.LivePolicy`).
Requests are submitted on the trace's clock through ``add_request``/``step``,
compressed by ``time_compression`` (trace seconds per wall second), so a long
trace finishes sooner; a request generates ``out`` tokens (greedy, EOS ignored)
and holds its blocks until it has, which is the real scheduler's rule, not the
trace's ``done`` events.

What the receipt gets is observed: ``num_cached_tokens`` and time to first token
(wall clock) per request, never mixed with modeled times. The real scheduler
allocates output blocks as it decodes, caches full output blocks and may
preempt, so its cache can differ from the replay model's. Each run is therefore
also predicted with ``vllm-pool`` on the same trace and policy, and every
request whose observed cached tokens differ is listed with its difference class:

    preempted         the scheduler preempted it (its blocks were freed and re-acquired)
    output_block_hit  it hit a block holding generated tokens (the replay model caches
                      prompt blocks only)
    state             the prediction admitted, rejected or dropped it differently
    timing            none of the above: the real engine's concurrency and holding
                      times (prefill and decode at the device's speed, on the
                      compressed clock) left a different cache than the modeled ones
"""

from __future__ import annotations

import json
import os
import time
from collections import deque
from pathlib import Path

from psgate.engines.cost import CostModel
from psgate.engines.results import (CANCELLED, COMPLETED, DROPPED, REJECTED, UNFINISHED,
                                    RequestOutcome, RunResult)
from psgate.engines.sim import NullRecorder
from psgate.engines.vllm_live import LivePolicy
from psgate.engines.vllm_pool import (VllmPoolEngine, namespace_salt, prompt_token_ids,
                                      vllm_version)
from psgate.errors import InputError
from psgate.policies import make_policy
from psgate.trace.keys import content_key
from psgate.trace.model import CancelEvent, RequestEvent

DIFFERENCE_CLASSES = ("preempted", "output_block_hit", "state", "timing")


def default_model_config() -> Path:
    """The tiny Qwen2 config shipped in the package (examples/models/tiny-qwen2)."""
    from importlib import resources
    return Path(str(resources.files("psgate") / "data" / "models" / "tiny-qwen2"))


def current_device() -> str:
    """The device vLLM's platform runs on here ("cpu", "cuda", ...)."""
    from vllm.platforms import current_platform
    return "cpu" if current_platform.is_cpu() else str(current_platform.device_type)


def engine_details(model_config: str | None, time_compression: float) -> dict:
    """What a receipt records about a real-engine run (versions, device, model)."""
    import hashlib

    import torch
    path = Path(model_config) if model_config else default_model_config()
    cfg_bytes = (path / "config.json").read_bytes()
    return {"vllm": vllm_version("vllm"), "torch": torch.__version__, "device": current_device(),
            "model": path.name, "model_config_sha256": hashlib.sha256(cfg_bytes).hexdigest(),
            "architectures": json.loads(cfg_bytes).get("architectures"),
            "weights": "dummy (random)", "time_compression": time_compression,
            "times": "observed: wall-clock time to first token on this device; "
                     "no modeled time is mixed in"}


class VllmRealEngine:
    """Replays one trace on a real vLLM engine under one policy."""

    name = "vllm"

    def __init__(self, *, header, hashes, capacity: int, policy, contracts, done_ids,
                 cost: CostModel | None = None, recorder=None, paranoid: bool = False,
                 label: str = "run", trace_path: str = "trace", progress=None,
                 groups: tuple[str, ...] = (), max_in_flight: int = 1_000_000,
                 model_config: str | None = None, time_compression: float = 1.0) -> None:
        self.header, self.hashes, self.capacity = header, hashes, capacity
        self.policy, self.contracts = policy, frozenset(contracts)
        self.done_ids, self.cost = done_ids, cost or CostModel()
        self.recorder = recorder or NullRecorder()
        self.label, self.trace_path, self.progress = label, trace_path, progress
        self.groups = groups
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
        llm = LLM(model=str(self.model_config), load_format="dummy", skip_tokenizer_init=True,
                  enable_prefix_caching=True, block_size=self.bs,
                  num_gpu_blocks_override=self.capacity, max_model_len=max_model_len,
                  max_num_batched_tokens=max(max_model_len, 2048), enforce_eager=True,
                  disable_log_stats=False, seed=0)
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
        mgr = core.scheduler.kv_cache_manager
        vocab = llm.llm_engine.model_config.get_vocab_size()

        t_first = events[0].t_ns if events else 0
        t0 = time.monotonic_ns()

        def clock_ns() -> int:
            return t_first + round((time.monotonic_ns() - t0) * self.compression)

        by_id = {ev.id: ev for ev in reqs}
        ns_ids: dict[tuple[str, str], int] = {}
        for ev in reqs:     # numbered by first appearance, as sim and future_uses number them
            ns_ids.setdefault((ev.group, ev.scope), len(ns_ids))
        names = self.hashes.names

        def key_of(rid, pos, block):
            ev = by_id[rid]
            ns = ns_ids[(ev.group, ev.scope)]
            if pos < len(ev.blocks):
                return content_key(ns, ev.blocks[pos])
            return -2 - (hash((rid, pos)) & 0xFFFFFFFF)    # generated tokens: never shared

        def name_of(rid, pos, block):
            ev = by_id[rid]
            return names[ev.blocks[pos]] if pos < len(ev.blocks) else f"output:{rid}:{pos}"

        def trace_id(request) -> str:
            """vLLM suffixes the id it was given with a random tag; the trace's id is the
            one given, which may itself contain '-'."""
            rid = request.request_id
            return rid if rid in by_id else rid.rsplit("-", 1)[0]

        def describe(request):
            ev = by_id[trace_id(request)]
            return ev.group, ev.contract, ev.scope

        live = LivePolicy(mgr, self.policy, clock_ns=clock_ns, recorder=self.recorder,
                          key_of=key_of, name_of=name_of, describe=describe,
                          request_id=trace_id, future_known=True)
        tokens_cache: dict[int, list[int]] = {}
        outcomes: dict[str, RequestOutcome] = {}
        preemptions: dict[str, int] = {}
        counts = {"admitted": 0, "rejected": 0, "cancelled": 0, "dropped": 0,
                  "late_cancels": 0, "preempted": 0, "unfinished": 0}
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

        def finish(out) -> None:
            o = outcomes[out.request_id]
            submitted.discard(out.request_id)
            m = out.metrics
            o.cached_tokens = out.num_cached_tokens or 0
            o.release_ns = clock_ns()
            if m is not None and m.first_token_ts:
                o.ttft_ms = m.first_token_latency * 1000.0
                preemptions[out.request_id] = m.num_preemptions
            if o.state == UNFINISHED:
                o.state = COMPLETED
            counts["admitted"] += 1

        while pending or eng.has_unfinished_requests():
            now = clock_ns()
            while pending and pending[0].t_ns <= now:
                ev = pending.popleft()
                if self.progress is not None:
                    self.progress(ev.line)
                if type(ev) is RequestEvent:
                    submit(ev)
                elif type(ev) is CancelEvent:
                    if ev.id in submitted:
                        o = outcomes[ev.id]
                        started = ev.id in live._preqs
                        o.state = CANCELLED if started else DROPPED
                        counts["cancelled" if started else "dropped"] += 1
                        eng.abort_request([ev.id])
                        submitted.discard(ev.id)
                        o.release_ns = clock_ns()
                    else:
                        counts["late_cancels"] += 1
            if eng.has_unfinished_requests():
                for out in eng.step():
                    if out.finished and out.request_id in outcomes \
                            and outcomes[out.request_id].state not in (CANCELLED, DROPPED):
                        finish(out)
            elif pending:
                wait_ns = (pending[0].t_ns - clock_ns()) / self.compression
                if wait_ns > 0:
                    time.sleep(min(wait_ns / 1e9, 0.5))
        end = clock_ns()
        counts["preempted"] = sum(1 for n in preemptions.values() if n)
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
            rejected_ids=rejected, start_ns=t_first, end_ns=end)
        result.observed = self._compare(events, result, preemptions, live.output_hits)
        del llm
        return result

    # -- observed vs predicted ------------------------------------------------------
    def _compare(self, events, result: RunResult, preemptions: dict[str, int],
                 output_hits: dict[str, int]) -> dict:
        """Predict the same run with vllm-pool and classify every difference."""
        policy = make_policy(self.policy.name, dict(self.policy.params))
        pool = VllmPoolEngine(header=self.header, hashes=self.hashes, capacity=self.capacity,
                              policy=policy, contracts=self.contracts, done_ids=frozenset(),
                              cost=self.cost, label=self.label, trace_path=self.trace_path)
        predicted = {o.id: o for o in pool.run(iter(events)).requests}
        differences = []
        num_equal = num_comparable = num_comparable_equal = 0
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
            if preemptions.get(o.id):
                cls = "preempted"
            elif output_hits.get(o.id):
                cls = "output_block_hit"
            elif p is None or (p.state in (REJECTED, DROPPED)) != (o.state in (REJECTED, DROPPED)):
                cls = "state"
            else:
                cls = "timing"
            differences.append({"id": o.id, "observed_cached_tokens": o.cached_tokens,
                                "predicted_cached_tokens": p.cached_tokens if p else None,
                                "observed_state": o.state,
                                "predicted_state": p.state if p else None, "class": cls})
        by_class = {c: sum(1 for d in differences if d["class"] == c)
                    for c in DIFFERENCE_CLASSES}
        return {"predicted_by": "vllm-pool", "num_requests": len(result.requests),
                "num_equal": num_equal, "num_comparable": num_comparable,
                "num_comparable_equal": num_comparable_equal,
                "comparable_equal_fraction": (round(num_comparable_equal / num_comparable, 6)
                                              if num_comparable else None),
                "differences_by_class": by_class, "differences": differences,
                "preempted_ids": sorted(i for i, n in preemptions.items() if n)}

