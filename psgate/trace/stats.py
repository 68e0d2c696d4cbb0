"""trace stats: what a trace asks of a cache, before any policy runs.

- requests, groups, scopes, block references and unique blocks (per namespace);
- the infinite-cache hit ratio: tokens a cache that never evicts would serve,
  with vLLM's rule that hits stop at ``prompt_tokens - 1`` (a fully cached prompt
  recomputes its last block), over all prompt tokens;
- the reuse-distance profile: for every repeated block reference, how many
  distinct blocks were referenced since its previous use (the LRU stack distance:
  an LRU cache of C blocks, pinning aside, hits the references with distance < C),
  as a histogram over powers of two;
- per group, the creation rate (blocks an infinite cache would materialize, per
  second of trace) against its contract's refill rate in PrefixShield's default
  table: the creation-pressure ratio.
"""

from __future__ import annotations

from psgate.contracts import DEFAULT_CONTRACTS
from psgate.trace.keys import KEY_SHIFT
from psgate.trace.model import RequestEvent
from psgate.trace.reader import (HashTable, TraceReader, TraceSource, corpus_traces,
                                 trace_directory)


class _Fenwick:
    def __init__(self, n: int) -> None:
        self.tree = [0] * (n + 1)

    def add(self, i: int, v: int) -> None:
        i += 1
        n = len(self.tree)
        while i < n:
            self.tree[i] += v
            i += i & -i

    def prefix(self, i: int) -> int:
        """Sum of positions 0..i (0 for i < 0)."""
        s = 0
        i += 1
        while i > 0:
            s += self.tree[i]
            i -= i & -i
        return s


def _checked_references(src: TraceSource, hashes: HashTable):
    """The validating pass: the trace's summary (done lines' answers included) and how
    many prompt block references it makes."""
    n = 0
    with TraceReader(src, hashes) as reader:
        for ev in reader.events():
            if type(ev) is RequestEvent:
                n += len(ev.blocks)
        return reader.summary(), n


def trace_stats(given: str) -> dict:
    """The statistics of one trace; for a directory (a corpus, a capture), each
    ``*.jsonl`` trace's under ``traces``, by path."""
    directory = trace_directory(given)
    if directory is not None:
        return {"path": given,
                "traces": {str(p): _one_trace_stats(str(p)) for p in corpus_traces(directory)}}
    return _one_trace_stats(given)


def _one_trace_stats(given: str) -> dict:
    src = TraceSource.resolve(given)
    hashes = HashTable()
    ns_ids: dict[tuple[str, str], int] = {}
    groups: dict[str, dict] = {}
    scopes: set[str] = set()
    seen: set[int] = set()
    last_pos: dict[int, int] = {}
    summary, num_refs = _checked_references(src, hashes)
    bit = _Fenwick(num_refs)
    hist: dict[int, int] = {}
    refs = 0
    first_refs = 0
    cached_tokens = prompt_tokens = 0
    requests = 0
    t_first = t_last = None
    answer_blocks = 0
    with TraceReader(src, hashes, validated=summary) as reader:
        header = reader.header
        bs = header.block_size
        for ev in reader.events():
            if t_first is None:
                t_first = ev.t_ns
            t_last = ev.t_ns
            if type(ev) is not RequestEvent:
                continue
            requests += 1
            scopes.add(ev.scope)
            g = groups.setdefault(ev.group, {"requests": 0, "created_blocks": 0,
                                             "contract": ev.contract})
            g["requests"] += 1
            ns = ns_ids.setdefault((ev.group, ev.scope), len(ns_ids))
            base = ns << KEY_SHIFT
            cap = (ev.prompt_tokens - 1) // bs
            hit = 0
            leading = True
            for pos, h in enumerate(ev.blocks):
                k = base | h
                if leading and k in seen and pos < cap:
                    hit += 1
                else:
                    leading = False
                # reuse distance over every reference
                p = refs
                prev = last_pos.get(k)
                if prev is None:
                    first_refs += 1
                else:
                    d = bit.prefix(p - 1) - bit.prefix(prev)
                    b = d.bit_length()          # bucket: [2^(b-1), 2^b)
                    hist[b] = hist.get(b, 0) + 1
                    bit.add(prev, -1)
                bit.add(p, 1)
                last_pos[k] = p
                refs += 1
                if k not in seen:
                    seen.add(k)
                    g["created_blocks"] += 1
            # an answer's blocks are cached while it decodes: a later prompt that re-sends
            # them hits (created by this group, referenced by no prompt yet)
            for h in ev.answer or ():
                k = base | h
                answer_blocks += 1
                if k not in seen:
                    seen.add(k)
                    g["created_blocks"] += 1
            cached_tokens += hit * bs
            prompt_tokens += ev.prompt_tokens
    span = max(1e-9, ((t_last or 0) - (t_first or 0)) / 1e9)
    per_group = {}
    for name in sorted(groups):
        g = groups[name]
        rate = g["created_blocks"] / span
        rho = DEFAULT_CONTRACTS.get(g["contract"], [None])[0]
        per_group[name] = {"requests": g["requests"], "contract": g["contract"],
                           "created_blocks": g["created_blocks"],
                           "creation_rate_blocks_per_s": round(rate, 3),
                           "refill_blocks_per_s": rho,
                           "creation_pressure_ratio": round(rate / rho, 3) if rho else None}
    profile = [{"distance_lt": 1 << b if b else 1, "distance_ge": (1 << (b - 1)) if b else 0,
                "references": n} for b, n in sorted(hist.items())]
    return {
        "trace": given, "block_size": bs, "requests": requests, "groups": len(groups),
        "scopes": len(scopes), "block_references": refs, "unique_blocks": len(seen),
        "first_references": first_refs, "answer_blocks": answer_blocks,
        "span_s": round(span, 6),
        "infinite_cache_hit_ratio": round(cached_tokens / prompt_tokens, 6)
        if prompt_tokens else None,
        "infinite_cache_cached_tokens": cached_tokens, "prompt_tokens": prompt_tokens,
        "reuse_distance_profile": profile, "per_group": per_group,
    }
