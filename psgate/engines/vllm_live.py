"""A psgate policy inside a running vLLM scheduler (the real engine and the plugin).

Unlike ``vllm-pool``, nothing here drives the pool: vLLM's scheduler allocates
prompt blocks (in chunks when it chunks prefill), output blocks one at a time as
it decodes, caches full blocks of either kind, and may preempt. This module
observes the manager and pool calls and tells the policy what ``sim`` would:

    allocate_slots(request, ...)  one allocation batch -> on_admit (lazily) ... end_admit
    touch(blocks)                 hits                 -> on_touch (queue), on_hit
    get_new_blocks(n)             allocation           -> victims from the policy, on_allocated
    cache_full_blocks(...)        newly cached blocks  -> on_cached (prompt *and* output)
    free(request)                 release              -> on_released / on_free (queue)

Every newly cached full block is materialized and charged to the request's
group, whether it holds prompt or generated tokens. Tenant identity comes from
the request: ``SamplingParams.extra_args`` keys ``psgate_group``/``psgate_contract``
first, else ``cache_salt`` (``group`` or ``group<NUL>scope``), else the group
``default``. A policy that needs the trace's future (``belady``) cannot run live.
"""

from __future__ import annotations

from collections.abc import Callable

from psgate.engines.kv_groups import FULL, SLIDING, KVGroup
from psgate.engines.vllm_queue import PolicyFreeQueue
from psgate.invariants.checker import Verdict
from psgate.policy import Decision, EvictionPolicy, PolicyRequest, PoolInfo, RetentionRange
from psgate.trace.reader import hints_from_xargs, retention_ranges, retention_seconds
from psgate.trace.keys import KV_GROUP_SHIFT

DEFAULT_GROUP = "default"
DEFAULT_CONTRACT = "standard"


def identify(request) -> tuple[str, str, str]:
    """(group, contract, scope) of a vLLM request; see the module docstring."""
    sp = getattr(request, "sampling_params", None)
    extra = (getattr(sp, "extra_args", None) or {}) if sp is not None else {}
    salt = getattr(request, "cache_salt", None) or ""
    salt_group, _, scope = salt.partition("\x00")
    group = str(extra.get("psgate_group") or salt_group or DEFAULT_GROUP)
    contract = str(extra.get("psgate_contract") or DEFAULT_CONTRACT)
    lora = getattr(request, "lora_request", None)
    return group, contract, scope or (getattr(lora, "lora_name", None) or "base")


class LivePolicy:
    """Installs ``policy`` as the eviction order of a live vLLM KVCacheManager.

    ``clock_ns()`` gives the policy's time (the trace clock in a replay, monotonic
    time in serving). ``recorder`` receives ``eviction``/``admission`` calls as a
    psgate ledger does; ``key_of(request_id, pos, block)`` gives a newly cached block's
    content key for the policy (default: from vLLM's own block hash, kept in memory) and
    ``name_of`` its name in the ledger (default: none; vLLM's hashes are never written).
    ``future_known``: a replay has given a clairvoyant policy the trace's future.
    ``pool_info``: what the policy is bound with (a replay passes sim's, groups included).
    """

    def __init__(self, mgr, policy: EvictionPolicy, *, clock_ns: Callable[[], int],
                 recorder=None, key_of=None, name_of=None, describe=identify,
                 request_id=None, future_known: bool = False,
                 pool_info: PoolInfo | None = None) -> None:
        if policy.needs_future and not future_known:
            raise ValueError(f"policy '{policy.name}' needs the trace's future and cannot run "
                             f"inside a live engine")
        if not policy.work_conserving:
            raise ValueError(f"policy '{policy.name}' makes requests wait (admission control), "
                             f"which vLLM's scheduler does not ask a block pool about; replay "
                             f"it with --engine sim or vllm-pool")
        self.mgr = mgr
        self.pool = pool = mgr.block_pool
        self.policy = policy
        self.clock_ns = clock_ns
        self.recorder = recorder
        self.describe = describe
        self.request_id = request_id or _request_id
        self.key_of = key_of or _hash_key
        self.name_of = name_of      # None: blocks have no names (ledger column empty)
        self.block_size = mgr.kv_cache_config.kv_cache_groups[0].kv_cache_spec.block_size
        num_blocks = len(pool.blocks)
        policy.bind(pool_info or PoolInfo(num_blocks=num_blocks, num_usable=num_blocks - 1,
                                          block_size=self.block_size))
        old = pool.free_block_queue
        self._native_queue_cls = type(old)
        # Truly free blocks in id order, as a fresh pool has them (after a warm-up and a
        # prefix-cache reset the order is arbitrary; it decides only which ids are used).
        self.queue = PolicyFreeQueue(pool.blocks, policy, self,
                                     sorted(b.block_id for b in old.get_all_free_blocks()))
        pool.free_block_queue = self.queue
        self.group_of_block = [-1] * num_blocks
        self.names: list[str | None] = [None] * num_blocks
        self.groups: list[str] = []
        self._gids: dict[str, int] = {}
        self._ns: dict[tuple[str, str], int] = {}
        self.preqs: dict[str, PolicyRequest] = {}
        self._cur: PolicyRequest | None = None
        self._begun = False
        self._num_hits = self._num_new = 0      # the current batch's, for its ledger row
        self.num_evictions = 0
        self.evictions_by: dict[tuple[int, int], int] = {}
        self.pinned = Verdict("no_pinned_eviction", hard=True)
        self.output_blocks: set[int] = set()     # blocks caching generated tokens
        self.output_hits: dict[str, int] = {}    # request id -> output blocks it hit
        self._wrap(mgr, pool)

    # -- requests -------------------------------------------------------------
    def gid_of(self, group: str) -> int:
        g = self._gids.get(group)
        if g is None:
            g = self._gids[group] = len(self.groups)
            self.groups.append(group)
        return g

    def preq(self, request) -> PolicyRequest:
        rid = self.request_id(request)
        p = self.preqs.get(rid)
        if p is None:
            group, contract, scope = self.describe(request)
            self.gid_of(group)
            ns = self._ns.setdefault((group, scope), len(self._ns))
            n = request.num_prompt_tokens
            p = PolicyRequest(id=rid, group=group, contract=contract, scope=scope, namespace=ns,
                              prefix=None, t_ns=self.clock_ns(), prompt_tokens=n,
                              num_prompt_blocks=n // self.block_size, num_new_full_blocks=0,
                              index=len(self.preqs))
            sp = getattr(request, "sampling_params", None)
            extra = getattr(sp, "extra_args", None) if sp is not None else None
            if extra:
                hints = hints_from_xargs(extra, n)
                if "retention" in hints:
                    p.retention = tuple(RetentionRange(*r) for r in
                                        retention_ranges(hints["retention"], n))
                if "retention_s" in hints:
                    p.retention_ns = retention_seconds(hints["retention_s"])
            self.preqs[rid] = p
        return p

    def _begin(self) -> None:
        if not self._begun:
            self._begun = True
            self.policy.on_admit(self._cur, self.clock_ns())

    # -- the wrapped calls ----------------------------------------------------
    def _wrap(self, mgr, pool) -> None:
        allocate, free = mgr.allocate_slots, mgr.free
        touch, get_new, cache_full = pool.touch, pool.get_new_blocks, pool.cache_full_blocks
        policy = self.policy
        # Every running request's every step comes here: a request already known is looked
        # up directly unless a subclass decides what a request is.
        preqs = self.preqs
        direct = type(self).preq is LivePolicy.preq and self.request_id is _request_id

        def allocate_slots(request, *args, **kwargs):
            cur = preqs.get(request.request_id) if direct else None
            if cur is None:
                cur = self.preq(request)
            self._cur, self._begun = cur, False
            cur.num_new_full_blocks = 0
            self._num_hits = self._num_new = 0
            # vLLM resets a preempted request's computed tokens: scheduled again, it is a
            # new lookup, which its ledger row says (as sim's step scheduler writes it).
            resumed = (request.num_computed_tokens == 0
                       and getattr(request, "num_preemptions", 0) > 0)
            try:
                out = allocate(request, *args, **kwargs)
                if self._begun:
                    note = policy.end_admit(self._cur, self.clock_ns())
                    if resumed:
                        note = {**(note or {}), "resumed": True}
                    if self.recorder is not None:
                        self.recorder.admission(self.clock_ns(), self._cur, self._num_hits,
                                                self._num_new, self._cur.num_new_full_blocks,
                                                note)
                return out
            finally:
                self._cur = None

        def free_request(request):
            rid = self.request_id(request)
            self._cur = self.preqs.get(rid)
            try:
                return free(request)
            finally:
                self._cur = None
                if request.is_finished():
                    self.preqs.pop(rid, None)

        def touched(blocks):
            self._begin()
            preq = self._cur
            for pos, blk in enumerate(blocks):
                touch([blk])
                if blk.is_null:       # a sliding-window group's skipped position
                    continue
                self._num_hits += 1
                if blk.block_id in self.output_blocks:
                    self.output_hits[preq.id] = self.output_hits.get(preq.id, 0) + 1
                policy.on_hit(blk.block_id, preq, pos)

        def got_new(n):
            self._begin()
            out = get_new(n)
            ids = [b.block_id for b in out]
            self._num_new += len(ids)
            g = self._gids[self._cur.group]
            for b in ids:
                self.group_of_block[b] = g
            policy.on_allocated(self._cur, ids)
            return out

        names, name_of, key_of = self.names, self.name_of, self.key_of

        def cached(request, blocks, num_cached_blocks, num_full_blocks, *args, **kwargs):
            cache_full(request, blocks, num_cached_blocks, num_full_blocks, *args, **kwargs)
            self._begin()
            preq = self._cur
            num_prompt = request.num_prompt_tokens // self.block_size
            rid = preq.id
            # the blocks this call cached: a hybrid model's sliding-window group skips the
            # null ones and those no later hit can end on (left uncached); summed over the
            # groups (one call each)
            now_cached = [pos for pos in range(num_cached_blocks, num_full_blocks)
                          if not blocks[pos].is_null and blocks[pos].block_hash is not None]
            preq.num_new_full_blocks += len(now_cached)
            for pos in now_cached:
                blk = blocks[pos]
                b = blk.block_id
                if pos >= num_prompt:
                    self.output_blocks.add(b)
                if name_of is not None:
                    names[b] = name_of(rid, pos, blk)
                policy.on_cached(b, preq, pos, blocks[pos - 1].block_id if pos else -1,
                                 key_of(rid, pos, blk))

        mgr.allocate_slots, mgr.free = allocate_slots, free_request
        pool.touch, pool.get_new_blocks, pool.cache_full_blocks = touched, got_new, cached

    def uninstall(self) -> None:
        """Give the pool back its native queue and methods (an empty cache is expected:
        every block free, as after ``reset_prefix_cache``)."""
        mgr, pool = self.mgr, self.pool
        for obj, names in ((mgr, ("allocate_slots", "free")),
                           (pool, ("touch", "get_new_blocks", "cache_full_blocks"))):
            for name in names:
                obj.__dict__.pop(name, None)     # the class's method shows through again
        free = sorted(b.block_id for b in self.queue.get_all_free_blocks())
        pool.free_block_queue = self._native_queue_cls([pool.blocks[i] for i in free])

    # -- QueueOwner -----------------------------------------------------------
    def context(self):
        return self._cur, self.clock_ns()

    def reclaim_first(self, num_blocks: int) -> int:
        return self.policy.reclaim_first(self._cur, num_blocks) if self._cur else 0

    @property
    def needs_decisions(self) -> bool:
        """Whether evictions need their decisions (a recorder writes them)."""
        return self.recorder is not None

    @property
    def batch_victims(self):
        """The batch path (:class:`PolicyFreeQueue`) when ``evicting`` is this class's own;
        a subclass that checks each eviction, or a recorder that reads the candidates as
        they were before each one (``sequential``), gets one ``evicting`` call per victim."""
        if (type(self).evicting is LivePolicy.evicting
                and not getattr(self.recorder, "sequential", False)):
            return self._evicted_batch
        return None

    def _evicted_batch(self, victims: list[int], decisions: list[Decision] | None) -> None:
        """What ``evicting`` does after the policy chose each victim, for a batch the
        policy has already evicted (its on_evict done): check, record, forget."""
        for i, v in enumerate(victims):
            self._evicted(v, decisions[i] if decisions is not None else None)

    def evicting(self, d: Decision) -> None:
        self._evicted(d.victim, d, evict=True)

    def _evicted(self, v: int, d: Decision | None, evict: bool = False) -> None:
        blk = self.pool.blocks[v]
        if blk.ref_cnt == 0 and blk.block_hash is not None:
            self.pinned.checks += 1     # what record(True, ...) does, without a closure
        else:
            self.pinned.record(False, f"policy '{self.policy.name}' chose block {v} (ref_cnt "
                                      f"{blk.ref_cnt}, cached {blk.block_hash is not None})")
        og = self.group_of_block[v]
        if self.recorder is not None:
            self.recorder.eviction(self.clock_ns(), self._cur, d, v, self.names[v] or "",
                                   self.groups[og] if og >= 0 else "")
        if evict:
            self.policy.on_evict(v)
        self.output_blocks.discard(v)
        self.names[v] = None
        g = self._gids[self._cur.group] if self._cur is not None else -1
        self.evictions_by[(g, og)] = self.evictions_by.get((g, og), 0) + 1
        self.group_of_block[v] = -1
        self.num_evictions += 1

    def released(self, block_ids: list[int]) -> None:
        for b in block_ids:
            self.group_of_block[b] = -1


def model_kv_groups(kv_cache_config) -> str:
    """A vLLM KVCacheConfig's groups as ``--kv-groups`` writes them (``full`` for one
    full-attention group); a kind of group psgate does not model is said by name."""
    from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec
    found = []
    for g in kv_cache_config.kv_cache_groups:
        spec = g.kv_cache_spec
        if isinstance(spec, SlidingWindowSpec):
            found.append(KVGroup(SLIDING, spec.sliding_window))
        elif isinstance(spec, FullAttentionSpec):
            found.append(KVGroup(FULL))
        else:
            found.append(type(spec).__name__)
    if found == [KVGroup(FULL)]:
        return FULL
    return ",".join(str(g) for g in found)


def _request_id(request) -> str:
    return request.request_id


def _hash_key(request_id: str, pos: int, block) -> int:
    """A content key from vLLM's block hash (bytes): the same content, the same key. vLLM
    appends the block's KV-cache group (4 bytes, big-endian) to the hash: a hybrid model's
    group g > 0 holds its own content, with g in bits 56-60 as a replay keys it
    (psgate.trace.keys.KV_GROUP_SHIFT); group 0's keys are the hash's alone."""
    h = block.block_hash
    if not isinstance(h, bytes):
        return int.from_bytes(repr(h).encode()[:8], "little") & ((1 << 62) - 1)
    key = int.from_bytes(h[:8], "little") & ((1 << 62) - 1)
    group = int.from_bytes(h[-4:], "big") if len(h) > 12 else 0
    return key ^ (group << KV_GROUP_SHIFT)

