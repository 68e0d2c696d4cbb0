"""A small, slow, independent reference model of vLLM's block pool and psgate's
replay model, for differential tests against the sim engine.

It keeps vLLM's single free queue as one Python list (truly free and cached
blocks together, popped from the front) instead of sim's split between truly
free blocks and a policy's candidate queue, and replays plain JSON dicts with
its own event loop. Supports requests with or without done_t, and cancels;
not done events or quotas.
"""

from __future__ import annotations

import heapq
import math

NS = 1_000_000_000


def reference_replay(lines: list[dict], capacity: int, fixed_ms=5.0, uncached_ms=0.06,
                     cached_ms=0.002, out_ms=10.0) -> dict:
    header, events = lines[0], lines[1:]
    bs = header["block_size"]
    usable = capacity - 1
    queue = list(range(1, capacity))          # vLLM's free block queue, front first
    content: dict[int, tuple] = {}            # block -> (ns, hash)
    table: dict[tuple, list[int]] = {}        # (ns, hash) -> blocks, insertion order
    ref = [0] * capacity
    evictions: list[str] = []
    out: dict[str, dict] = {}
    waiting: list[dict] = []
    running: dict[str, dict] = {}
    heap: list = []
    state = {"server": None, "seq": 0, "now": None}

    def to_ns(t):
        return round(t * NS)

    def lookup_hits(r):
        ns = (r["group"], r["scope"])
        prompt = len(r["blocks"]) * bs + r["tail"]
        hits = []
        for h in r["blocks"][: (prompt - 1) // bs]:
            blocks = table.get((ns, h))
            if not blocks:
                break
            hits.append(blocks[0])
        return hits

    def try_admit(r, now):
        prompt = len(r["blocks"]) * bs + r["tail"]
        total = math.ceil((prompt + r["out"]) / bs)
        hits = lookup_hits(r)
        need = total - len(hits)
        evictable_hits = sum(1 for b in hits if ref[b] == 0)
        if need + evictable_hits > len(queue):
            return False
        for b in hits:
            if ref[b] == 0:
                queue.remove(b)
            ref[b] += 1
        new = queue[:need]
        del queue[:need]
        for b in new:
            if b in content:
                key = content.pop(b)
                table[key].remove(b)
                if not table[key]:
                    del table[key]
                evictions.append(f"{key[0][0]}:{key[1]}")
            ref[b] = 1
        blocks = hits + new
        ns = (r["group"], r["scope"])
        for pos in range(len(hits), len(r["blocks"])):
            key = (ns, r["blocks"][pos])
            content[blocks[pos]] = key
            table.setdefault(key, []).append(blocks[pos])
        cached = len(hits) * bs
        prefill = fixed_ms + uncached_ms * (prompt - cached) + cached_ms * cached
        start = max(now, state["server"])
        first = start + round(prefill * 1e6)
        state["server"] = first
        t_ns = to_ns(r["t"])
        if "done_t" in r:
            release = max(now + (to_ns(r["done_t"]) - t_ns), first)
        else:
            release = first + round(r["out"] * out_ms * 1e6)
        o = out[r["id"]]
        o.update(state="running", cached_tokens=cached, blocks=blocks, first=first,
                 ttft_ns=first - t_ns, admit=now)
        running[r["id"]] = {"r": r, "blocks": blocks, "release": release}
        heapq.heappush(heap, (release, state["seq"], r["id"]))
        state["seq"] += 1
        return True

    def release(rid, now, final):
        run = running.pop(rid)
        uncached, cached = [], []
        for b in reversed(run["blocks"]):
            ref[b] -= 1
            if ref[b] == 0:
                (cached if b in content else uncached).append(b)
        queue[:0] = uncached
        queue.extend(cached)
        o = out[rid]
        o["state"] = final
        o["release"] = now
        if final == "cancelled" and now < o["first"]:
            o["ttft_ns"] = None

    def admit_waiting(now):
        while waiting and try_admit(waiting[0], now):
            waiting.pop(0)

    def advance(t):
        while heap and heap[0][0] <= t:
            tc = heap[0][0]
            while heap and heap[0][0] == tc:
                _, _, rid = heapq.heappop(heap)
                if rid in running and running[rid]["release"] == tc:
                    release(rid, tc, "completed")
            state["now"] = tc
            admit_waiting(tc)
        state["now"] = max(state["now"], t)

    for ev in events:
        t = to_ns(ev["t"])
        if state["now"] is None:
            state["now"] = state["server"] = t
        advance(t)
        now = state["now"]
        if ev["op"] == "request":
            prompt = len(ev["blocks"]) * bs + ev["tail"]
            out[ev["id"]] = {"state": "waiting", "cached_tokens": 0}
            if math.ceil((prompt + ev["out"]) / bs) > usable:
                out[ev["id"]]["state"] = "rejected"
                continue
            if waiting or not try_admit(ev, now):
                waiting.append(ev)
        elif ev["op"] == "cancel":
            rid = ev["id"]
            if rid in running:
                release(rid, now, "cancelled")
                admit_waiting(now)
            elif any(w["id"] == rid for w in waiting):
                waiting[:] = [w for w in waiting if w["id"] != rid]
                out[rid]["state"] = "dropped"
                admit_waiting(now)
    advance(1 << 62)
    return {"requests": out, "evictions": evictions}
