"""sim: psgate's own block pool and service model, reproducing vLLM v1's block pool.

Block pool (facts checked against vLLM 0.32's ``BlockPool``):
  - block 0 is the null block: N configured blocks give N-1 usable ones;
  - the free queue is [truly free blocks ... | cached candidates ...]: a freed
    request's uncached blocks are prepended (its last block frontmost), its
    cached ones appended (last block first); allocation pops from the front,
    so truly free blocks are used first and candidates are evicted in the
    policy's order (for ``lru``, exactly vLLM's queue order);
  - a hit takes a candidate out of the queue (``touch``); one hash may be held
    by several blocks (after a last-block recompute) and a lookup takes the
    earliest inserted; hits stop at ``prompt_tokens - 1`` tokens, in whole blocks.

Replay model (a documented simplification of vLLM's scheduler): a request holds
``ceil((prompt + out) / block_size)`` blocks from admission until it completes
or is cancelled, allocated in one batch; its new full prompt blocks become
cached at admission. At equal times releases come before arrivals. Admission
is FIFO and head-of-line blocking; a request that cannot fit even into an empty
cache is rejected. Prefill runs FIFO on one server whose time comes from the
cost model.

The per-block state is flat arrays (a few bytes a block), not objects.
"""

from __future__ import annotations

import heapq
from array import array
from collections import deque
from collections.abc import Iterable

from psgate.engines.cost import CostModel
from psgate.engines.results import (CANCELLED, COMPLETED, DROPPED, REJECTED, UNFINISHED,
                                    OutcomeSink, RequestOutcome, RunResult)
from psgate.errors import InputError
from psgate.invariants.checker import NO_KEY, InvariantChecker
from psgate.policies.base import EvictionPolicy, GroupIds, PolicyRequest, PoolInfo
from psgate.trace.keys import HASH_MASK, KEY_SHIFT, OUTPUT_KEY_BIT, content_key
from psgate.trace.model import CancelEvent, DoneEvent, RequestEvent, TraceHeader
from psgate.trace.reader import HashTable

NS_PER_MS = 1_000_000
_WAITING, _RUNNING = 1, 2


class RequestState:
    """A request from arrival until its blocks are released (engines built on sim share it:
    slots, as thousands may wait at once)."""

    __slots__ = ("ev", "preq", "gid", "ns", "state", "blocks", "num_total", "admit_ns",
                 "first_token_ns", "release_ns", "seq", "done_ns", "awaits_done", "outcome",
                 "wait_start_ns")

    def __init__(self, ev: RequestEvent, preq: PolicyRequest, gid: int, num_total: int,
                 outcome: RequestOutcome, awaits_done: bool):
        self.ev = ev
        self.preq = preq
        self.gid = gid
        self.ns = preq.namespace
        self.state = 0
        self.blocks: list[int] = []
        self.num_total = num_total
        self.admit_ns = 0
        self.first_token_ns = 0
        self.release_ns = -1
        self.seq = -1
        self.done_ns = ev.done_ns
        self.awaits_done = awaits_done
        self.outcome = outcome
        self.wait_start_ns = -1


class PolicyFault(Exception):
    """The policy chose a block that is not a candidate; the run cannot go on."""


class NullRecorder:
    """Receives ledger events; the receipt layer supplies a real one. A recorder may
    also have ``eviction_batch(now_ns, req, decisions, blocks, hash_names, owners)``, taking
    one allocation's eviction rows in one call, after the policy evicted them all; one
    that looks at the pool or the policy when called sets ``sequential = True``."""

    def eviction(self, now_ns, req, decision, block, hash_name, owner) -> None:
        pass

    def admission(self, now_ns, req, hits, allocated, new_blocks, note) -> None:
        pass

    def hit(self, now_ns, req, pos, block, hash_name, owner) -> None:
        pass


class SimEngine:
    """Replays one trace under one policy; ``run()`` returns a :class:`RunResult`."""

    name = "sim"

    def __init__(self, *, header: TraceHeader, hashes: HashTable, capacity: int,
                 policy: EvictionPolicy, contracts: Iterable[str], done_ids: frozenset[str],
                 cost: CostModel | None = None, recorder=None, paranoid: bool = False,
                 label: str = "run", trace_path: str = "trace", progress=None,
                 groups: tuple[str, ...] = (), max_in_flight: int = 1_000_000,
                 sink: OutcomeSink | None = None) -> None:
        if capacity < 2:
            raise InputError(f"expected at least 2 configured blocks (one is vLLM's null "
                             f"block), found {capacity}", path="--capacity")
        self.bs = header.block_size
        self.max_in_flight = max_in_flight
        self.num_in_flight = 0
        self.hashes = hashes
        self.num_blocks = capacity
        self.num_usable = capacity - 1
        self.policy = policy
        self.contracts = frozenset(contracts)
        self.done_ids = done_ids
        self.cost = cost or CostModel()
        self.recorder = recorder or NullRecorder()
        self.label = label
        self.trace_path = trace_path
        self.progress = progress

        n = capacity
        self.ref = array("i", [0]) * n
        self.key = array("q", [NO_KEY]) * n
        self.owner = array("i", [-1]) * n
        # Truly free blocks, a stack whose end is the front; block 0 (null) is never in it.
        self.free = array("i", range(n - 1, 0, -1))
        # Content key -> blocks holding it, earliest inserted first (a lookup takes that
        # one). A trace hash's slot belongs to the first namespace that caches it: its
        # earliest block, and whether its content was lost (evicted, no copy left). Later
        # copies, and keys of other namespaces, live in small dicts.
        self._grow_slots()

        self.ns_ids: dict[tuple[str, str], int] = {}
        self.groups = GroupIds()
        self.gids, self.group_names = self.groups.ids, self.groups.names
        self.occ: list[int] = []
        self.occ_max: list[int] = []
        self.occ_area: list[int] = []
        self.occ_t: list[int] = []
        self.evict_matrix: list[list[int]] = []
        self.more: dict[int, list[int]] = {}          # slot key -> later copies
        self.other: dict[int, list[int]] = {}         # other namespaces' key -> copies
        self.other_lost: set[int] = set()

        self.policy.bind(PoolInfo(num_blocks=n, num_usable=n - 1, block_size=self.bs,
                                  groups=tuple(groups), key_shift=KEY_SHIFT))
        parent = hashes.parent

        def parent_of(k: int) -> int:
            p = parent[k & HASH_MASK]
            return NO_KEY if p < 0 else ((k >> KEY_SHIFT) << KEY_SHIFT) | p

        self.checker = InvariantChecker(n, parent_of, paranoid=paranoid,
                                        parent_table=parent, key_shift=KEY_SHIFT)
        # Hooks a policy leaves at the base class's no-op are not called per block, and
        # a policy with its own evict_batch evicts a whole batch in one call.
        cls = type(policy)
        self._on_hit = None if cls.on_hit is EvictionPolicy.on_hit else policy.on_hit
        self._on_cached = None if cls.on_cached is EvictionPolicy.on_cached else policy.on_cached
        self._on_released = (None if cls.on_released is EvictionPolicy.on_released
                             else policy.on_released)
        # A recorder that reads the pool at each eviction (``sequential``) needs it as it
        # was just before that one: one select_victim/on_evict at a time then.
        self.batch_evictions = (cls.batches_evictions()
                                and not getattr(self.recorder, "sequential", False))
        # Decisions (the ranking fields of each eviction) are built only for a recorder
        # that writes them.
        self._records = type(self.recorder) is not NullRecorder
        self.auditors = policy.invariant_auditors()
        self.paranoid = paranoid

        self.now = 0
        self.start_ns: int | None = None
        self.heap: list[tuple[int, int, RequestState]] = []
        self.line: deque[RequestState] = deque()        # capacity waits: head-of-line blocking
        self.group_lines: dict[int, deque[RequestState]] = {}   # quota waits: per group
        self.reqs: dict[str, RequestState] = {}     # id -> request, while admitted or waiting
        self.server_free_ns = 0
        self.seq = 0
        self.outcomes: list[RequestOutcome] = []    # when no sink takes them
        self.sink = sink
        self.num_evictions = 0
        self.num_requests = 0
        self.counts = {"admitted": 0, "waits": 0, "rejected": 0, "dropped": 0, "cancelled": 0,
                       "late_cancels": 0, "late_dones": 0, "done_shifted": 0, "unfinished": 0,
                       "hit_blocks": 0, "new_blocks": 0}
        self.rejected_ids: list[str] = []
        self.aborted: str | None = None

    # -- helpers --------------------------------------------------------------
    def _gid(self, group: str) -> int:
        g = self.gids.get(group)
        if g is None:
            g = self.groups.add(group)
            self.occ.append(0)
            self.occ_max.append(0)
            self.occ_area.append(0)
            self.occ_t.append(self.now)
            for row in self.evict_matrix:
                row.append(0)
            self.evict_matrix.append([0] * (g + 1))
        return g

    def _occ_add(self, g: int, delta: int) -> None:
        now = self.now
        self.occ_area[g] += self.occ[g] * (now - self.occ_t[g])
        self.occ_t[g] = now
        v = self.occ[g] + delta
        self.occ[g] = v
        if v > self.occ_max[g]:
            self.occ_max[g] = v

    def _where(self, r: RequestState) -> str:
        return f"{self.trace_path}:{r.ev.line} (request {r.ev.id}, {self.label})"

    def _where_fn(self, r: RequestState):
        """_where(r), formatted only if a check fails."""
        return lambda: self._where(r)

    # -- the content index ---------------------------------------------------------
    def _grow_slots(self) -> None:
        """A slot for every trace hash (the table grows while the trace is read)."""
        have = len(getattr(self, "slot_ns", ()))
        more = len(self.hashes.names) - have
        if have == 0:
            self.slot_ns = array("i")
            self.slot_blk = array("i")
            self.slot_lost = bytearray()
        if more > 0:
            self.slot_ns.extend(array("i", [-1]) * more)
            self.slot_blk.extend(array("i", [-1]) * more)
            self.slot_lost.extend(bytes(more))

    def copies_of(self, ns: int, hid: int) -> list[int]:
        """Every block holding (ns, hid), earliest inserted first."""
        if self.slot_ns[hid] == ns:
            b = self.slot_blk[hid]
            return [] if b < 0 else [b] + self.more.get(content_key(ns, hid), [])
        return list(self.other.get(content_key(ns, hid), ()))

    def _index_add(self, k: int, b: int) -> bool:
        """Block b now holds content k; True when k had been lost (a recompute)."""
        h = k & HASH_MASK
        ns = k >> KEY_SHIFT
        o = self.slot_ns[h]
        if o < 0:
            self.slot_ns[h] = ns
            o = ns
        if o == ns:
            if self.slot_blk[h] < 0:
                self.slot_blk[h] = b
            else:
                self.more.setdefault(k, []).append(b)
            if self.slot_lost[h]:
                self.slot_lost[h] = 0
                return True
            return False
        self.other.setdefault(k, []).append(b)
        if k in self.other_lost:
            self.other_lost.discard(k)
            return True
        return False

    def _index_drop(self, k: int, b: int) -> None:
        """Block b no longer holds content k; with no copy left, k is lost."""
        h = k & HASH_MASK
        if self.slot_ns[h] == k >> KEY_SHIFT:
            later = self.more.get(k)
            if self.slot_blk[h] == b:
                if later:
                    self.slot_blk[h] = later.pop(0)
                else:
                    self.slot_blk[h] = -1
                    self.slot_lost[h] = 1
            else:
                later.remove(b)
            if later is not None and not later:
                del self.more[k]
            return
        copies = self.other[k]
        copies.remove(b)
        if not copies:
            del self.other[k]
            self.other_lost.add(k)

    def num_candidates(self) -> int:
        return self.policy.num_candidates

    # -- the replay -------------------------------------------------------------
    def run(self, events: Iterable[RequestEvent | CancelEvent | DoneEvent]) -> RunResult:
        try:
            for ev in events:
                if self.start_ns is None:
                    self.start_ns = ev.t_ns
                    self.now = ev.t_ns
                    self.server_free_ns = ev.t_ns
                self._advance(ev.t_ns)
                if type(ev) is RequestEvent:
                    self._arrive(ev)
                elif type(ev) is CancelEvent:
                    self._cancel(ev)
                else:
                    self._done(ev)
                if self.progress is not None:
                    self.progress(ev.line)
            self._drain()
        except PolicyFault as exc:
            self.aborted = str(exc)
        return self._result()

    def _advance(self, t: int, move_clock: bool = True) -> None:
        """Process every release due at or before t, then retry waiting requests."""
        heap = self.heap
        while heap and heap[0][0] <= t:
            tc = heap[0][0]
            self.now = tc
            while heap and heap[0][0] == tc:
                _, _, r = heapq.heappop(heap)
                if r.state == _RUNNING and r.release_ns == tc:
                    self._release(r, COMPLETED)
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
                self._release(r, UNFINISHED)
            self._admit_waiting()
            self._advance(1 << 62, move_clock=False)
        for r in list(self.line) + [r for q in self.group_lines.values() for r in q]:
            # Unreachable in a consistent pool: an empty cache fits any non-rejected request.
            r.outcome.state = UNFINISHED
            self._finalize(r)

    def _arrive(self, ev: RequestEvent) -> None:
        if ev.contract not in self.contracts:
            raise InputError(f"unknown contract '{ev.contract}'; the replay's contract table "
                             f"has {', '.join(sorted(self.contracts))}",
                             path=self.trace_path, line=ev.line, field="contract")
        r = self._request_state(ev, ev.out, RequestState, ev.id in self.done_ids)
        if not self._accepted(r):
            return
        r.state = _WAITING
        g = r.gid
        if self.line:
            self._wait(r, self.line)
            return
        status = self._try_admit(r)
        if status == "quota":
            self._wait(r, self.group_lines.setdefault(g, deque()))
        elif status == "nofit":
            self._wait(r, self.line)

    def _request_state(self, ev: RequestEvent, num_out: int, cls=RequestState,
                       awaits_done: bool = False) -> RequestState:
        """An arriving request as the engines track it: its contract checked, its group
        and namespace numbered on first sight, the policy's view of it (arrival index
        included) and its outcome, to be filled in."""
        if ev.contract not in self.contracts:
            raise InputError(f"unknown contract '{ev.contract}'; the replay's contract table "
                             f"has {', '.join(sorted(self.contracts))}",
                             path=self.trace_path, line=ev.line, field="contract")
        g = self._gid(ev.group)
        nskey = (ev.group, ev.scope)
        ns = self.ns_ids.get(nskey)
        if ns is None:
            ns = len(self.ns_ids)
            self.ns_ids[nskey] = ns
        preq = PolicyRequest(id=ev.id, group=ev.group, contract=ev.contract, scope=ev.scope,
                             namespace=ns, prefix=ev.prefix, t_ns=ev.t_ns,
                             prompt_tokens=ev.prompt_tokens, num_prompt_blocks=len(ev.blocks),
                             num_new_full_blocks=0, priority=ev.priority,
                             priority_until_ns=ev.priority_until_ns, index=self.num_requests)
        self.num_requests += 1
        if self.policy.wants_block_keys:
            base = ns << KEY_SHIFT
            preq.block_keys = [base | h for h in ev.blocks]
        outcome = RequestOutcome(id=ev.id, group=ev.group, contract=ev.contract, role=ev.role,
                                 measure=ev.measure, state=UNFINISHED, t_ns=ev.t_ns,
                                 prompt_tokens=ev.prompt_tokens)
        num_total = -(-(ev.prompt_tokens + num_out) // self.bs)
        return cls(ev, preq, g, num_total, outcome, awaits_done)

    def _accepted(self, r: RequestState, too_long: bool = False) -> bool:
        """Rejects r (False) when it cannot fit even into an empty cache (or the policy's
        cap for it), or ``too_long`` says the engine cannot take it; else r is in flight."""
        cap = self.policy.capacity_for(r.preq)
        if too_long or r.num_total > (self.num_usable if cap is None
                                      else min(cap, self.num_usable)):
            r.outcome.state = REJECTED
            self.counts["rejected"] += 1
            self.rejected_ids.append(r.ev.id)
            self._finalize(r)
            return False
        ev = r.ev
        self.reqs[ev.id] = r
        self.num_in_flight += 1
        if self.num_in_flight > self.max_in_flight:
            raise InputError(f"more than {self.max_in_flight} requests admitted or waiting at "
                             f"t={ev.t_ns / 1e9:g} s (the cap; raise it with --max-in-flight)",
                             path=self.trace_path, line=ev.line)
        return True

    def _wait(self, r: RequestState, line: deque) -> None:
        line.append(r)
        if r.wait_start_ns < 0:
            r.wait_start_ns = self.now
            r.outcome.waited = True
            self.counts["waits"] += 1

    def _admit_waiting(self) -> None:
        line = self.line
        while line:
            status = self._try_admit(line[0])
            if status == "ok":
                line.popleft()
            elif status == "quota":
                r = line.popleft()
                self.group_lines.setdefault(r.gid, deque()).append(r)
            else:
                break
        for q in self.group_lines.values():
            while q:
                status = self._try_admit(q[0])
                if status != "ok":
                    break
                q.popleft()

    def _try_admit(self, r: RequestState) -> str:
        ev = r.ev
        bs = self.bs
        ns = r.ns
        ref = self.ref
        max_hits = min((ev.prompt_tokens - 1) // bs, len(ev.blocks))
        hits: list[int] = []
        base = ns << KEY_SHIFT
        evb = ev.blocks
        if len(self.slot_ns) < len(self.hashes.names):
            self._grow_slots()
        slot_ns, slot_blk, other = self.slot_ns, self.slot_blk, self.other
        evictable_hits = 0
        for i in range(max_hits):
            h = evb[i]
            if slot_ns[h] == ns:                  # copies_of(ns, h)[0], inline
                b = slot_blk[h]
                if b < 0:
                    break
            else:
                v = other.get(base | h)
                if v is None:
                    break
                b = v[0]
            hits.append(b)
            if ref[b] == 0:
                evictable_hits += 1
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
        self._touch(r, hits)
        new = self._get_new_blocks(r, num_new)
        blocks = hits + new
        r.blocks = blocks
        key = self.key
        cached_now: list[tuple[int, int]] = []
        recompute = 0
        slot_lost = self.slot_lost
        index_add = self._index_add
        on_cached = self._on_cached
        for pos in range(num_hits, num_full):
            b = blocks[pos]
            h = evb[pos]
            k = base | h
            key[b] = k
            o = slot_ns[h]
            if o == ns and slot_blk[h] < 0 and not slot_lost[h]:    # _index_add, inline
                slot_blk[h] = b
            elif o < 0:
                slot_ns[h] = ns
                slot_blk[h] = b
            elif index_add(k, b):
                recompute += bs
            cached_now.append((b, k))
            if on_cached is not None:
                on_cached(b, preq, pos, blocks[pos - 1] if pos else -1, k)
        note = policy.end_admit(preq, now)
        self._admitted(r, hits, new, cached_now, max_hits, recompute, note)
        return "ok"

    def _touch(self, r: RequestState, hits: list[int]) -> None:
        """r takes its hits, as vLLM's ``touch``: a candidate leaves the policy's queue,
        every hit block gains a reference."""
        policy, ref = self.policy, self.ref
        preq = r.preq
        on_hit = self._on_hit
        for pos, b in enumerate(hits):
            if ref[b] == 0:
                policy.on_touch(b)
            ref[b] += 1
            if on_hit is not None:
                on_hit(b, preq, pos)

    def _deliver(self, ev) -> None:
        """One trace event to a step engine (its arrivals wait for a scheduler step; a done
        event decides nothing there, it only counts when its request is unknown)."""
        if type(ev) is RequestEvent:
            self._arrive(ev)
        elif type(ev) is CancelEvent:
            self._cancel(ev)
        elif ev.id not in self.reqs:
            self.counts["late_dones"] += 1
        if self.progress is not None:
            self.progress(ev.line)

    def _get_new_blocks(self, r: RequestState, num_new: int) -> list[int]:
        """``num_new`` blocks for r, as vLLM's ``get_new_blocks`` pops them
        (block_pool.py): truly free ones from the front first, then the policy's victims;
        each is pinned by r and charged to its group."""
        policy = self.policy
        preq = r.preq
        free = self.free
        take = min(num_new - policy.reclaim_first(preq, num_new), len(free))
        if take:                                  # the front of the stack is its end
            new = free[-take:].tolist()
            new.reverse()
            del free[-take:]
        else:
            new = []
        num_evict = num_new - take
        if num_evict:
            now = self.now
            if self.batch_evictions:
                decisions = [] if self._records else None
                victims = policy.evict_batch(preq, now, num_evict, decisions)
                self._evicted(r, victims, decisions, num_evict)
                new += victims
            else:
                for _ in range(num_evict):
                    d = policy.select_victim(preq, now)
                    self._evict(d, r)
                    new.append(d.victim)
        ref, owner = self.ref, self.owner
        g = r.gid
        for b in new:
            ref[b] = 1
            owner[b] = g
        policy.on_allocated(preq, new)
        self._occ_add(g, num_new)
        return new

    def _admitted(self, r: RequestState, hits: list[int], new: list[int],
                  cached_now: list[tuple[int, int]], max_hits: int, recompute: int,
                  note: dict | None) -> None:
        """The pool has given r its blocks: start its prefill on the server, schedule
        its release and record the admission. Shared by every block pool."""
        ev = r.ev
        preq = r.preq
        bs = self.bs
        now = self.now
        rec = self.recorder
        owner = self.owner
        names = self.hashes.names
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
        self._check_batch(r, [base | h for h in ev.blocks[:num_hits]], hits, max_hits, new,
                          cached_now, num_full - num_hits)
        if self._records:
            rec.admission(now, preq, num_hits, len(new), num_full - num_hits, note)
        if getattr(rec, "hits", False):
            for pos, b in enumerate(hits):
                rec.hit(now, preq, pos, b, names[ev.blocks[pos]], self.group_names[owner[b]])

    def _check_batch(self, r: RequestState, keys: list[int], hits: list[int], max_hits: int,
                      new: list[int], cached_now: list[tuple[int, int]],
                      num_new_full: int) -> None:
        """After one allocation batch of r (``keys``: the content its hits must hold): the
        hard invariants, then the policy's own auditors. Every engine on this pool."""
        where = self._where_fn(r)
        policy = self.policy
        self.checker.admitted(where, keys, hits, max_hits, new, cached_now)
        self.checker.check_accounting(where, len(self.free), policy.num_candidates, self,
                                      policy)
        if self.auditors:
            audit = policy.audit()
            ev = r.ev
            for auditor in self.auditors:
                auditor.admitted(where, ev.group, ev.contract, self.now / 1e9, num_new_full,
                                 audit)

    def _evicted(self, r: RequestState, victims: list[int], decisions: list | None,
                 num_asked: int) -> None:
        """The policy evicted ``victims`` in one batch (its ``evict_batch``): check each
        in order as _evict would, record it, and drop its content."""
        where = self._where_fn(r)
        num_valid = self.checker.evicted_many(where, victims)
        ref, key, owner = self.ref, self.key, self.owner
        slot_ns, slot_blk, slot_lost, more = self.slot_ns, self.slot_blk, self.slot_lost, self.more
        index_drop = self._index_drop
        names, gnames = self.hashes.names, self.group_names
        nb = self.num_blocks
        rec = self.recorder if decisions is not None else None
        batch_rec = getattr(rec, "eviction_batch", None)
        if batch_rec is not None:
            rec = None
            hash_names: list[str] = []
            owners: list[str] = []
        now, preq = self.now, r.preq
        row = self.evict_matrix[r.gid]
        num_by_owner: dict[int, int] = {}
        try:
            for i, v in enumerate(victims):
                k = key[v] if 0 < v < nb else NO_KEY
                if i >= num_valid or k == NO_KEY or ref[v] != 0:
                    if batch_rec is not None:       # the rows of the victims before it
                        batch_rec(now, preq, decisions[:i], victims[:i], hash_names, owners)
                    raise PolicyFault(f"{where()}: policy '{self.policy.name}' chose block "
                                      f"{v}, which is not an eviction candidate (pinned or "
                                      f"holding no content)")
                og = owner[v]
                if rec is not None:
                    rec.eviction(now, preq, decisions[i], v,
                                 names[k & HASH_MASK] if k < OUTPUT_KEY_BIT else "", gnames[og])
                elif batch_rec is not None:
                    hash_names.append(names[k & HASH_MASK] if k < OUTPUT_KEY_BIT else "")
                    owners.append(gnames[og])
                h = k & HASH_MASK                      # _drop_content, inline
                if (k < OUTPUT_KEY_BIT and slot_ns[h] == k >> KEY_SHIFT and slot_blk[h] == v
                        and (not more or k not in more)):
                    slot_blk[h] = -1
                    slot_lost[h] = 1
                else:
                    index_drop(k, v)
                key[v] = NO_KEY
                owner[v] = -1
                num_by_owner[og] = num_by_owner.get(og, 0) + 1
        finally:                  # what was evicted counts, even when the run aborts here
            for og, num in num_by_owner.items():
                self._occ_add(og, -num)
                row[og] += num
                self.num_evictions += num
        if batch_rec is not None:
            batch_rec(now, preq, decisions, victims, hash_names, owners)
        if len(victims) != num_asked:
            raise PolicyFault(f"{where()}: policy '{self.policy.name}' evicted "
                              f"{len(victims)} blocks where {num_asked} were asked for")

    def _evict(self, d, r: RequestState) -> None:
        v = d.victim
        k = self.key[v]
        where = self._where_fn(r)
        self.checker.evicted(where, v)
        if not (0 < v < self.num_blocks) or self.ref[v] != 0 or k == NO_KEY:
            raise PolicyFault(f"{where()}: policy '{self.policy.name}' chose block {v}, which "
                              f"is not an eviction candidate (pinned or holding no content)")
        og = self.owner[v]
        if self._records:
            self.recorder.eviction(self.now, r.preq, d, v,
                                   self.hashes.names[k & HASH_MASK] if k < OUTPUT_KEY_BIT else "",
                                   self.group_names[og])
        self._drop_content(v, k)
        self.key[v] = NO_KEY
        self.policy.on_evict(v)
        self._occ_add(og, -1)
        self.owner[v] = -1
        self.evict_matrix[r.gid][og] += 1
        self.num_evictions += 1

    def _drop_content(self, v: int, k: int) -> None:
        """Block v, holding content k, is being evicted: forget it in the lookup table;
        content with no copy left is lost (a later recompute is counted)."""
        self._index_drop(k, v)

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

    def _release(self, r: RequestState, state: str) -> None:
        self._free_blocks(r)
        self._released(r, state)

    def _free_blocks(self, r: RequestState) -> None:
        """r's blocks go back in vLLM's ``free`` order (block_pool.py:774-803): walked last
        first, uncached ones to the front of the free queue, cached ones to the policy."""
        ref, key, owner = self.ref, self.key, self.owner
        uncached: list[int] = []
        freed: list[int] = []
        for b in reversed(r.blocks):
            ref[b] -= 1
            if ref[b] == 0:
                (uncached if key[b] == NO_KEY else freed).append(b)
        self.free.extend(reversed(uncached))        # the front is the end
        if self._on_released is not None:
            self._on_released(uncached)
        if uncached:
            num_by_owner: dict[int, int] = {}
            for b in uncached:
                og = owner[b]
                num_by_owner[og] = num_by_owner.get(og, 0) + 1
                owner[b] = -1
            for og, num in num_by_owner.items():
                self._occ_add(og, -num)
        self.policy.on_free(freed, self.now)

    def _released(self, r: RequestState, state: str) -> None:
        """r's blocks went back to the pool: check it and finish r's outcome."""
        where = self._where_fn(r)
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
        self._finalize(r)             # cancel or done counts as late all the same

    def _finalize(self, r: RequestState) -> None:
        if r.outcome.state != REJECTED:
            self.num_in_flight -= 1
        if self.sink is None:
            self.outcomes.append(r.outcome)
        else:
            self.sink.add(r.outcome, r.preq.index)

    def _cancel(self, ev: CancelEvent) -> None:
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
            self._finalize(r)
            self._admit_waiting()
        else:
            self.counts["cancelled"] += 1
            self._release(r, CANCELLED)
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

    # -- results ----------------------------------------------------------------
    def _result(self) -> RunResult:
        invariants = self.checker.results()
        for auditor in self.auditors:
            auditor.finish()
            invariants.update(auditor.results())
        end = self.now
        span = max(1, end - (self.start_ns or 0))
        occ_mean = {}
        for g, name in enumerate(self.group_names):
            area = self.occ_area[g] + self.occ[g] * (end - self.occ_t[g])
            occ_mean[name] = area / span
        names = self.group_names
        matrix = {names[a]: {names[b]: n for b, n in enumerate(row) if n}
                  for a, row in enumerate(self.evict_matrix)}
        return RunResult(
            label=self.label, policy=self.policy.describe(), usable_blocks=self.num_usable,
            requests=self.outcomes, groups=list(names), evictions=self.num_evictions,
            evictions_by={a: row for a, row in matrix.items() if row},
            occupancy_mean=occ_mean,
            occupancy_max={names[g]: v for g, v in enumerate(self.occ_max)},
            counts=dict(self.counts), invariants=invariants,
            orphans=self.checker.orphan_stats(), aborted=self.aborted,
            rejected_ids=list(self.rejected_ids), start_ns=self.start_ns or 0, end_ns=end)
