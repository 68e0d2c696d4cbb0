"""The step scheduler for a hybrid-attention model: one pool, several KV-cache groups.

vLLM's ``HybridKVCacheCoordinator`` keeps one block table per KV-cache group, all drawn
from one block pool (psgate.engines.kv_groups has its rules). A request here holds one
*lane* per group; group 0's lane is the request itself, so the pool, the policy hooks and
the checker see each lane as they see a request of a one-group model. One scheduler step
is sim's (psgate.engines.sched); only ``allocate_slots`` and its lookup differ:

    lookup: kv_groups.longest_hit over the content cached in each group
    allocate_slots(r, n new tokens, hits):
        waiting or preempted: every group's blocks for the whole sequence (a sliding
            group's capped) + the watermark must be free, or fail
        each sliding group frees its blocks wholly before the window of the computed
            prefix (last first), even when the allocation then fails
        every group's new blocks (hits still unpinned count) + the watermark must be
            free, or fail
        then, as vLLM orders the calls the policy sees: each group takes its hits past
            its skipped blocks (null before them), each group gets its new blocks (the
            policy evicts), each group caches its newly full blocks
        a sliding group caches only the blocks a later hit can end on (vLLM's
            prefix_cache_retention_interval; kv_groups.cached_mask)
    free: group by group, each group's blocks last first (nulls skipped)

A group's content is its own (psgate.trace.keys.kv_group_namespace): the same token block
cached in two groups is two blocks, and a hit needs the block in the groups that look it up.
Trace content computed again (a request's ``recompute_tokens``) is counted in group 0.
The compiled core models one group only; a hybrid replay runs this Python scheduler.
"""

from __future__ import annotations

from psgate.engines.kv_groups import (FULL, admission_caps, blocks_to_hold, cached_mask,
                                      check_retention, longest_hit)
from psgate.engines.sched import RUNNING, StepRequest, StepSimEngine
from psgate.errors import InputError
from psgate.trace.keys import MAX_HYBRID_NAMESPACES, chain_key


class KVLane:
    """A request's blocks in one KV-cache group past the first; anything else (its
    policy request, group, chain, ...) is the request's."""

    __slots__ = ("req", "blocks", "num_cached_blocks")

    def __init__(self, req: StepRequest) -> None:
        self.req = req
        self.blocks: list[int] = []
        self.num_cached_blocks = 0

    def __getattr__(self, name: str):
        return getattr(self.req, name)


class HybridRequest(StepRequest):
    __slots__ = ("lanes", "junction")

    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        self.lanes: list = []
        # vLLM's shared_prefix_boundary: tokens one group alone hit past the request's
        # hit at its last lookup (0: none); its sliding groups cache the run ending there
        self.junction = 0


class HitList(list):
    """Group 0's hit blocks (what the step scheduler counts), with every group's."""

    __slots__ = ("by_group",)


class HybridStepEngine(StepSimEngine):
    """sim's step scheduler with the model's KV-cache groups (``SchedulerParams.kv_groups``)."""

    request_cls = HybridRequest
    decode_fast_path = False

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.kv_groups = groups = self.sched.kv_groups
        # a policy's compiled touch (touch_hits) takes one table's hits; this engine tells
        # the policy of each group's hits itself (_touch_lane)
        self.kernels = None
        self.touch_hits_fn = None
        sched = self.sched
        # vllm-sched's max_model_len (its Scheduler reads it for the admission cap)
        self.caps = admission_caps(groups, self.bs, sched.max_num_batched_tokens,
                                   sched.max_model_len(self.num_blocks, self.bs))
        self.sliding = [g for g, spec in enumerate(groups) if spec.kind != FULL]
        self.retention = check_retention(sched.prefix_cache_retention_interval, self.bs)
        self.first_full = next((g for g, spec in enumerate(groups) if spec.kind == FULL),
                               None)

    def blocks_to_hold(self, num_tokens: int) -> int:
        return blocks_to_hold(self.caps, self.bs, num_tokens)

    def arrive(self, ev) -> None:
        super().arrive(ev)
        if len(self.ns_ids) > MAX_HYBRID_NAMESPACES:     # the group bits sit above them
            raise InputError(f"a hybrid replay holds at most {MAX_HYBRID_NAMESPACES} "
                             f"(group, scope) namespaces", path=self.trace_path, line=ev.line)
        r = self.reqs.get(ev.id)
        if r is not None and not r.lanes:
            r.lanes = [r] + [KVLane(r) for _ in range(len(self.kv_groups) - 1)]

    # -- keys and lookup ------------------------------------------------------------
    def key_at(self, r: StepRequest, pos: int, g: int) -> int:
        return chain_key(r.chain, r.ns, r.preq.index, pos, g)

    def lookup(self, r: HybridRequest) -> HitList:
        first = self.first_copy
        bs = self.bs
        length, by_group, longest = longest_hit(self.kv_groups, bs, (r.num_tokens - 1) // bs,
                                                lambda g, pos: first(self.key_at(r, pos, g)))
        r.junction = longest * bs if longest > length else 0
        hits = HitList(by_group[0])
        hits.by_group = by_group
        assert len(hits) == length
        return hits

    def admission_allowed(self, r: HybridRequest, hits: HitList) -> bool:
        if self.policy.work_conserving:
            return True
        ref = self.ref
        num_new = sum(max(-(-r.num_tokens // self.bs) - len(h), 0) for h in hits.by_group)
        r.preq.num_new_full_blocks = len(r.ev.blocks) - len(hits)
        return self.policy.admission_allowed(
            r.preq, num_new, sum(1 for h in hits.by_group for b in h if b and ref[b] == 0))

    # -- allocate_slots ---------------------------------------------------------------
    def _num_to_allocate(self, r: HybridRequest, num_tokens: int,
                         hits: HitList | None, total_computed: int, cap: bool) -> int:
        """``get_num_blocks_to_allocate`` summed over the groups."""
        bs, ref = self.bs, self.ref
        out = 0
        for g, spec in enumerate(self.kv_groups):
            blocks = r.lanes[g].blocks
            required = -(-num_tokens // bs)
            if cap and self.caps[g] is not None:
                required = min(required, self.caps[g])
            hg = hits.by_group[g] if hits else ()
            skipped = spec.skipped_tokens(total_computed) // bs
            out += max(required - max(skipped, len(hg) + len(blocks)), 0)
            for b in hg[max(0, skipped - len(blocks)):]:
                if b and ref[b] == 0:
                    out += 1
        return out

    def _remove_skipped(self, r: HybridRequest, num_computed: int) -> None:
        """``remove_skipped_blocks``: each sliding group lets go of its blocks wholly
        before the window, last first, as far back as the previous call went."""
        for g in self.sliding:
            blocks = r.lanes[g].blocks
            n = min(self.kv_groups[g].skipped_tokens(num_computed) // self.bs, len(blocks))
            freed: list[int] = []
            for i in range(n - 1, -1, -1):
                if blocks[i] == 0:
                    break
                freed.append(blocks[i])
                blocks[i] = 0
            if freed:
                self.free_in_order(freed)
                where = self.where_fn(r)
                self.checker.released(where, freed)
                self.checker.check_accounting(where, len(self.free),
                                              self.policy.num_candidates, self, self.policy)

    def _touch_lane(self, lane, taken: list[int]) -> None:
        """vLLM's ``touch`` of one group's hits as the policy is told it: positions count
        from the first block taken, null blocks are not told."""
        policy, ref = self.policy, self.ref
        on_hit, preq = self.on_hit_fn, lane.preq
        for pos, b in enumerate(taken):
            if not b:
                continue
            if ref[b] == 0:
                policy.on_touch(b)
            ref[b] += 1
            if on_hit is not None:
                on_hit(b, preq, pos)

    def allocate_slots(self, r: HybridRequest, num_new_tokens: int, hits: HitList | None) -> bool:
        bs = self.bs
        groups = self.kv_groups
        lanes = r.lanes
        policy = self.policy
        num_hits = len(hits) if hits else 0
        total = r.num_computed + num_hits * bs
        watermark = self.watermark_blocks if (r.status != RUNNING and self.running) else 0
        if r.status != RUNNING:          # the whole sequence must fit
            need = self._num_to_allocate(r, r.num_tokens, hits, total, cap=True)
            if need + watermark > len(self.free) + policy.num_candidates:
                return False
        need_slot = total + num_new_tokens
        self._remove_skipped(r, total)
        need = self._num_to_allocate(r, need_slot, hits, total, cap=False)
        if need + watermark > len(self.free) + policy.num_candidates:
            return False
        num_full = min(need_slot, r.num_tokens) // bs
        num_required = -(-need_slot // bs)
        if not (num_hits or any(num_required > len(lane.blocks)
                                or num_full > lane.num_cached_blocks for lane in lanes)):
            return True         # nothing to take, allocate or cache: no batch at all
        preq = r.preq
        self.open_batch(preq)
        taken_by_group: list[tuple[int, list[int]]] = []
        if num_hits:
            for g, lane in enumerate(lanes):
                skipped = groups[g].skipped_tokens(total) // bs
                taken = hits.by_group[g][skipped:]
                self._touch_lane(lane, taken)
                lane.blocks.extend([0] * skipped)
                lane.blocks.extend(taken)
                lane.num_cached_blocks = len(lane.blocks)
                taken_by_group.append((skipped, taken))
        new: list[int] = []
        for lane in lanes:
            n = num_required - len(lane.blocks)
            if n > 0:
                got = self.get_new_blocks(lane, n)
                lane.blocks.extend(got)
                new.extend(got)
        key, index_add, on_cached = self.key, self.index_add, self.on_cached_fn
        cached_by_group: list[list[tuple[int, int]]] = []
        recompute = 0
        boundaries = (r.ev.prompt_tokens - 1,) + ((r.junction,) if r.junction else ())
        for g, lane in enumerate(lanes):
            cached_now: list[tuple[int, int]] = []
            start = lane.num_cached_blocks
            if num_full > start:
                blocks = lane.blocks
                mask = cached_mask(groups[g], bs, self.retention, start, num_full,
                                   boundaries)
                to_cache = [pos for pos in range(start, num_full)
                            if blocks[pos] and (mask is None or mask[pos - start])]
                preq.num_new_full_blocks += len(to_cache)
                for pos in to_cache:
                    b = blocks[pos]
                    k = self.key_at(r, pos, g)
                    if index_add(k, b) and g == 0:
                        recompute += bs
                    key[b] = k
                    cached_now.append((b, k))
                    if on_cached is not None:
                        on_cached(b, preq, pos, blocks[pos - 1] if pos else -1, k)
                lane.num_cached_blocks = num_full
            cached_by_group.append(cached_now)
        note = self.close_batch(r, recompute)
        num_taken = self._checked_lanes(r, taken_by_group, new, cached_by_group)
        if self.records:
            self.recorder.admission(self.now, preq, num_taken, len(new),
                                    preq.num_new_full_blocks, note)
        if num_hits and self.records_hits and self.first_full is not None:
            self.record_hits(r, hits.by_group[self.first_full])
        return True

    def _checked_lanes(self, r: HybridRequest, taken_by_group, new: list[int],
                       cached_by_group: list[list[tuple[int, int]]]) -> int:
        """check_batch over one allocation batch, group by group (each group's hits must
        hold its own content at their positions). Returns the number of blocks hit (nulls
        not counted)."""
        parts = []
        for g in range(len(self.kv_groups)):
            skipped, taken = taken_by_group[g] if taken_by_group else (0, [])
            parts.append(([self.key_at(r, skipped + i, g) for i, b in enumerate(taken) if b],
                          [b for b in taken if b], cached_by_group[g]))
        keys, hits, cached_now = parts[0]
        self.check_batch(r, keys, hits, (r.num_tokens - 1) // self.bs, new, cached_now,
                         r.preq.num_new_full_blocks, tuple(parts[1:]))
        return sum(len(part[1]) for part in parts)

    def return_blocks(self, r: HybridRequest) -> None:
        """vLLM's ``free``: group by group, each group's blocks last first."""
        held = False
        where = self.where_fn(r)
        for lane in r.lanes:
            blocks = [b for b in lane.blocks if b]
            if blocks:
                held = True
                self.free_in_order(blocks[::-1])
                self.checker.released(where, blocks)
            lane.blocks = []
            lane.num_cached_blocks = 0
        if held:
            self.checker.check_accounting(where, len(self.free), self.policy.num_candidates,
                                          self, self.policy)
