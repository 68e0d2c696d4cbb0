"""vllm-pool: vLLM's own KVCacheManager and BlockPool under psgate's service model.

``sim`` re-implements vLLM's block pool; this engine *is* vLLM's block pool, so a
replay through it is a conformance check of ``sim`` (the differential suite
asserts identical cached tokens and eviction sequences) and a replay in its own
right when a user wants vLLM's code, not a model of it, to decide hits.

What comes from vLLM: prefix lookup (``get_computed_blocks``, with its cap at
``prompt_tokens - 1``), the fit check and allocation (``allocate_slots``, output
blocks reserved as lookahead), which block ids a request gets, caching of full
prompt blocks and the release order (``free``). What comes from psgate: arrivals,
waiting lines, the server and its cost model, completions and cancellations
(inherited from :class:`SimEngine`), and the eviction order, which is the psgate
policy object installed as the pool's free-block queue
(:class:`~psgate.engines.vllm_queue.PolicyFreeQueue`).

Token ids are synthesized from trace block hashes (same hash, same tokens), the
tail from the request id; ``cache_salt`` is the request's namespace, so vLLM's
own hashes separate (group, scope) pairs as psgate's keys do. vLLM's hashes never
leave this module: blocks are named by the trace's hashes.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util

from psgate.engines.sim import PolicyFault, RequestState, SimEngine
from psgate.engines.vllm_queue import PolicyFreeQueue
from psgate.errors import EngineUnavailable
from psgate.policy import Decision
from psgate.trace.keys import KEY_SHIFT

SUPPORTED_VLLM = "0.32."
INSTALL_HINT = "install it with: bash scripts/install-vllm.sh (see README, 'vLLM engines')"


def vllm_version(engine: str = "vllm-pool") -> str:
    """The installed vLLM's version, or EngineUnavailable naming the install command."""
    try:
        missing = importlib.util.find_spec("vllm") is None
    except ValueError:      # vllm.__spec__ unset: a stand-in module, not an install
        missing = True
    if missing:
        raise EngineUnavailable(f"engine '{engine}' needs vLLM, which is not installed; "
                                f"{INSTALL_HINT}")
    try:
        vllm = importlib.import_module("vllm")
    except Exception as exc:   # a broken install: say what broke, not a traceback
        raise EngineUnavailable(f"engine '{engine}': vLLM is installed but does not import "
                                f"({type(exc).__name__}: {exc}); {INSTALL_HINT}") from None
    version = vllm.__version__
    if not version.startswith(SUPPORTED_VLLM):
        raise EngineUnavailable(f"engine '{engine}': found vLLM {version}, expected "
                                f"{SUPPORTED_VLLM}x (the block "
                                f"pool internals psgate drives are version-specific); "
                                f"{INSTALL_HINT}")
    return version


def tokens_for(name: str, block_size: int, vocab: int = 30000) -> list[int]:
    """Token ids for a trace block, in 1..vocab-1: the same trace hash always gives the
    same tokens, different hashes different ones (up to a negligible collision)."""
    import numpy as np     # a vLLM dependency; this module is used only with vLLM

    d = hashlib.shake_256(name.encode()).digest(2 * block_size)
    return (np.frombuffer(d, dtype=np.uint16) % (vocab - 1) + 1).tolist()


def tail_tokens(request_id: str, n: int, vocab: int = 30000) -> list[int]:
    """A request's unshared tail: derived from its id, so it never matches another's."""
    return tokens_for("tail:" + request_id, n, vocab) if n else []


def block_tokens(h: int, names, block_size: int, cache: dict[int, list[int]],
                 vocab: int = 30000) -> list[int]:
    """The tokens of trace hash id ``h`` (memoized in ``cache``)."""
    t = cache.get(h)
    if t is None:
        t = cache[h] = tokens_for(names[h], block_size, vocab)
    return t


def prompt_token_ids(ev, names, block_size: int, cache: dict[int, list[int]],
                     vocab: int = 30000) -> list[int]:
    """A request's synthesized prompt: its blocks' tokens (memoized per trace hash id in
    ``cache``), then its tail: the first tokens of its answer's first block where it has
    an answer (that block holds the tail and the first generated tokens), else tokens
    of its own."""
    tokens: list[int] = []
    for h in ev.blocks:
        tokens += block_tokens(h, names, block_size, cache, vocab)
    num_tail = ev.prompt_tokens - len(ev.blocks) * block_size
    if ev.answer:
        return tokens + block_tokens(ev.answer[0], names, block_size, cache, vocab)[:num_tail]
    return tokens + tail_tokens(ev.id, num_tail, vocab)


def namespace_salt(group: str, scope: str) -> str:
    return f"{group}\x00{scope}"


class RefView:
    """Reference counts read from vLLM's blocks, for the invariant checker's recount."""

    __slots__ = ("_blocks",)

    def __init__(self, blocks) -> None:
        self._blocks = blocks

    def __getitem__(self, b: int) -> int:
        return self._blocks[b].ref_cnt

    def __len__(self) -> int:
        return len(self._blocks)


def make_kv_cache_manager(num_blocks: int, block_size: int, max_model_len: int = 1 << 20):
    """A model-less KVCacheManager with one full-attention group, prefix caching on."""
    import torch
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec

    cfg = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=[
        KVCacheGroupSpec(["layer0"], FullAttentionSpec(block_size=block_size, num_kv_heads=1,
                                                       head_size=1, dtype=torch.float32))])
    mgr = KVCacheManager(cfg, max_model_len=max_model_len, scheduler_block_size=block_size,
                         hash_block_size=block_size, enable_caching=True, log_stats=False)
    hash_fn = get_hash_fn_by_name("sha256")
    init_none_hash(hash_fn)
    return mgr, get_request_block_hasher(block_size, hash_fn)


class VllmPoolEngine(SimEngine):
    """Replays one trace through vLLM's KVCacheManager under one psgate policy."""

    name = "vllm-pool"

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.vllm_version = vllm_version()
        from vllm import SamplingParams
        from vllm.v1.request import Request, RequestStatus
        self._Request, self._SamplingParams, self._Status = Request, SamplingParams, RequestStatus
        self.mgr, self._hasher = make_kv_cache_manager(self.num_blocks, self.bs)
        pool = self.mgr.block_pool
        self.pool = pool
        old = pool.free_block_queue
        self.queue = PolicyFreeQueue(pool.blocks, self.policy, self,
                                     [b.block_id for b in old.get_all_free_blocks()])
        pool.free_block_queue = self.queue
        self.free = self.queue.free          # the truly free blocks, as sim names them
        self.ref = RefView(pool.blocks)
        self.vreqs: dict[str, object] = {}
        self.key_copies: dict[int, int] = {}     # content key -> blocks holding it in vLLM
        self.lost: set[int] = set()              # content evicted with no copy left
        self._tokens: dict[int, list[int]] = {}
        self._cur: RequestState | None = None
        self._begun = False
        self._new: list[int] = []
        self._cached_now: list[tuple[int, int]] = []
        self._recompute = 0
        self._wrap_pool(pool)

    # -- vLLM hooks -----------------------------------------------------------
    def _wrap_pool(self, pool) -> None:
        """Observe the pool's calls so the policy sees vLLM's events in vLLM's order."""
        touch, get_new, cache_full = pool.touch, pool.get_new_blocks, pool.cache_full_blocks
        policy = self.policy

        def touched(blocks) -> None:
            self._begin()
            preq = self._cur.preq
            for pos, blk in enumerate(blocks):
                touch([blk])
                policy.on_hit(blk.block_id, preq, pos)

        def got_new(n: int):
            self._begin()
            out = get_new(n)
            ids = [b.block_id for b in out]
            r = self._cur
            for b in ids:
                self.owner[b] = r.gid
            self.occ_add(r.gid, len(ids))
            self._new.extend(ids)
            policy.on_allocated(r.preq, ids)
            return out

        def cached(request, blocks, num_cached_blocks, num_full_blocks, *args, **kwargs):
            cache_full(request, blocks, num_cached_blocks, num_full_blocks, *args, **kwargs)
            r = self._cur
            ev = r.ev
            base = r.ns << KEY_SHIFT
            key, copies, lost = self.key, self.key_copies, self.lost
            for pos in range(num_cached_blocks, num_full_blocks):
                b = blocks[pos].block_id
                k = base | ev.blocks[pos]
                key[b] = k
                copies[k] = copies.get(k, 0) + 1
                if k in lost:
                    lost.discard(k)
                    self._recompute += self.bs
                self._cached_now.append((b, k))
                policy.on_cached(b, r.preq, pos, blocks[pos - 1].block_id if pos else -1, k)

        pool.touch, pool.get_new_blocks, pool.cache_full_blocks = touched, got_new, cached

    def _begin(self) -> None:
        """on_admit, once, when vLLM first acts for the request: a request vLLM turns
        away (no room) never reaches the policy, as in sim."""
        if not self._begun:
            self._begun = True
            self.policy.on_admit(self._cur.preq, self.now)

    def context(self):
        return (self._cur.preq if self._cur is not None else None), self.now

    def reclaim_first(self, num_blocks: int) -> int:
        return self.policy.reclaim_first(self._cur.preq, num_blocks)

    def evicting(self, d: Decision) -> None:
        self.evict(d, self._cur)

    def released(self, block_ids: list[int]) -> None:
        owner = self.owner
        for b in block_ids:
            self.occ_add(owner[b], -1)
            owner[b] = -1

    def drop_content(self, v: int, k: int) -> None:
        n = self.key_copies[k] - 1
        if n:
            self.key_copies[k] = n
        else:
            del self.key_copies[k]
            self.lost.add(k)

    # -- the request lifecycle -------------------------------------------------
    def _vllm_request(self, r: RequestState):
        ev = r.ev
        vreq = self.vreqs.get(ev.id)
        if vreq is None:
            tokens = prompt_token_ids(ev, self.hashes.names, self.bs, self._tokens)
            vreq = self._Request(ev.id, tokens, self._SamplingParams(max_tokens=max(1, ev.out)),
                                 None, cache_salt=namespace_salt(ev.group, ev.scope),
                                 block_hasher=self._hasher)
            self.vreqs[ev.id] = vreq
        return vreq

    def try_admit(self, r: RequestState) -> str:
        ev = r.ev
        bs = self.bs
        preq = r.preq
        vreq = self._vllm_request(r)
        computed, num_hit_tokens, _ = self.mgr.get_computed_blocks(vreq)
        hit_blocks = list(computed.blocks[0])
        num_hits = num_hit_tokens // bs
        num_full = len(ev.blocks)
        num_new = r.num_total - num_hits
        preq.num_new_full_blocks = num_full - num_hits
        evictable_hits = sum(1 for b in hit_blocks if b.ref_cnt == 0)
        if not self.policy.admission_allowed(preq, num_new, evictable_hits):
            return "quota"
        self._cur, self._begun = r, False
        self._new, self._cached_now, self._recompute = [], [], 0
        got = self.mgr.allocate_slots(vreq, vreq.num_tokens - num_hit_tokens,
                                      num_new_computed_tokens=num_hit_tokens,
                                      new_computed_blocks=computed,
                                      num_lookahead_tokens=ev.out)
        if got is None:
            if self._begun:
                raise PolicyFault(f"{self.where(r)}: vLLM refused the allocation after "
                                  f"it had started")
            self._cur = None
            return "nofit"
        self._begin()
        vreq.status = self._Status.RUNNING
        vreq.num_computed_tokens = vreq.num_tokens
        blocks = list(self.mgr.get_block_ids(ev.id)[0])
        hits = [b.block_id for b in hit_blocks]
        if len(blocks) != r.num_total or blocks[:num_hits] != hits:
            raise PolicyFault(f"{self.where(r)}: vLLM gave the request {len(blocks)} blocks, "
                              f"the replay model expects {r.num_total} "
                              f"(ceil((prompt + out) / block_size))")
        r.blocks = blocks
        note = self.policy.end_admit(preq, self.now)
        max_hits = min((ev.prompt_tokens - 1) // bs, num_full)
        self.admitted(r, hits, self._new, self._cached_now, max_hits, self._recompute, note)
        self._cur = None
        return "ok"

    def release(self, r: RequestState, state: str) -> None:
        vreq = self.vreqs.pop(r.ev.id)
        vreq.status = self._Status.FINISHED_STOPPED
        self._cur = r
        self.mgr.free(vreq)      # -> queue.prepend_n (uncached), queue.append_n (cached)
        self._cur = None
        self.request_released(r, state)

    def finalize(self, r: RequestState) -> None:
        self.vreqs.pop(r.ev.id, None)    # rejected or dropped: vLLM holds nothing for it
        super().finalize(r)

