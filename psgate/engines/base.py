"""The replay engine's bookkeeping, shared by every engine that replays on psgate's terms.

A :class:`ReplayEngine` is a :class:`~psgate.engines.pool.BlockPool` plus what a replay
needs around it whatever its scheduler: the policy bound to the pool (and its hooks, called
only when a policy overrides them), the invariant checker and the policy's auditors, groups
and their occupancy over time, each request's state and outcome, allocation (truly free
blocks first, then the policy's victims, as vLLM's ``get_new_blocks``), freeing in vLLM's
order, and the run's result. The schedulers subclass it: :mod:`psgate.engines.sim` (the
service model), :mod:`psgate.engines.sched` (vLLM's scheduler on a step clock) and the
vLLM engines, which mirror vLLM's own pool into the same arrays. What a subclass may call
or override is public; names with a leading underscore stay inside their module.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

import orjson

from psgate import core
from psgate.engines import pool_work
from psgate.engines.pool_work import PolicyFault, Where
from psgate.engines.cost import CostModel
from psgate.engines.pool import BlockPool
from psgate.engines.results import (REJECTED, UNFINISHED, OutcomeSink, RequestOutcome,
                                    RunResult)
from psgate.errors import InputError, PsgateError
from psgate.invariants.checker import NO_KEY, InvariantChecker, num_keys_from
from psgate.policies import innermost_frame, policy_code_files
from psgate.policy import (Decision, EvictionPolicy, GroupIds, PolicyRequest, PoolInfo,
                           RetentionRange, non_finite)
from psgate.trace.keys import HASH_MASK, KEY_SHIFT, OUTPUT_KEY_BIT
from psgate.trace.model import CancelEvent, RequestEvent, TraceHeader
from psgate.trace.reader import HashTable

NS_PER_MS = 1_000_000


class RequestState:
    """A request from arrival until its blocks are released (engines built on sim share it:
    slots, as thousands may wait at once)."""

    __slots__ = ("ev", "preq", "gid", "ns", "state", "blocks", "num_total", "admit_ns",
                 "first_token_ns", "release_ns", "seq", "done_ns", "awaits_done", "outcome",
                 "wait_start_ns", "chain")

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
        self.chain = ev.chain       # read per allocation: built once


def policy_fault(policy: EvictionPolicy, exc: BaseException) -> str | None:
    """What to say of an exception raised in the code of a policy from outside psgate,
    or None for any other (psgate's own code, a signal): a user's policy that raises
    ends its run as aborted, named in the receipt (the gate then fails), as a policy
    choosing a pinned block does; a fault of psgate's is not the policy's to answer for.
    The location is the innermost frame in the policy's own modules."""
    if isinstance(exc, PsgateError) or not isinstance(exc, Exception):
        return None
    hit = innermost_frame(exc.__traceback__, policy_code_files(type(policy), builtin=False))
    if hit is None:
        return None
    code = hit.tb_frame.f_code
    return (f"policy '{policy.name}' raised {type(exc).__name__}: {exc} in "
            f"{code.co_name} ({code.co_filename}:{hit.tb_lineno})")


class NullRecorder:
    """Receives ledger events; the receipt layer supplies a real one. A recorder may
    also have ``eviction_batch(now_ns, req, decisions, blocks, hash_names, owners)``, taking
    one allocation's eviction rows in one call, after the policy evicted them all; one
    that looks at the pool or the policy when called sets ``sequential = True``, and
    ``preempted(now_ns, req, by, num_computed)``, told when the step scheduler preempts
    ``req`` (its ``num_computed`` tokens lost) because running request ``by`` could not
    get the blocks for its next tokens (no ledger row: explain re-simulates for it)."""

    def eviction(self, now_ns, req, decision, block, hash_name, owner) -> None:
        pass

    def admission(self, now_ns, req, hits, allocated, new_blocks, note) -> None:
        pass

    def hit(self, now_ns, req, pos, block, hash_name, owner) -> None:
        pass


class ReplayEngine(BlockPool):
    """One trace under one policy on psgate's block pool; a subclass schedules and
    ``run()`` returns a :class:`RunResult`."""

    # An allocation batch's steps (psgate.engines.pool_work), bound as methods below. They
    # call one another as C functions, so a subclass overriding one alone would be
    # bypassed by the others: none may.
    BATCH_STEPS = ("touch", "get_new_blocks", "evicted_batch", "check_batch")

    def __init_subclass__(cls, **kw) -> None:
        super().__init_subclass__(**kw)
        for name in ReplayEngine.BATCH_STEPS:
            if getattr(cls, name) is not getattr(ReplayEngine, name):
                raise TypeError(f"{cls.__name__} overrides {name}, one of an allocation "
                                f"batch's steps (psgate.engines.pool_work), which call one "
                                f"another directly")

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
        self.policy = policy
        self.contracts = frozenset(contracts)
        self.done_ids = done_ids
        self.cost = cost or CostModel()
        self.recorder = recorder or NullRecorder()
        self.label = label
        self.trace_path = trace_path
        self.progress = progress

        BlockPool.__init__(self, capacity, hashes)
        n = capacity

        self.ns_ids: dict[tuple[str, str], int] = {}
        self.groups = GroupIds()
        self.gids, self.group_names = self.groups.ids, self.groups.names
        self.occ: list[int] = []
        self.occ_max: list[int] = []
        self.occ_area: list[int] = []
        self.occ_t: list[int] = []
        # evict_matrix[evictor][owner] = blocks the evictor's requests took from the owner; one
        # sparse row per group (a dense G x G table is quadratic in tenants).
        self.evict_matrix: list[Counter[int]] = []

        try:
            self.policy.bind(PoolInfo(num_blocks=n, num_usable=n - 1, block_size=self.bs,
                                      groups=tuple(groups), key_shift=KEY_SHIFT))
        except Exception as exc:
            fault = policy_fault(self.policy, exc)
            if fault is None and type(exc) is ValueError:   # a built-in refusing this pool
                fault = f"policy '{self.policy.name}': {exc}"
            if fault is None:
                raise
            raise InputError(fault) from None   # before any event: the policy cannot start
        parent = hashes.parent

        def parent_of(k: int) -> int:
            p = parent[k & HASH_MASK]
            return NO_KEY if p < 0 else ((k >> KEY_SHIFT) << KEY_SHIFT) | p

        self.checker = InvariantChecker(n, parent_of, paranoid=paranoid,
                                        parent_table=parent, key_shift=KEY_SHIFT)
        # Hooks a policy leaves at the base class's no-op are not called per block, and
        # a policy with its own evict_batch evicts a whole batch in one call.
        cls = type(policy)
        self.on_hit_fn = None if cls.on_hit is EvictionPolicy.on_hit else policy.on_hit
        self.on_cached_fn = None if cls.on_cached is EvictionPolicy.on_cached else policy.on_cached
        self.on_released_fn = (None if cls.on_released is EvictionPolicy.on_released
                             else policy.on_released)
        # The step scheduler opens and closes an allocation batch per prompt chunk and
        # decode block: most are one block, so a no-op on_admit/end_admit is not called.
        self.on_admit_fn = None if cls.on_admit is EvictionPolicy.on_admit else policy.on_admit
        self.end_admit_fn = (None if cls.end_admit is EvictionPolicy.end_admit
                             else policy.end_admit)
        # get_new_blocks without a policy's reclaim_first/on_allocated: neither is called.
        self.plain_allocation = (cls.reclaim_first is EvictionPolicy.reclaim_first
                                 and cls.on_allocated is EvictionPolicy.on_allocated)
        # A recorder that reads the pool at each eviction (``sequential``) needs it as it
        # was just before that one: one select_victim/on_evict at a time then.
        self.batch_evictions = (cls.batches_evictions()
                                and not getattr(self.recorder, "sequential", False))
        # Decisions (the ranking fields of each eviction) are built only for a recorder
        # that writes them.
        self.records = type(self.recorder) is not NullRecorder
        # A policy that evicts one at a time still has the pool's bookkeeping and its
        # rows done per batch (evict_each), unless the recorder reads the pool at each one.
        self.batch_records = not getattr(self.recorder, "sequential", False)
        # A policy from outside psgate has its decisions' ranking fields checked before
        # the ledger writes them (psgate's own are held to that by their tests).
        self.checks_decisions = not cls.__module__.startswith("psgate.")
        self.records_hits = bool(getattr(self.recorder, "hits", False))
        self.auditors = policy.invariant_auditors()
        self.paranoid = paranoid
        # The compiled loops (psgate.core), or None: the Python ones below.
        self.kernels = core.get()
        self.touch_queues = policy.touch_queues()
        self.touch_hits_fn = policy.touch_hits() if self.kernels is not None else None

        self.now = 0
        self.start_ns: int | None = None
        self.reqs: dict[str, RequestState] = {}     # id -> request, while admitted or waiting
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

    def gid_of(self, group: str) -> int:
        g = self.gids.get(group)
        if g is None:
            g = self.groups.add(group)
            self.occ.append(0)
            self.occ_max.append(0)
            self.occ_area.append(0)
            self.occ_t.append(self.now)
            self.evict_matrix.append(Counter())
        return g

    def occ_add(self, g: int, delta: int) -> None:
        now = self.now
        self.occ_area[g] += self.occ[g] * (now - self.occ_t[g])
        self.occ_t[g] = now
        v = self.occ[g] + delta
        self.occ[g] = v
        if v > self.occ_max[g]:
            self.occ_max[g] = v

    def where(self, r: RequestState) -> str:
        return f"{self.trace_path}:{r.ev.line} (request {r.ev.id}, {self.label})"

    def where_fn(self, r: RequestState):
        """where(r), formatted only if a check fails."""
        return Where(self, r)

    def num_candidates(self) -> int:
        return self.policy.num_candidates

    def request_state(self, ev: RequestEvent, num_out: int, cls=RequestState,
                       awaits_done: bool = False) -> RequestState:
        """An arriving request as the engines track it: its contract checked, its group
        and namespace numbered on first sight, the policy's view of it (arrival index
        included) and its outcome, to be filled in."""
        if ev.contract not in self.contracts:
            raise InputError(f"unknown contract '{ev.contract}'; the replay's contract table "
                             f"has {', '.join(sorted(self.contracts))}",
                             path=self.trace_path, line=ev.line, field="contract")
        g = self.gid_of(ev.group)
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
        if ev.retention is not None:
            preq.retention = tuple(RetentionRange(*r) for r in ev.retention)
        preq.retention_ns = ev.retention_ns
        self.num_requests += 1
        if self.policy.wants_block_keys:
            base = ns << KEY_SHIFT
            preq.block_keys = [base | h for h in ev.blocks]
        outcome = RequestOutcome(id=ev.id, group=ev.group, contract=ev.contract, role=ev.role,
                                 measure=ev.measure, state=UNFINISHED, t_ns=ev.t_ns,
                                 prompt_tokens=ev.prompt_tokens)
        return cls(ev, preq, g, self.blocks_to_hold(ev.prompt_tokens + num_out), outcome,
                   awaits_done)

    def blocks_to_hold(self, num_tokens: int) -> int:
        """Blocks ``num_tokens`` tokens take in an empty cache: a request that needs more
        than the pool has is rejected on arrival."""
        return -(-num_tokens // self.bs)

    def accepted(self, r: RequestState, too_long: bool = False) -> bool:
        """Rejects r (False) when it cannot fit even into an empty cache (or the policy's
        cap for it), or ``too_long`` says the engine cannot take it; else r is in flight."""
        cap = self.policy.capacity_for(r.preq)
        if too_long or r.num_total > (self.num_usable if cap is None
                                      else min(cap, self.num_usable)):
            r.outcome.state = REJECTED
            self.counts["rejected"] += 1
            self.rejected_ids.append(r.ev.id)
            self.finalize(r)
            return False
        ev = r.ev
        self.reqs[ev.id] = r
        self.num_in_flight += 1
        if self.num_in_flight > self.max_in_flight:
            raise InputError(f"more than {self.max_in_flight} requests admitted or waiting at "
                             f"t={ev.t_ns / 1e9:g} s (the cap; raise it with --max-in-flight)",
                             path=self.trace_path, line=ev.line)
        return True

    def record_hits(self, r: RequestState, hits: list[int]) -> None:
        """One ledger row per block r hit (``--ledger-hits``), in prefix order; a hit past
        the trace's blocks and answer (a resumed request's own output block) has no hash
        name."""
        names, gnames, owner = self.hashes.names, self.group_names, self.owner
        evb = r.chain
        now, preq, hit = self.now, r.preq, self.recorder.hit
        for pos, b in enumerate(hits):
            hit(now, preq, pos, b, names[evb[pos]] if pos < len(evb) else "", gnames[owner[b]])

    touch = pool_work.take_hits

    def deliver(self, ev) -> None:
        """One trace event to a step engine (its arrivals wait for a scheduler step; a done
        event decides nothing there, it only counts when its request is unknown)."""
        if type(ev) is RequestEvent:
            self.arrive(ev)
        elif type(ev) is CancelEvent:
            self.cancel(ev)
        elif ev.id not in self.reqs:
            self.counts["late_dones"] += 1
        if self.progress is not None:
            self.progress(ev.line)

    get_new_blocks = pool_work.get_new_blocks

    check_batch = pool_work.check_batch

    def audit_batch(self, r: RequestState, cached_now: list[tuple[int, int]],
                    num_new_full: int) -> None:
        """The policy's auditors over one allocation batch of r, after the hard checks."""
        audit = self.policy.audit()
        ev = r.ev
        where = self.where_fn(r)
        # blocks of generated tokens among the new ones (output keys: engine-side fact)
        num_output = num_keys_from(cached_now, OUTPUT_KEY_BIT)
        for auditor in self.auditors:
            auditor.admitted(where, ev.group, ev.contract, self.now / 1e9, num_new_full,
                             audit, num_output)

    evicted_batch = pool_work.evicted_batch

    def evict_each(self, r: RequestState, num_evict: int) -> list[int]:
        """``num_evict`` victims of a policy that evicts one at a time: select_victim, the
        victim checked as :meth:`evict` checks it, then on_evict, each in turn; the pool's
        bookkeeping and the ledger rows are then done for the batch (:meth:`evicted_batch`,
        compiled where built), so a policy written plainly in Python pays only for its own
        methods. A victim that is no candidate (or no block) ends the batch there: the rows
        before it are recorded and the run aborts naming it, its on_evict never called."""
        policy, preq, now = self.policy, r.preq, self.now
        ref, key, nb = self.ref, self.key, self.num_blocks
        decisions: list | None = [] if self.records else None
        victims: list[int] = []
        chosen: set[int] = set()
        for _ in range(num_evict):
            d = policy.select_victim(preq, now)
            v = self.victim_of(d, r)
            victims.append(v)
            if decisions is not None:
                decisions.append(d)
            if not 0 < v < nb or ref[v] != 0 or key[v] == NO_KEY or v in chosen:
                break
            chosen.add(v)
            policy.on_evict(v)
        self.evicted_batch(r, victims, decisions, num_evict)
        return victims

    def check_decisions(self, r: RequestState, decisions: list) -> None:
        """A user's policy's decisions, before they reach the ledger: ranking fields the
        ledger can write (a dict of JSON values, numbers finite), else the run aborts
        naming the field, not the ledger's writer with a traceback or a silent null."""
        for d in decisions:
            rank = getattr(d, "rank", None)
            problem = None
            if type(rank) is not dict:
                problem = f"rank is {type(rank).__name__}, expected a dict"
            else:
                try:
                    orjson.dumps(rank)
                except (TypeError, orjson.JSONEncodeError) as exc:
                    problem = f"rank {rank!r:.60} is not JSON: {exc}"
                else:
                    if non_finite(rank):
                        problem = f"rank {rank!r:.60} holds a number that is not finite"
            if problem is not None:
                raise PolicyFault(f"{self.where_fn(r)()}: policy '{self.policy.name}' "
                                  f"decided to evict block {getattr(d, 'victim', None)} "
                                  f"with {problem}")

    def victim_of(self, d, r: RequestState) -> int:
        """The block a policy's decision names; anything but a Decision naming a block id
        aborts the run, as a victim that is no candidate does."""
        v = getattr(d, "victim", None)
        if not isinstance(d, Decision) or type(v) is not int:
            raise PolicyFault(f"{self.where_fn(r)()}: policy '{self.policy.name}' returned "
                              f"{d!r:.80} from select_victim, expected a Decision naming a "
                              f"block id")
        return v

    def evict(self, d, r: RequestState) -> None:
        v = self.victim_of(d, r)
        if self.checks_decisions and self.records:
            self.check_decisions(r, [d])
        k = self.key[v]
        where = self.where_fn(r)
        self.checker.evicted(where, v)
        if not (0 < v < self.num_blocks) or self.ref[v] != 0 or k == NO_KEY:
            raise PolicyFault(f"{where()}: policy '{self.policy.name}' chose block {v}, which "
                              f"is not an eviction candidate (pinned or holding no content)")
        og = self.owner[v]
        if self.records:
            self.recorder.eviction(self.now, r.preq, d, v,
                                   self.hashes.names[k & HASH_MASK] if k < OUTPUT_KEY_BIT else "",
                                   self.group_names[og])
        self.drop_content(v, k)
        self.key[v] = NO_KEY
        self.policy.on_evict(v)
        self.occ_add(og, -1)
        self.owner[v] = -1
        self.evict_matrix[r.gid][og] += 1
        self.num_evictions += 1

    def drop_content(self, v: int, k: int) -> None:
        """Block v, holding content k, is being evicted: forget it in the lookup table;
        content with no copy left is lost (a later recompute is counted)."""
        self.index_drop(k, v)

    def free_blocks(self, r: RequestState) -> None:
        """r's blocks go back in vLLM's ``free`` order (block_pool.py:774-803): walked last
        first, uncached ones to the front of the free queue, cached ones to the policy."""
        self.free_in_order(r.blocks[::-1])

    free_in_order = pool_work.free_in_order

    def finalize(self, r: RequestState) -> None:
        if r.outcome.state != REJECTED:
            self.num_in_flight -= 1
        if self.sink is None:
            self.outcomes.append(r.outcome)
        else:
            self.sink.add(r.outcome, r.preq.index)

    def result(self) -> RunResult:
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
        matrix = {names[a]: {names[b]: row[b] for b in sorted(row) if row[b]}
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
