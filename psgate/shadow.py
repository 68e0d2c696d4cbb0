"""Shadow mode: what a candidate policy would have done, beside the live engine.

vLLM keeps its own eviction (native, or ``PSGATE_POLICY``); psgate runs the shadow
policy on a shadow cache of block identities only (a model-less vLLM
KVCacheManager of the same size, no KV tensors) driven by the live engine's
events:

    a request is admitted        -> the shadow looks its prompt up and admits it
    the request's blocks grow    -> the shadow grows it by as many blocks
    the request is freed         -> the shadow frees it

So the shadow sees the same requests at the same moments and differs only in
what it evicted. It caches prompt blocks only (the live engine also caches full
blocks of generated tokens), and a request it has no room for is counted
(``shadow_no_room``) and not run in the shadow. For every live allocation that
evicted, ``shadow-evictions.jsonl`` gets the groups whose blocks the live engine
evicted and those the shadow policy evicted for the same request; every
``interval_s`` a line of per-group totals goes to ``shadow.jsonl``, and a last one
(``"final": true``) at shutdown; at shutdown ``shadow-report.json`` states, per
tenant, hit tokens live vs shadow and the would-be difference.

Times are seconds since ``t0`` (the capture's zero when the plugin runs both). The
eviction lines are queued in memory and written every ``flush_s`` seconds, whole lines
in one write, by a thread of their own ("psgate-shadow"), so the scheduler thread never
waits on the disk (a write stalled by other I/O once held a step for a second); a
process killed outright loses at most that many seconds of them.
"""

from __future__ import annotations

import atexit
import json
import os
import threading
import time
from collections import deque
from pathlib import Path

from psgate.engines.vllm_live import LivePolicy, identify
from psgate.engines.vllm_pool import make_kv_cache_manager

_FIELDS = ("requests", "prompt_tokens", "live_hit_tokens", "shadow_hit_tokens",
           "live_evictions_suffered", "shadow_evictions_suffered", "shadow_no_room")


class ShadowRunner:
    def __init__(self, mgr, policy, directory: str | Path, *, live_policy: str = "native",
                 interval_s: float = 60.0, describe=identify, clock=time.monotonic,
                 t0: float | None = None, flush_s: float = 1.0) -> None:
        from vllm.v1.request import Request, RequestStatus
        self._Request, self._Status = Request, RequestStatus
        self.real = mgr
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.policy_name = policy.name
        self.policy_desc = policy.describe()
        self.live_policy = live_policy
        self.interval_s = interval_s
        self.describe = describe
        self.clock = clock
        self.t0 = clock() if t0 is None else t0
        self.flush_s = flush_s
        self._last_summary = self.clock() - self.t0
        self.bs = mgr.kv_cache_config.kv_cache_groups[0].kv_cache_spec.block_size
        num_blocks = len(mgr.block_pool.blocks)
        self.smgr, self._hasher = make_kv_cache_manager(num_blocks, self.bs)
        self.shadow = LivePolicy(self.smgr, policy, describe=describe, recorder=self,
                                 clock_ns=lambda: round((self.clock() - self.t0) * 1e9))
        self.sreqs: dict[str, object] = {}
        self.stats: dict[str, dict[str, int]] = {}
        self.owner: dict[int, str] = {}          # live block id -> group that cached it
        self._groups: dict[str, str] = {}        # live request id -> its group, while held
        self._same_hashes: bool | None = None    # live prompt hashes are the shadow's own
        # Blocks held per request id, read in place: the shadow grows a request only when
        # the live one holds more blocks, which a decode step rarely changes.
        self._live_blocks = mgr.coordinator.single_type_managers[0].req_to_blocks
        self._shadow_blocks = self.smgr.coordinator.single_type_managers[0].req_to_blocks
        self._cur_group: str | None = None
        self._batch_live: list[str] = []
        self._batch_shadow: list[str] = []
        self._evictions = _LineWriter(self.dir / "shadow-evictions.jsonl", flush_s)
        self._summaries = open(self.dir / "shadow.jsonl", "a", buffering=1)
        self._wrap(mgr, mgr.block_pool)
        self._closed = False
        atexit.register(self.close)

    def _group(self, g: str) -> dict[str, int]:
        s = self.stats.get(g)
        if s is None:
            s = self.stats[g] = dict.fromkeys(_FIELDS, 0)
        return s

    # -- the shadow's own evictions (LivePolicy recorder) ---------------------------------
    def eviction(self, now_ns, req, d, block, hash_name, owner) -> None:
        self._batch_shadow.append(owner)
        self._group(owner)["shadow_evictions_suffered"] += 1

    def admission(self, *args) -> None:
        pass

    # -- the live engine's calls ----------------------------------------------------------------
    def _wrap(self, mgr, pool) -> None:
        allocate, free = mgr.allocate_slots, mgr.free
        cache_full, evict = pool.cache_full_blocks, pool._maybe_evict_cached_block

        sreqs, groups = self.sreqs, self._groups

        def allocate_slots(request, *args, **kwargs):
            # Called for every running request in every step: the common decode step
            # (request known, nothing evicted, no new block) does only dictionary lookups.
            rid = request.request_id
            first = rid not in sreqs and request.num_computed_tokens == 0
            group = groups.get(rid)
            if group is None:
                group = groups[rid] = self.describe(request)[0]
            self._cur_group = group
            if self._batch_live:
                self._batch_live = []
            if self._batch_shadow:
                self._batch_shadow = []
            try:
                out = allocate(request, *args, **kwargs)
            finally:
                self._cur_group = None
            if out is not None:
                if first:
                    self._admit(request, group, kwargs.get(
                        "num_new_computed_tokens", args[1] if len(args) > 1 else 0))
                elif rid in sreqs:
                    self._grow(rid)
            now = self.clock() - self.t0
            if self._batch_live or self._batch_shadow:
                self._evictions.append(json.dumps(
                    {"t": round(now, 6), "request_group": group,
                     "live": self._batch_live, "shadow": self._batch_shadow}) + "\n")
            if now - self._last_summary >= self.interval_s:
                self._last_summary = now
                self._summary_line(now)
            return out

        def free_request(request):
            out = free(request)
            groups.pop(request.request_id, None)
            sreq = sreqs.pop(request.request_id, None)
            if sreq is not None:
                sreq.status = self._Status.FINISHED_STOPPED
                self.smgr.free(sreq)
            return out

        def cached(request, blocks, num_cached_blocks, num_full_blocks, *args, **kwargs):
            cache_full(request, blocks, num_cached_blocks, num_full_blocks, *args, **kwargs)
            g = self._cur_group or "unknown"
            for blk in blocks[num_cached_blocks:num_full_blocks]:
                self.owner[blk.block_id] = g

        def evicted(block):
            gone = evict(block)
            if gone:
                g = self.owner.pop(block.block_id, "unknown")
                self._batch_live.append(g)
                self._group(g)["live_evictions_suffered"] += 1
            return gone

        mgr.allocate_slots, mgr.free = allocate_slots, free_request
        pool.cache_full_blocks, pool._maybe_evict_cached_block = cached, evicted

    def _admit(self, request, group: str, live_hits: int) -> None:
        s = self._group(group)
        s["requests"] += 1
        s["prompt_tokens"] += request.num_prompt_tokens
        s["live_hit_tokens"] += live_hits
        sreq = self._shadow_request(request)
        computed, n_hit, _ = self.smgr.get_computed_blocks(sreq)
        got = self.smgr.allocate_slots(sreq, sreq.num_tokens - n_hit,
                                       num_new_computed_tokens=n_hit,
                                       new_computed_blocks=computed)
        if got is None:
            s["shadow_no_room"] += 1
            return
        sreq.status = self._Status.RUNNING
        sreq.num_computed_tokens = sreq.num_tokens
        s["shadow_hit_tokens"] += n_hit
        self.sreqs[request.request_id] = sreq
        self._grow(request.request_id)

    def _shadow_request(self, request):
        """The shadow's copy of a live request: its prompt only, same salt and adapter.

        Its block hashes are those vLLM's hasher gives the prompt with the cache salt and
        the LoRA name as extra keys (``kv_cache_utils.py:954-998``, ``:626-660``). The live
        request already holds them, computed by the same hasher unless the engine hashes
        with another function or block size, or adds multimodal or prompt-embedding keys
        the copy does not carry; so the first plain request is hashed both ways, and when
        the two agree the live hashes are reused from then on instead of hashing again."""
        plain = not request.mm_features and request.prompt_embeds is None
        reuse = plain and self._same_hashes
        sreq = self._Request(request.request_id, list(request.prompt_token_ids),
                             request.sampling_params, None, cache_salt=request.cache_salt,
                             lora_request=request.lora_request,
                             block_hasher=None if reuse else self._hasher)
        n = len(sreq.prompt_token_ids) // self.bs
        if reuse:
            sreq.block_hashes = request.block_hashes[:n]      # no token is ever added to it
        elif plain and self._same_hashes is None:
            self._same_hashes = (len(sreq.block_hashes) == n
                                 and request.block_hashes[:n] == sreq.block_hashes)
        return sreq

    def _grow(self, rid: str) -> None:
        """Give the shadow request as many blocks as the live one holds now."""
        missing = (len(self._live_blocks.get(rid, ()))
                   - len(self._shadow_blocks.get(rid, ())))
        if missing > 0:
            sreq = self.sreqs[rid]
            n = missing * self.bs
            if self.smgr.allocate_slots(sreq, n) is not None:
                sreq.num_computed_tokens += n

    # -- reports --------------------------------------------------------------------------------
    def _summary_line(self, now: float, **extra) -> None:
        self._summaries.write(json.dumps({"t": round(now, 3), "groups": self.stats, **extra},
                                         sort_keys=True) + "\n")

    def report(self) -> dict:
        groups = {}
        for g, s in sorted(self.stats.items()):
            p = s["prompt_tokens"]
            live = s["live_hit_tokens"] / p if p else None
            shadow = s["shadow_hit_tokens"] / p if p else None
            groups[g] = {**s, "live_token_hit_ratio": live, "shadow_token_hit_ratio": shadow,
                         "difference_pp": (None if p == 0
                                           else round(100 * (shadow - live), 3))}
        return {"psgate_shadow": 1, "live_policy": self.live_policy,
                "shadow_policy": self.policy_desc, "block_size": self.bs,
                "num_blocks": len(self.real.block_pool.blocks),
                "note": "hit tokens at admission, live engine vs shadow cache of block "
                        "identities; the shadow caches prompt blocks only",
                "groups": groups}

    def close(self) -> dict:
        if self._closed:
            return self.report()
        self._closed = True
        self._evictions.close()
        self._summary_line(self.clock() - self.t0, final=True)
        rep = self.report()
        tmp = self.dir / "shadow-report.json.part"
        tmp.write_text(json.dumps(rep, indent=1, sort_keys=True) + "\n")
        os.replace(tmp, self.dir / "shadow-report.json")
        self._summaries.close()
        return rep


class _LineWriter:
    """Lines appended on the scheduler thread (a deque append: one atomic C call, no
    wake-up), written and flushed every ``flush_s`` seconds by a daemon thread, and the
    rest at close."""

    def __init__(self, path: Path, flush_s: float) -> None:
        self._fh = open(path, "a")
        self._q: deque[str] = deque()
        self.append = self._q.append
        self._flush_s = flush_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="psgate-shadow", daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        q = self._q
        lines = [q.popleft() for _ in range(len(q))]
        if lines:
            self._fh.write("".join(lines))
            self._fh.flush()

    def _run(self) -> None:
        while not self._stop.wait(self._flush_s):
            self._drain()

    def close(self) -> None:
        if self._fh.closed:
            return
        self._stop.set()
        self._thread.join()
        self._drain()
        self._fh.close()
