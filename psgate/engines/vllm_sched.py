"""vllm-sched: vLLM 0.32's own Scheduler and KVCacheManager on the modeled step clock.

``vllm-pool`` runs vLLM's block pool under psgate's service model; this engine runs vLLM's
scheduler itself, with no model: each step is one ``Scheduler.schedule()``, a duration
from the step cost model (:mod:`psgate.engines.step_cost`) and one
``Scheduler.update_from_output()`` with a made-up sampled token for every request whose
computed tokens reach its length. Everything the scheduler decides is vLLM's code:
which waiting request is admitted and when (its prefix lookup happens when it is first
scheduled, ``scheduler.py:960-967``, not at arrival), chunked prefill under the token
budget (``scheduler.py:1155-1169``), output blocks allocated one decode at a time and cached
once full (``kv_cache_manager.py:612-616``), the watermark (``kv_cache_manager.py:208,
512-517``) and preemption of the last running request when a running request cannot get a
block (``scheduler.py:776-843``; no waiting request is admitted in a step that preempted,
``scheduler.py:900``). The psgate policy is the pool's free-block queue, installed and
told vLLM's events in vLLM's order by :class:`~psgate.engines.vllm_live.LivePolicy`.

This is the reference the step replay protocol describes; psgate's own step scheduler
(``sim --scheduler step``) reimplements it fast, and the conformance suite compares the two
per request and per eviction. Token ids are those of ``vllm-pool`` (same trace hash, same
tokens; ``cache_salt`` the request's namespace); a sampled token is a pseudo-random id
derived from the request id and its output index, so output blocks never match another
request's while a preempted request re-hits its own when it resumes.
"""

from __future__ import annotations

import logging

from psgate.engines.results import CANCELLED, COMPLETED, DROPPED, UNFINISHED, RunResult
from psgate.engines.base import PolicyFault, ReplayEngine, RequestState, policy_fault
from psgate.engines.kv_groups import (FULL, KVGroup, admission_caps, blocks_to_hold,
                                      check_retention)
from psgate.engines.step_cost import SchedulerParams, StepCostModel
from psgate.engines.step_work import StepTally, recomputed_tokens
from psgate.engines.vllm_live import LivePolicy
from psgate.engines.vllm_pool import (RefView, block_tokens, namespace_salt,
                                      prompt_token_ids, tokens_for, vllm_version)
from psgate.errors import InputError
from psgate.invariants.checker import NO_KEY, InvariantChecker
from psgate.policy import Decision, PolicyRequest, PoolInfo
from psgate.trace.keys import HASH_MASK, KEY_SHIFT, OUTPUT_KEY_BIT, chain_key
from psgate.trace.model import CancelEvent, RequestEvent

NS_PER_MS = 1_000_000
_WAITING, _RUNNING = 1, 2


def sampled_token(ev: RequestEvent, index: int, block_size: int, names: list[str],
                  cache: dict[int, list[int]]) -> int:
    """The id a request samples as its ``index``-th output token (deterministic): inside
    a block its answer names, that block's token (the tokens a later turn re-sends for
    it, so vLLM's hash of the cached block equals the one the later turn looks up);
    elsewhere a pseudo-random id of the request and the index."""
    pos = ev.prompt_tokens + index
    j = pos // block_size - len(ev.blocks)
    if ev.answer is not None and j < len(ev.answer):
        return block_tokens(ev.answer[j], names, block_size, cache)[pos % block_size]
    return tokens_for(f"out\x00{ev.id}\x00{index}", 1)[0]


def build_scheduler(num_blocks: int, block_size: int, sched: SchedulerParams,
                    max_model_len: int):
    """vLLM's Scheduler with no model: the bundled tiny Qwen2 config for ModelConfig (only
    its shape is read), prefix caching on, FCFS, synchronous scheduling, and a pool of
    ``num_blocks`` blocks for one full-attention KV cache group, or for the groups of
    ``sched.kv_groups`` (vLLM's hybrid coordinator then runs)."""
    import torch
    from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig,
                                            KVCacheGroupSpec, SlidingWindowSpec)
    from vllm.v1.structured_output import StructuredOutputManager

    from psgate.engines.vllm_real import default_model_config

    def spec(group: KVGroup):
        shape = dict(block_size=block_size, num_kv_heads=1, head_size=1, dtype=torch.float32)
        if group.kind == FULL:
            return FullAttentionSpec(**shape)
        return SlidingWindowSpec(**shape, sliding_window=group.window)

    quiet = logging.getLogger("vllm")
    level = quiet.level
    quiet.setLevel(logging.ERROR)     # config advice (CPU block sizes) is not for a replay
    try:
        model = ModelConfig(model=str(default_model_config()), skip_tokenizer_init=True,
                            max_model_len=max_model_len,
                            hf_overrides={"max_position_embeddings": max_model_len})
        scheduler = SchedulerConfig(
            max_num_batched_tokens=sched.max_num_batched_tokens,
            max_num_seqs=sched.max_num_seqs, max_model_len=max_model_len,
            is_encoder_decoder=False, enable_chunked_prefill=sched.enable_chunked_prefill,
            long_prefill_token_threshold=sched.long_prefill_token_threshold,
            watermark=sched.watermark, policy="fcfs", async_scheduling=False)
        cache = CacheConfig(block_size=block_size, enable_prefix_caching=True)
        cache.num_gpu_blocks = num_blocks
        config = VllmConfig(model_config=model, scheduler_config=scheduler,
                            cache_config=cache)
        groups = sched.kv_groups or (KVGroup(FULL),)
        kv = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=[
            KVCacheGroupSpec([f"layer{i}"], spec(g)) for i, g in enumerate(groups)],
            prefix_cache_retention_interval=sched.prefix_cache_retention_interval)
        return Scheduler(config, kv, StructuredOutputManager(config), block_size=block_size)
    finally:
        quiet.setLevel(level)


class _StepPolicy(LivePolicy):
    """LivePolicy whose requests are the replay's own (the PolicyRequest sim would build,
    priority and arrival index included) and whose evictions the engine checks and counts
    before vLLM uses the block."""

    def __init__(self, engine: "VllmSchedEngine", mgr, policy, **kw) -> None:
        self.engine = engine
        super().__init__(mgr, policy, **kw)

    def preq(self, request) -> PolicyRequest:
        r = self.engine.reqs[request.request_id]
        self.gid_of(r.ev.group)
        self.preqs[r.ev.id] = r.preq
        return r.preq

    def evicting(self, d: Decision) -> None:
        self.engine.check_victim(d.victim)
        super().evicting(d)
        self.engine.evicted(d.victim)

    def released(self, block_ids: list[int]) -> None:
        super().released(block_ids)
        self.engine.released(block_ids)


class VllmSchedEngine(ReplayEngine):
    """Replays one trace through vLLM's Scheduler under one psgate policy."""

    name = "vllm-sched"

    def __init__(self, *, step_cost: StepCostModel | None = None,
                 sched: SchedulerParams | None = None, **kw) -> None:
        super().__init__(**kw)
        self.vllm_version = vllm_version(self.name)
        from vllm import SamplingParams
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
        from vllm.v1.outputs import ModelRunnerOutput
        from vllm.v1.request import Request, RequestStatus
        from vllm.utils.hashing import get_hash_fn_by_name
        self._Request, self._SamplingParams = Request, SamplingParams
        self._Output, self._Status = ModelRunnerOutput, RequestStatus
        self.step_cost = step_cost or StepCostModel()
        self.params = sched or SchedulerParams()
        p = self.params
        self.max_model_len = p.max_model_len(self.num_blocks, self.bs)
        self.caps = (admission_caps(p.kv_groups, self.bs, p.max_num_batched_tokens,
                                    self.max_model_len) if p.kv_groups else None)
        if p.kv_groups:
            check_retention(p.prefix_cache_retention_interval, self.bs)
        hash_fn = get_hash_fn_by_name("sha256")
        init_none_hash(hash_fn)
        self._hasher = get_request_block_hasher(self.bs, hash_fn)
        try:
            self.sched = build_scheduler(self.num_blocks, self.bs, p, self.max_model_len)
        except ValueError as exc:        # vLLM's own check of the scheduler settings
            errors = exc.errors() if callable(getattr(exc, "errors", None)) else None
            why = ("; ".join(e.get("msg", "") for e in errors) if errors
                   else str(exc).splitlines()[0])
            raise InputError(f"vLLM refused the scheduler settings: {why}",
                             path="--engine vllm-sched") from None
        self.mgr = mgr = self.sched.kv_cache_manager
        self.pool = pool = mgr.block_pool
        # one KV cache group: the batch's checks take the single-table path
        self.one_group = len(mgr.coordinator.single_type_managers) == 1
        self.ref = RefView(pool.blocks)
        self.vreqs: dict[str, object] = {}
        self._cur: RequestState | None = None
        self._began = False
        self._hits: list[int] = []
        self._new: list[int] = []
        self._cached: list[tuple[int, int]] = []
        self._recompute = 0
        self.key_copies: dict[int, int] = {}     # content key -> blocks holding it
        self.lost: set[int] = set()              # trace content evicted with no copy left
        self._tokens: dict[int, list[int]] = {}
        self.counts["preemptions"] = 0
        self.counts["steps"] = 0
        # Set to a list before run() to keep one row per step (see step_trace).
        self.step_log: list[tuple] | None = None
        # As sim's step scheduler builds it: a block of generated tokens has no parent.
        self.checker = InvariantChecker(self.num_blocks, self._parent_key,
                                        paranoid=self.paranoid, parent_table=self.hashes.parent,
                                        key_shift=KEY_SHIFT, opaque_keys_from=OUTPUT_KEY_BIT)
        self._wrap_pool(pool)
        try:
            self.live = _StepPolicy(
                self, mgr, self.policy, clock_ns=lambda: self.now, recorder=self.recorder,
                key_of=self._key_of, name_of=self._name_of, future_known=True,
                pool_info=PoolInfo(num_blocks=self.num_blocks, num_usable=self.num_usable,
                                   block_size=self.bs, groups=tuple(kw.get("groups", ())),
                                   key_shift=KEY_SHIFT))
        except ValueError as exc:        # a policy vLLM's scheduler cannot run
            raise InputError(str(exc), path=f"--{self.label}"
                             if self.label in ("baseline", "candidate") else "--engine") from None
        self.queue = self.live.queue
        self.free = self.queue.free        # the truly free blocks, as sim names them
        self._wrap_manager(mgr)
        # request id -> the tokens it had computed when vLLM last preempted it, until it
        # is scheduled again (its resumed lookup says how many it computes anew)
        self.lost_tokens: dict[str, int] = {}
        preempt = self.sched._preempt_request

        def preempt_request(request, *args, **kwargs):
            self.lost_tokens[request.request_id] = request.num_computed_tokens
            return preempt(request, *args, **kwargs)

        self.sched._preempt_request = preempt_request

    def blocks_to_hold(self, num_tokens: int) -> int:
        if self.caps is None:
            return super().blocks_to_hold(num_tokens)
        return blocks_to_hold(self.caps, self.bs, num_tokens)

    # -- content keys and names (the protocol's) ------------------------------------
    def _key_of(self, rid: str, pos: int, block=None) -> int:
        """The content a cached block holds: set by the pool's ``cache_full_blocks``
        (below the policy's wrapper, which asks after it), which knows the block's group."""
        return self.key[block.block_id]

    def _chain_key(self, rid: str, pos: int, group: int = 0) -> int:
        """What position ``pos`` of request ``rid`` holds in KV-cache group ``group``, from
        the trace alone (what the checker holds a hit to)."""
        r = self.reqs[rid]
        return chain_key(r.chain, r.ns, r.preq.index, pos, group)

    def _name_of(self, rid: str, pos: int, block=None) -> str:
        chain = self.reqs[rid].chain
        return self.hashes.names[chain[pos]] if pos < len(chain) else ""

    def _parent_key(self, k: int) -> int:
        """A trace block's parent in its namespace; none for a block of generated tokens."""
        if k >= OUTPUT_KEY_BIT:
            return NO_KEY
        p = self.hashes.parent[k & HASH_MASK]
        return NO_KEY if p < 0 else ((k >> KEY_SHIFT) << KEY_SHIFT) | p

    # -- vLLM hooks ---------------------------------------------------------------------
    def _wrap_pool(self, pool) -> None:
        """Observe the pool below LivePolicy's wrappers: what each allocation batch hit,
        took and cached, for the invariant checker and the occupancy."""
        touch, get_new, cache_full = pool.touch, pool.get_new_blocks, pool.cache_full_blocks
        free_blocks = pool.free_blocks
        from vllm.v1.core.kv_cache_utils import get_group_id

        def touched(blocks) -> None:
            touch(blocks)
            self._began = True
            bs = self.bs
            # (group, position, block) of each hit: the group from the block's cache key,
            # the position from the tokens it covers (a sliding group skips the first ones)
            self._hits.extend((get_group_id(b.block_hash), b.block_hash_num_tokens // bs - 1,
                               b.block_id) for b in blocks if not b.is_null)

        def got_new(n: int):
            self._began = True
            out = get_new(n)
            r = self._cur
            ids = [b.block_id for b in out]
            for b in ids:
                self.owner[b] = r.gid
            self.occ_add(r.gid, len(ids))
            self._new.extend(ids)
            return out

        def cached(request, blocks, num_cached_blocks, num_full_blocks, *args, **kwargs):
            cache_full(request, blocks, num_cached_blocks, num_full_blocks, *args, **kwargs)
            self._began = True
            rid = request.request_id
            group = kwargs.get("kv_cache_group_id", args[1] if len(args) > 1 else 0)
            for pos in range(num_cached_blocks, num_full_blocks):
                blk = blocks[pos]
                if blk.is_null or blk.block_hash is None:
                    continue
                k = self._chain_key(rid, pos, group)
                self.key[blk.block_id] = k
                self._cached.append((group, blk.block_id, k))
                self.key_copies[k] = self.key_copies.get(k, 0) + 1
                if k in self.lost:
                    self.lost.discard(k)
                    if group == 0:      # trace content computed again counts once
                        self._recompute += self.bs

        def freed(ordered_blocks) -> None:
            """Every block a request lets go of (at its end, a preemption, or a sliding
            window moving on), for the checker's reference counts."""
            blocks = list(ordered_blocks)
            free_blocks(blocks)
            r = self._cur
            where = self.where_fn(r) if r is not None else self.trace_path
            self.checker.released(where, [b.block_id for b in blocks if not b.is_null])

        pool.touch, pool.get_new_blocks, pool.cache_full_blocks = touched, got_new, cached
        pool.free_blocks = freed

    def _wrap_manager(self, mgr) -> None:
        """Around LivePolicy's wrappers: one checker event per allocation batch and per
        release, after vLLM and the policy are done with it."""
        allocate, free = mgr.allocate_slots, mgr.free

        def allocate_slots(request, *args, **kwargs):
            r = self.reqs[request.request_id]
            self._cur, self._began = r, False
            self._hits, self._new, self._cached = [], [], []
            self._recompute = 0
            try:
                out = allocate(request, *args, **kwargs)
            finally:
                self._cur = None
            if out is not None and self._began:
                self._batch_done(r, request)
            return out

        def free_request(request):
            rid = request.request_id
            free(request)       # the checker is told by the pool's free_blocks
            r = self.reqs.get(rid)
            where = self.where_fn(r) if r is not None else rid
            self.checker.check_accounting(where, len(self.free), self.policy.num_candidates,
                                          self, self.policy)

        mgr.allocate_slots, mgr.free = allocate_slots, free_request

    def _batch_done(self, r: RequestState, request) -> None:
        if r.seq < 0:        # its first scheduling: trace content it must compute again
            r.outcome.recompute_tokens += self._recompute
        max_hits = (request.num_tokens - 1) // self.bs
        if self.one_group:
            self.check_batch(r, [self._chain_key(r.ev.id, i) for i in range(len(self._hits))],
                             [b for _, _, b in self._hits], max_hits, self._new,
                             [(b, k) for _, b, k in self._cached], r.preq.num_new_full_blocks)
            return
        # a hybrid model: group by group, each group's hits held to its own content
        parts = []
        for g in range(len(self.params.kv_groups)):
            hits = [(pos, b) for hg, pos, b in self._hits if hg == g]
            parts.append(([self._chain_key(r.ev.id, pos, g) for pos, _ in hits],
                          [b for _, b in hits], [(b, k) for cg, b, k in self._cached if cg == g]))
        keys, hits, cached_now = parts[0]
        self.check_batch(r, keys, hits, max_hits, self._new, cached_now,
                         r.preq.num_new_full_blocks, tuple(parts[1:]))

    def check_victim(self, v: int) -> None:
        """The policy chose v: a cached block no request holds, or the run stops here
        (before vLLM would hand a pinned block to a second request)."""
        r = self._cur
        where = self.where_fn(r) if r is not None else self.trace_path
        self.checker.evicted(where, v)
        blk = self.pool.blocks[v] if 0 < v < self.num_blocks else None
        if blk is None or blk.ref_cnt != 0 or blk.block_hash is None or self.key[v] == NO_KEY:
            raise PolicyFault(f"{where() if callable(where) else where}: policy "
                              f"'{self.policy.name}' chose block {v}, which is not an "
                              f"eviction candidate (pinned or holding no content)")

    def evicted(self, v: int) -> None:
        k = self.key[v]
        n = self.key_copies.pop(k) - 1
        if n:
            self.key_copies[k] = n
        elif k < OUTPUT_KEY_BIT:
            self.lost.add(k)
        og = self.owner[v]
        self.key[v] = NO_KEY
        self.owner[v] = -1
        self.occ_add(og, -1)
        if self._cur is not None:
            self.evict_matrix[self._cur.gid][og] += 1
        self.num_evictions += 1

    def released(self, block_ids: list[int]) -> None:
        owner = self.owner
        for b in block_ids:
            self.occ_add(owner[b], -1)
            owner[b] = -1

    # -- the replay -------------------------------------------------------------------
    def run(self, events) -> RunResult:
        it = iter(events)
        pending = next(it, None)
        if pending is not None:
            self.start_ns = self.now = pending.t_ns
        try:
            while True:
                while pending is not None and pending.t_ns <= self.now:
                    self.deliver(pending)
                    pending = next(it, None)
                if self.sched.get_num_unfinished_requests() == 0 or not self._step():
                    if pending is None:
                        break
                    # Idle, or nothing can be scheduled until an event changes that.
                    self.now = max(self.now, pending.t_ns)
        except PolicyFault as exc:
            self.aborted = str(exc)
        except Exception as exc:
            self.aborted = policy_fault(self.policy, exc)
            if self.aborted is None:
                raise
        self._unfinished()
        return self.result()

    def arrive(self, ev: RequestEvent) -> None:
        num_out = max(1, ev.out)
        r = self.request_state(ev, num_out)
        r.first_token_ns = -1
        r.wait_start_ns = self.counts["steps"]     # steps run before it arrived
        if not self.accepted(r, too_long=not self.params.enable_chunked_prefill
                              and ev.prompt_tokens + num_out > self.max_model_len):
            return
        r.state = _WAITING
        tokens = prompt_token_ids(ev, self.hashes.names, self.bs, self._tokens)
        vreq = self._Request(ev.id, tokens,
                             self._SamplingParams(max_tokens=num_out, ignore_eos=True), None,
                             arrival_time=ev.t_ns / 1e9,
                             cache_salt=namespace_salt(ev.group, ev.scope),
                             block_hasher=self._hasher)
        self.vreqs[ev.id] = vreq
        self.sched.add_request(vreq)

    def cancel(self, ev: CancelEvent) -> None:
        r = self.reqs.get(ev.id)
        if r is None:
            self.counts["late_cancels"] += 1
            return
        scheduled = r.seq >= 0
        # vLLM's abort (scheduler.py:2649): out of its queue, blocks freed in vLLM's order;
        # a request never scheduled was never looked up and holds nothing.
        self.sched.finish_requests([ev.id], self._Status.FINISHED_ABORTED)
        if scheduled:
            self.counts["cancelled"] += 1
            self._done(r, CANCELLED)
        else:
            self.counts["dropped"] += 1
            self._done(r, DROPPED)

    def _step(self) -> bool:
        """One scheduler step; False when vLLM neither scheduled nor preempted anything
        (no model pass runs, and only an event can change that)."""
        start = self.now
        so = self.sched.schedule()
        scheduled = so.num_scheduled_tokens
        for rid in so.preempted_req_ids:
            self.counts["preemptions"] += 1
            self.reqs[rid].outcome.preemptions += 1
        if not scheduled:                  # no forward pass: the clock stays
            return bool(so.preempted_req_ids)
        requests = self.sched.requests
        tally = StepTally()
        bs = self.bs
        for rid, n in scheduled.items():
            vreq = requests[rid]
            before = vreq.num_computed_tokens - n     # schedule() already advanced it
            tally.add(n, before, vreq.num_tokens, vreq.num_output_tokens)
            r = self.reqs[rid]
            lost = self.lost_tokens.pop(rid, None)
            if lost is not None:        # resumed: what it computes again
                r.outcome.preempt_recompute_tokens += recomputed_tokens(lost, before)
            if r.seq < 0:                # first scheduled: its lookup happened just now
                r.seq = self.seq
                self.seq += 1
                r.admit_ns = start
                r.state = _RUNNING
                num_hits = before // bs
                o = r.outcome
                o.cached_tokens = before
                o.new_blocks = len(r.ev.blocks) - num_hits
                o.queue_ms = (start - r.ev.t_ns) / NS_PER_MS
                if self.counts["steps"] > r.wait_start_ns:    # not the first step it could
                    o.waited = True
                    o.wait_ms = o.queue_ms
                    self.counts["waits"] += 1
                self.counts["admitted"] += 1
                self.counts["hit_blocks"] += num_hits
                self.counts["new_blocks"] += len(r.ev.blocks) - num_hits
        self.counts["steps"] += 1
        work = tally.work()
        self.now = start + self.step_cost.step_ns(work)
        if self.step_log is not None:
            self.step_log.append((start, self.now, work, tuple(scheduled.items()),
                                  tuple(sorted(so.preempted_req_ids))))
        ids = list(scheduled)
        sampled = []
        for rid in ids:
            vreq = requests[rid]
            if vreq.num_computed_tokens >= vreq.num_tokens:
                r = self.reqs[rid]
                sampled.append([sampled_token(r.ev, vreq.num_output_tokens, self.bs,
                                              self.hashes.names, self._tokens)])
                if r.first_token_ns < 0:
                    r.first_token_ns = self.now
                    r.outcome.ttft_ms = (self.now - r.ev.t_ns) / NS_PER_MS
                    r.outcome.prefill_ms = (self.now - r.admit_ns) / NS_PER_MS
            else:
                sampled.append([])
        self.sched.update_from_output(so, self._Output(
            req_ids=ids, req_id_to_index={rid: i for i, rid in enumerate(ids)},
            sampled_token_ids=sampled))
        for rid in ids:
            if self.vreqs[rid].is_finished():
                self._done(self.reqs[rid], COMPLETED)
        return True

    def _done(self, r: RequestState, state: str) -> None:
        o = r.outcome
        o.state = state
        if state != DROPPED:
            o.release_ns = self.now
        o.preemptions = self.vreqs[r.ev.id].num_preemptions
        if r.first_token_ns < 0:
            o.ttft_ms = o.prefill_ms = None
        r.state = 0
        del self.reqs[r.ev.id]
        del self.vreqs[r.ev.id]
        self.finalize(r)

    def _unfinished(self) -> None:
        """Requests vLLM still holds when the replay stops (an abort, or requests it can
        never schedule): unfinished, their blocks left as they are."""
        for rid in sorted(self.reqs, key=lambda i: self.reqs[i].preq.index):
            self.counts["unfinished"] += 1
            self._done(self.reqs[rid], UNFINISHED)


def step_trace(engine: VllmSchedEngine) -> list[tuple]:
    """The steps of a run whose ``step_log`` was set to a list before ``run()``: (start ns,
    end ns, StepWork, ((request id, tokens scheduled), ...) in vLLM's order, ids preempted),
    for locating where two step engines first part."""
    if engine.step_log is None:
        raise ValueError("set engine.step_log = [] before run() to trace its steps")
    return list(engine.step_log)
