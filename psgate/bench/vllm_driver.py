"""vLLM's side of the replay ratios: the same trace through vLLM's own KVCacheManager,
here or in another interpreter (``--vllm-python``)."""

from __future__ import annotations

import gc
import heapq
import json
import subprocess
from pathlib import Path

from psgate.bench.memory import child_env
from psgate.bench.timing import CLOCK
from psgate.bench.traces import Loaded, load
from psgate.trace.model import RequestEvent


def vllm_status() -> tuple[str | None, str | None]:
    """(version, None) when vLLM imports here, else (None, why not)."""
    from psgate.engines.vllm_pool import vllm_version
    from psgate.errors import EngineUnavailable
    try:
        return vllm_version("bench"), None
    except EngineUnavailable as exc:
        msg = str(exc)
        return None, ("vLLM not installed" if "not installed" in msg else msg)


def vllm_replay(loaded: Loaded, capacity: int, prebuilt: bool) -> tuple[float, int]:
    """Seconds to replay the trace through vLLM's own KVCacheManager (native LRU), as a
    script driving vLLM would, and the prefix-hit blocks it found. ``prebuilt``: the
    ``Request`` objects (and their block hashes) are made before the clock starts."""
    from vllm import SamplingParams
    from vllm.v1.request import Request, RequestStatus

    from psgate.engines.vllm_pool import (make_kv_cache_manager, namespace_salt,
                                          prompt_token_ids)
    bs = loaded.header.block_size
    names = loaded.hashes.names
    cache: dict[int, list[int]] = {}
    reqs = []
    for ev in loaded.events:
        if type(ev) is not RequestEvent:
            raise ValueError("the bench's vLLM driver replays request lines only")
        tokens = prompt_token_ids(ev, names, bs, cache)
        reqs.append((ev.t_ns, ev.done_ns, ev.id, tokens, ev.out,
                     namespace_salt(ev.group, ev.scope)))
    mgr, hasher = make_kv_cache_manager(capacity, bs)
    running, finished = RequestStatus.RUNNING, RequestStatus.FINISHED_STOPPED

    def build(r):
        return Request(r[2], r[3], SamplingParams(max_tokens=max(1, r[4])), None,
                       cache_salt=r[5], block_hasher=hasher)

    built = [build(r) for r in reqs] if prebuilt else None
    heap: list = []
    hit_tokens = 0
    gc.collect()
    t0 = CLOCK()
    for i, r in enumerate(reqs):
        now = r[0]
        while heap and heap[0][0] <= now:
            v = heapq.heappop(heap)[2]
            v.status = finished
            mgr.free(v)
        v = built[i] if prebuilt else build(r)
        computed, n_hit, _ = mgr.get_computed_blocks(v)
        got = mgr.allocate_slots(v, v.num_tokens - n_hit, num_new_computed_tokens=n_hit,
                                 new_computed_blocks=computed, num_lookahead_tokens=r[4])
        if got is None:
            raise RuntimeError(f"vLLM had no room for {r[2]}; bench traces never wait")
        v.status = running
        v.num_computed_tokens = v.num_tokens
        heapq.heappush(heap, (r[1], i, v))
        hit_tokens += n_hit
    while heap:
        v = heapq.heappop(heap)[2]
        v.status = finished
        mgr.free(v)
    return CLOCK() - t0, hit_tokens // bs


def vllm_measure(trace: Path, capacity: int, repeats: int) -> dict:
    """vLLM's two timings on one trace, ``repeats`` times each, after one untimed pass of
    each (a fresh process's first replay pays for warming up, as sim's first round in
    the bench process does not)."""
    version, why = vllm_status()
    if version is None:
        return {"version": None, "note": why}
    loaded = load(trace)
    vllm_replay(loaded, capacity, prebuilt=False)
    vllm_replay(loaded, capacity, prebuilt=True)
    e2e, loop, hits = [], [], set()
    for _ in range(repeats):
        t, h = vllm_replay(loaded, capacity, prebuilt=False)
        e2e.append(t)
        hits.add(h)
        t, h = vllm_replay(loaded, capacity, prebuilt=True)
        loop.append(t)
        hits.add(h)
    return {"version": version, "note": None, "e2e_s": e2e, "loop_s": loop,
            "hit_blocks": sorted(hits)}


def merge_vllm(acc: dict, one: dict) -> dict:
    """Rounds of vLLM measurements as one: the first round that could not measure wins."""
    if not acc:
        return dict(one)
    if not acc.get("version") or not one.get("version"):
        return acc if not acc.get("version") else dict(one)
    return {"version": acc["version"], "note": None, "e2e_s": acc["e2e_s"] + one["e2e_s"],
            "loop_s": acc["loop_s"] + one["loop_s"],
            "hit_blocks": sorted(set(acc["hit_blocks"]) | set(one["hit_blocks"]))}


def vllm_in_child(python: str, trace: Path, capacity: int, repeats: int) -> dict:
    proc = subprocess.run([python, "-m", "psgate.bench", "--vllm-child", str(trace),
                           str(capacity), str(repeats)], capture_output=True, text=True,
                          env=child_env())
    if proc.returncode != 0:
        return {"version": None,
                "note": f"{python} failed: {proc.stderr.strip().splitlines()[-1:] or ['?']}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])
