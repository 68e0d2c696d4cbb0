"""sim's service model: psgate's original replay model, on the block pool of
:mod:`psgate.engines.pool` and the bookkeeping of :mod:`psgate.engines.base`.

Replay model (a documented simplification of vLLM's scheduler; ``--scheduler step``,
:mod:`psgate.engines.sched`, is vLLM's own): a request holds
``ceil((prompt + out) / block_size)`` blocks from admission until it completes
or is cancelled, allocated in one batch; its new full prompt blocks become
cached at admission. At equal times releases come before arrivals. Admission
is FIFO and head-of-line blocking; a request that cannot fit even into an empty
cache is rejected. Prefill runs FIFO on one server whose time comes from the
cost model.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterable

from psgate.engines import pool_work
from psgate.engines.base import (NS_PER_MS, NullRecorder, PolicyFault, ReplayEngine,
                                 RequestState, policy_fault)
from psgate.engines.results import CANCELLED, COMPLETED, DROPPED, UNFINISHED, RunResult
from psgate.errors import InputError
from psgate.trace.keys import KEY_SHIFT
from psgate.trace.model import CancelEvent, DoneEvent, RequestEvent

__all__ = ["NS_PER_MS", "NullRecorder", "PolicyFault", "RequestState", "SimEngine"]

_WAITING, _RUNNING = 1, 2


class SimEngine(ReplayEngine):
    """Replays one trace under one policy with the service model."""

    name = "sim"
    scheduler = "service"

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.heap: list[tuple[int, int, RequestState]] = []
        self.line: deque[RequestState] = deque()        # capacity waits: head-of-line blocking
        self.group_lines: dict[int, deque[RequestState]] = {}   # quota waits: per group
        self.server_free_ns = 0

    def run(self, events: Iterable[RequestEvent | CancelEvent | DoneEvent]) -> RunResult:
        try:
            for ev in events:
                if self.start_ns is None:
                    self.start_ns = ev.t_ns
                    self.now = ev.t_ns
                    self.server_free_ns = ev.t_ns
                self._advance(ev.t_ns)
                if type(ev) is RequestEvent:
                    self.arrive(ev)
                elif type(ev) is CancelEvent:
                    self.cancel(ev)
                else:
                    self._done(ev)
                if self.progress is not None:
                    self.progress(ev.line)
            self._drain()
        except PolicyFault as exc:
            self.aborted = str(exc)
        except Exception as exc:
            self.aborted = policy_fault(self.policy, exc)
            if self.aborted is None:
                raise
        return self.result()

    def _advance(self, t: int, move_clock: bool = True) -> None:
        """Process every release due at or before t, then retry waiting requests."""
        heap = self.heap
        while heap and heap[0][0] <= t:
            tc = heap[0][0]
            self.now = tc
            while heap and heap[0][0] == tc:
                _, _, r = heapq.heappop(heap)
                if r.state == _RUNNING and r.release_ns == tc:
                    self.release(r, COMPLETED)
            self._admit_waiting()
        if move_clock and t > self.now:
            self.now = t

    def _drain(self) -> None:
        self._advance(1 << 62, move_clock=False)
        # Requests still waiting for a done event that never came (partial traces)
        # release at the end, in admission order, letting anyone still waiting in.
        while True:
            running = sorted((r for r in self.reqs.values()
                              if type(r) is RequestState and r.state == _RUNNING),
                             key=lambda r: r.seq)
            if not running:
                break
            for r in running:
                self.release(r, UNFINISHED)
            self._admit_waiting()
            self._advance(1 << 62, move_clock=False)
        for r in list(self.line) + [r for q in self.group_lines.values() for r in q]:
            # Unreachable in a consistent pool: an empty cache fits any non-rejected request.
            r.outcome.state = UNFINISHED
            self.finalize(r)

    def arrive(self, ev: RequestEvent) -> None:
        if ev.contract not in self.contracts:
            raise InputError(f"unknown contract '{ev.contract}'; the replay's contract table "
                             f"has {', '.join(sorted(self.contracts))}",
                             path=self.trace_path, line=ev.line, field="contract")
        r = self.request_state(ev, ev.out, RequestState, ev.id in self.done_ids)
        if not self.accepted(r):
            return
        r.state = _WAITING
        g = r.gid
        if self.line:
            self._wait(r, self.line)
            return
        status = self.try_admit(r)
        if status == "quota":
            self._wait(r, self.group_lines.setdefault(g, deque()))
        elif status == "nofit":
            self._wait(r, self.line)

    def _wait(self, r: RequestState, line: deque) -> None:
        line.append(r)
        if r.wait_start_ns < 0:
            r.wait_start_ns = self.now
            r.outcome.waited = True
            self.counts["waits"] += 1

    def _admit_waiting(self) -> None:
        line = self.line
        while line:
            status = self.try_admit(line[0])
            if status == "ok":
                line.popleft()
            elif status == "quota":
                r = line.popleft()
                self.group_lines.setdefault(r.gid, deque()).append(r)
            else:
                break
        for q in self.group_lines.values():
            while q:
                status = self.try_admit(q[0])
                if status != "ok":
                    break
                q.popleft()

    def try_admit(self, r: RequestState) -> str:
        ev = r.ev
        bs = self.bs
        ns = r.ns
        max_hits = min((ev.prompt_tokens - 1) // bs, len(ev.blocks))
        evb = ev.blocks
        hits, evictable_hits = pool_work.lookup(self, evb, ns, max_hits)
        num_hits = len(hits)
        num_new = r.num_total - num_hits
        preq = r.preq
        num_full = len(ev.blocks)
        preq.num_new_full_blocks = num_full - num_hits
        if not self.policy.admission_allowed(preq, num_new, evictable_hits):
            return "quota"
        if num_new > len(self.free) + self.policy.num_candidates - evictable_hits:
            return "nofit"

        # -- admit: one allocation batch -----------------------------------------
        now = self.now
        policy = self.policy
        policy.on_admit(preq, now)
        self.touch(r, hits)
        new = self.get_new_blocks(r, num_new)
        blocks = hits + new
        r.blocks = blocks
        cached_now: list[tuple[int, int]] = []
        recompute = pool_work.cache_blocks(self, blocks, evb, num_hits, num_full, ns, bs,
                                           cached_now, self.on_cached_fn, preq)
        note = policy.end_admit(preq, now)
        self.admitted(r, hits, new, cached_now, max_hits, recompute, note)
        return "ok"

    def admitted(self, r: RequestState, hits: list[int], new: list[int],
                  cached_now: list[tuple[int, int]], max_hits: int, recompute: int,
                  note: dict | None) -> None:
        """The pool has given r its blocks: start its prefill on the server, schedule
        its release and record the admission. Shared by every block pool."""
        ev = r.ev
        preq = r.preq
        bs = self.bs
        now = self.now
        rec = self.recorder
        num_hits = len(hits)
        num_full = len(ev.blocks)
        r.state = _RUNNING
        r.admit_ns = now
        r.seq = self.seq
        self.seq += 1
        cached_tokens = num_hits * bs
        o = r.outcome
        o.cached_tokens = cached_tokens
        o.new_blocks = num_full - num_hits
        o.recompute_tokens = recompute
        self.counts["admitted"] += 1
        self.counts["hit_blocks"] += num_hits
        self.counts["new_blocks"] += num_full - num_hits
        prefill_ms = self.cost.prefill_ms(ev.prompt_tokens - cached_tokens, cached_tokens)
        start = max(now, self.server_free_ns)
        first = start + round(prefill_ms * NS_PER_MS)
        self.server_free_ns = first
        r.first_token_ns = first
        o.prefill_ms = prefill_ms
        o.ttft_ms = (first - ev.t_ns) / NS_PER_MS
        o.queue_ms = (start - ev.t_ns) / NS_PER_MS
        if r.wait_start_ns >= 0:
            o.wait_ms = (now - r.wait_start_ns) / NS_PER_MS
        if r.done_ns is not None:
            self._schedule_done(r)
        elif not r.awaits_done:
            self._schedule(r, first + round(ev.out * self.cost.per_output_token_ms * NS_PER_MS))

        base = r.ns << KEY_SHIFT
        self.check_batch(r, [base | h for h in ev.blocks[:num_hits]], hits, max_hits, new,
                          cached_now, num_full - num_hits)
        if self.records:
            rec.admission(now, preq, num_hits, len(new), num_full - num_hits, note)
        if self.records_hits:
            self.record_hits(r, hits)

    def _schedule(self, r: RequestState, release_ns: int) -> None:
        # Always through the heap, even when due now: releasing from inside an
        # admission would re-enter the waiting line.
        release_ns = max(release_ns, self.now)
        r.release_ns = release_ns
        heapq.heappush(self.heap, (release_ns, r.seq, r))

    def _schedule_done(self, r: RequestState) -> None:
        """Hold for done - t from admission, never releasing before the first token."""
        release = max(r.admit_ns + (r.done_ns - r.ev.t_ns), r.first_token_ns)
        if release != r.done_ns:
            self.counts["done_shifted"] += 1
        self._schedule(r, release)

    def release(self, r: RequestState, state: str) -> None:
        self.free_blocks(r)
        self.request_released(r, state)

    def request_released(self, r: RequestState, state: str) -> None:
        """r's blocks went back to the pool: check it and finish r's outcome."""
        where = self.where_fn(r)
        self.checker.released(where, r.blocks)
        self.checker.check_accounting(where, len(self.free), self.policy.num_candidates,
                                      self, self.policy)
        r.state = 0
        r.outcome.state = state
        r.outcome.release_ns = self.now
        if state == CANCELLED and self.now < r.first_token_ns:
            r.outcome.ttft_ms = None
        if state == UNFINISHED:
            self.counts["unfinished"] += 1
        del self.reqs[r.ev.id]        # a finished request's id is forgotten: its later
        self.finalize(r)             # cancel or done counts as late all the same

    def cancel(self, ev: CancelEvent) -> None:
        r = self.reqs.get(ev.id)
        if type(r) is not RequestState:
            self.counts["late_cancels"] += 1
            return
        if r.state == _WAITING:
            for line in (self.line, self.group_lines.get(r.gid)):
                if line is not None and r in line:
                    line.remove(r)
            r.state = 0
            r.outcome.state = DROPPED
            self.counts["dropped"] += 1
            del self.reqs[ev.id]
            self.finalize(r)
            self._admit_waiting()
        else:
            self.counts["cancelled"] += 1
            self.release(r, CANCELLED)
            self._admit_waiting()

    def _done(self, ev: DoneEvent) -> None:
        r = self.reqs.get(ev.id)
        if type(r) is not RequestState:
            self.counts["late_dones"] += 1
            return
        r.done_ns = ev.t_ns
        if r.state == _RUNNING:
            self._schedule_done(r)
            self._advance(self.now)
