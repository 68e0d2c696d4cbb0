"""Capacity curves: hit fraction against cache capacity, per group and per role.

Replay model (the one configuration every point is computed under, recorded in the
output as ``replay_model``): ``psgate replay --engine sim --scheduler service`` with the
instant cost model (every coefficient 0: prefill and decode take no modeled time), so a
request holds its blocks from its arrival until its ``done_t`` (or its done or cancel
event; without either, it releases at its arrival instant, before any later event).

For lru the whole curve is ONE pass over the trace, exact (equal, per request, to
``psgate replay`` under that model at each capacity):

  - in that model nothing about timing depends on capacity (which requests run when,
    which contents they pin, in which order contents are looked up and freed), as long as
    no admission waits for blocks: the capacity must hold the peak pinned demand;
  - vLLM's pool then holds the pinned blocks plus the most recently freed unpinned
    contents, and lru evicts the least recently freed first (a request frees its blocks
    last first). The list L of unpinned contents ordered by last free time is the same at
    every capacity, and at capacity c the cached unpinned contents are exactly the first
    C_c of L, where C_c (how many there are) follows the pool's bookkeeping: an admission
    pins its hits (leaving L) and takes truly free blocks before evicting
    (C_c = min(C_c - unpinned hits, usable - pinned)), a release puts its cached blocks
    back (C_c += their number); uncached blocks (the tail, the generated tokens: the
    service model caches prompt blocks only) become truly free;
  - so a request's hit at capacity c is the longest prefix of its blocks each pinned or of
    rank < C_c in L, capped at ``(prompt_tokens - 1) // block_size`` blocks as the replay
    caps it. Ranks come from one array of free times shared by every capacity.

Where a capacity leaves that model the point is computed by a replay under the same
configuration instead, and the point says why: the capacity is below the peak pinned
demand (an admission would wait, or a request would be rejected), or the pool would hold
two copies of one content (a prompt whose last, capped block is cached, or a block
looked up past a miss that another request holds), which a content-level list cannot
represent. Other policies are one replay per capacity (``workers`` processes).
"""

from __future__ import annotations

import heapq
import math
import tempfile
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

try:
    import numpy as np          # psgate[curve]: the one pass is vectorized over capacities
except ImportError:             # pragma: no cover - exercised by a test that hides it
    np = None

from psgate import api
from psgate.engines.cost import CostModel
from psgate.engines.pool import MAX_BLOCKS
from psgate.errors import EngineUnavailable, InputError
from psgate.executors import check_executor, run_ray
from psgate.policies import resolve
from psgate.trace.model import CancelEvent, RequestEvent
from psgate.trace.reader import HashTable, TraceReader, TraceSource, validate_trace

CURVE_FORMAT = 1
# Zero service time: each request holds its blocks exactly from t to its release.
INSTANT = CostModel(0.0, 0.0, 0.0, 0.0)
REPLAY_MODEL = {"engine": "sim", "scheduler": "service",
                "cost": {"fixed_ms": 0.0, "per_uncached_token_ms": 0.0,
                         "per_cached_token_ms": 0.0, "per_output_token_ms": 0.0,
                         "per_uncached_token_sq_ms": 0.0, "per_uncached_cached_token_ms": 0.0},
                "command": "psgate replay --scheduler service --cost-param fixed_ms=0 "
                           "--cost-param per_uncached_token_ms=0 --cost-param "
                           "per_cached_token_ms=0 --cost-param per_output_token_ms=0"}
DEFAULT_POINTS = 12
MAX_POINTS = 1000
METRICS = ("hit_fraction", "token_hit_ratio", "saved_prefill_tokens", "measured_requests")
BELOW_PEAK = "below the peak pinned demand: computed by replay"
COPIES = "two copies of one content in the pool: computed by replay"
_INF = 1 << 62


# -- input ------------------------------------------------------------------------------

def parse_capacities(spec: str) -> list[int]:
    """``LO:HI`` (LO, 2 LO, 4 LO ... up to HI, and HI), ``LO:HI:N`` (N points spaced
    geometrically, rounded) or ``A,B,C`` (those); increasing, each at least 2."""
    text = spec.strip()
    where = "--capacities"
    try:
        if ":" in text:
            parts = [int(p) for p in text.split(":")]
            if len(parts) not in (2, 3):
                raise ValueError
            lo, hi = parts[0], parts[1]
            if lo < 2 or hi <= lo:
                raise InputError(f"expected LO:HI with 2 <= LO < HI, found '{spec}'", path=where)
            if len(parts) == 3:
                n = parts[2]
                if not 2 <= n <= MAX_POINTS:
                    raise InputError(f"expected 2..{MAX_POINTS} points, found {n}", path=where)
                caps = sorted({round(lo * (hi / lo) ** (i / (n - 1))) for i in range(n)})
                caps[0], caps[-1] = lo, hi
            else:
                caps = []
                c = lo
                while c < hi:
                    caps.append(c)
                    c *= 2
                caps.append(hi)
        else:
            caps = [int(p) for p in text.split(",")]
    except ValueError:
        raise InputError(f"expected LO:HI, LO:HI:N or a comma list of integers, found "
                         f"'{spec}'", path=where) from None
    if not caps:
        raise InputError("expected at least one capacity", path=where)
    if any(c < 2 for c in caps):
        raise InputError(f"expected capacities of at least 2 configured blocks (one is vLLM's "
                         f"null block), found {min(caps)}", path=where)
    if any(b <= a for a, b in zip(caps, caps[1:])):
        raise InputError(f"expected increasing capacities, found '{spec}'", path=where)
    if caps[-1] > MAX_BLOCKS:
        raise InputError(f"expected at most {MAX_BLOCKS} configured blocks, found {caps[-1]}",
                         path=where)
    if len(caps) > MAX_POINTS:
        raise InputError(f"expected at most {MAX_POINTS} capacities, found {len(caps)}",
                         path=where)
    return caps


def parse_policies(spec: str) -> list[str]:
    names = [p.strip() for p in spec.split(",") if p.strip()]
    if not names:
        raise InputError("expected at least one policy", path="--policy")
    if len(set(names)) != len(names):
        raise InputError(f"policy named twice in '{spec}'", path="--policy")
    for name in names:
        resolve(name, "--policy")          # unknown policy: InputError
    return names


def check_target(target: float) -> float:
    if not (isinstance(target, (int, float)) and math.isfinite(target) and 0 < target <= 1):
        raise InputError(f"expected a hit fraction in (0, 1], found {target}", path="--target")
    return float(target)


# -- the one pass -----------------------------------------------------------------------

class _Scope:
    """Sums over one scope's measured requests, one entry per capacity."""

    def __init__(self, k: int) -> None:
        self.frac = np.zeros(k)
        self.cached = np.zeros(k, dtype=np.int64)
        self.prompt = 0
        self.n = 0

    def add(self, cached: np.ndarray, prompt: int) -> None:
        self.frac += cached / prompt
        self.cached += cached
        self.prompt += prompt
        self.n += 1

    def point(self, i: int) -> dict:
        n, p = self.n, self.prompt
        return {"hit_fraction": round(float(self.frac[i]) / n, 6) if n else None,
                "token_hit_ratio": round(int(self.cached[i]) / p, 6) if p else None,
                "saved_prefill_tokens": int(self.cached[i]), "measured_requests": n}


@dataclass
class _Running:
    ids: np.ndarray
    num_total: int
    release_ns: int
    admit_ns: int
    t_ns: int


def _load(trace: str):
    hashes = HashTable()
    header, summary = validate_trace(trace, hashes)
    with TraceReader(TraceSource.resolve(trace), hashes, validated=summary) as reader:
        events = list(reader.events())
    return header, summary, hashes, events


def lru_one_pass(trace: str, capacities: list[int]) -> dict:
    """lru's curve in one pass: per capacity the totals, groups and roles, and which
    capacities the pass could not answer (``inexact``: capacity -> reason)."""
    header, summary, hashes, events = _load(trace)
    bs = header.block_size
    k = len(capacities)
    usable = np.array(capacities, dtype=np.int64) - 1
    num_hashes = max(1, len(hashes.names))

    # Dense content ids: (namespace, hash) numbered over the whole trace.
    ns_ids: dict[tuple[str, str], int] = {}
    reqs = [ev for ev in events if type(ev) is RequestEvent]
    keys = []
    for ev in reqs:
        ns = ns_ids.setdefault((ev.group, ev.scope), len(ns_ids))
        keys.append(np.asarray(ev.blocks, dtype=np.int64) + ns * num_hashes)
    lengths = [len(x) for x in keys]
    if keys and sum(lengths):
        uniq, inverse = np.unique(np.concatenate(keys), return_inverse=True)
        num_ids = len(uniq)
        split = np.split(inverse.astype(np.int64), np.cumsum(lengths)[:-1])
    else:
        num_ids = 0
        split = [np.zeros(0, dtype=np.int64) for _ in reqs]
    ids_of = {id(ev): ids for ev, ids in zip(reqs, split)}

    ref = np.zeros(num_ids, dtype=np.int64)       # pins (running requests holding it)
    seen = np.zeros(num_ids, dtype=bool)          # ever cached (at an unbounded capacity)
    ts = np.full(num_ids, -1, dtype=np.int64)     # its place in L (free order)
    alive = np.zeros(sum(lengths) + 1, dtype=np.int8)   # free order -> still in L
    t_next = 0
    window = 1 << 16

    cand = np.zeros(k, dtype=np.int64)            # C_c: cached unpinned blocks
    pinned = np.zeros(k, dtype=np.int64)          # pinned blocks
    exact = np.ones(k, dtype=bool)
    below = np.zeros(k, dtype=bool)
    pinned_inf = peak = 0

    totals = _Scope(k)
    groups: dict[str, _Scope] = {}
    roles: dict[str, _Scope] = {}

    def ranks_of(t_arr: np.ndarray, most: int) -> np.ndarray:
        """Each free time's rank in L (0: most recently freed); _INF where it is at least
        ``most`` (no capacity asks further)."""
        nonlocal window
        while True:
            lo = max(0, t_next - window)
            part = alive[lo:t_next]
            total = int(part.sum(dtype=np.int64))
            if total >= most or lo == 0:
                break
            window *= 2
        after = total - np.cumsum(part, dtype=np.int64)      # alive strictly after each
        out = np.full(len(t_arr), _INF, dtype=np.int64)
        inside = t_arr >= lo
        out[inside] = after[t_arr[inside] - lo]
        return out

    heap: list[tuple[int, int, str]] = []
    running: dict[str, _Running] = {}
    seq = 0
    done_ids = summary.done_ids

    def release(rid: str) -> None:
        nonlocal t_next, pinned_inf, cand, pinned
        r = running.pop(rid)
        ids = r.ids
        m = len(ids)
        n = 0
        if m:
            np.subtract.at(ref, ids, 1)
            back = ids[::-1]
            back = back[ref[back] == 0]
            n = len(back)
            if n:
                ts[back] = np.arange(t_next, t_next + n)
                alive[t_next:t_next + n] = 1
                t_next += n
        freed = (r.num_total - m) + n
        pinned -= freed
        cand += n
        pinned_inf -= freed

    def advance(t: int) -> None:
        while heap and heap[0][0] <= t:
            tc = heap[0][0]
            while heap and heap[0][0] == tc:
                _, _, rid = heapq.heappop(heap)
                r = running.get(rid)
                if r is not None and r.release_ns == tc:
                    release(rid)

    def schedule(rid: str, at: int, now: int) -> None:
        r = running[rid]
        r.release_ns = max(at, now)
        heapq.heappush(heap, (r.release_ns, seqs[rid], rid))

    seqs: dict[str, int] = {}
    now = 0
    for ev in events:
        advance(ev.t_ns)
        now = max(now, ev.t_ns)
        et = type(ev)
        if et is CancelEvent:
            if ev.id in running:
                release(ev.id)
            continue
        if et is not RequestEvent:                 # a done event
            r = running.get(ev.id)
            if r is not None:
                schedule(ev.id, max(r.admit_ns + (ev.t_ns - r.t_ns), r.admit_ns), now)
                advance(now)
            continue
        ids = ids_of[id(ev)]
        m = len(ids)
        num_total = -(-(ev.prompt_tokens + ev.out) // bs)
        max_hits = min((ev.prompt_tokens - 1) // bs, m)
        if m:
            rf = ref[ids]
            raw = np.full(m, _INF, dtype=np.int64)
            pin = rf > 0
            raw[pin] = -1
            free = seen[ids] & ~pin
            if free.any():
                raw[free] = ranks_of(ts[ids[free]], int(cand[exact].max(initial=0)) + 1)
            if max_hits:
                head = np.maximum.accumulate(raw[:max_hits])
                hits = np.searchsorted(head, cand, side="left")
                pinned_before = np.concatenate(([0], np.cumsum(pin[:max_hits])))[hits]
            else:
                hits = np.zeros(k, dtype=np.int64)
                pinned_before = hits
            tail_min = np.append(np.minimum.accumulate(raw[::-1])[::-1], _INF)
            copies = tail_min[hits] < cand            # a live content past the hits
            if (free | pin).any() and len(np.unique(ids)) != m:
                copies[:] = True
            inf_pins = int(np.count_nonzero(pin))
        else:
            hits = pinned_before = np.zeros(k, dtype=np.int64)
            copies = np.zeros(k, dtype=bool)
            free = None
            inf_pins = 0
        after = pinned + num_total - pinned_before
        over = (after > usable) | (num_total > usable)
        below |= over & exact
        exact &= ~(over | copies)
        unpinned_hits = hits - pinned_before
        cand = np.minimum(cand - unpinned_hits, usable - after)
        pinned = after
        pinned_inf += num_total - inf_pins
        peak = max(peak, pinned_inf)
        if m:
            if free is not None and free.any():
                alive[ts[ids[free]]] = 0
            np.add.at(ref, ids, 1)
            seen[ids] = True
        # the request runs: its release, as the service model schedules it
        seqs[ev.id] = seq
        seq += 1
        running[ev.id] = _Running(ids, num_total, -1, now, ev.t_ns)
        if ev.done_ns is not None:
            schedule(ev.id, max(now + (ev.done_ns - ev.t_ns), now), now)
        elif ev.id not in done_ids:
            schedule(ev.id, now, now)
        group = groups.get(ev.group)
        if group is None:
            group = groups[ev.group] = _Scope(k)
        role = None
        if ev.role is not None:
            role = roles.get(ev.role)
            if role is None:
                role = roles[ev.role] = _Scope(k)
        if ev.measure:
            cached = hits * bs
            totals.add(cached, ev.prompt_tokens)
            group.add(cached, ev.prompt_tokens)
            if role is not None:
                role.add(cached, ev.prompt_tokens)

    points = []
    for i, c in enumerate(capacities):
        points.append({"capacity": c, "usable_blocks": c - 1, "totals": totals.point(i),
                       "groups": {g: groups[g].point(i) for g in sorted(groups)},
                       "roles": {r: roles[r].point(i) for r in sorted(roles)}})
    inexact = {c: (BELOW_PEAK if below[i] else COPIES)
               for i, c in enumerate(capacities) if not exact[i]}
    return {"points": points, "inexact": inexact, "peak_pinned_blocks": peak}


# -- replays ----------------------------------------------------------------------------

def replay_point(trace: str, policy: str, capacity: int) -> dict:
    """One capacity's point by ``api.replay`` under the curve's replay model (the policy
    as both runs; the output directory is a temporary one, removed after)."""
    with tempfile.TemporaryDirectory(prefix="psgate-curve-") as tmp:
        cfg = api.ReplayConfig(trace=trace, baseline=policy, candidate=policy,
                               capacity=capacity, scheduler="service", cost=INSTANT,
                               out=Path(tmp) / "out", ledger_rows="evictions",
                               ledger_compression="compact")
        receipt = api.replay(cfg).receipt
    run = receipt["runs"]["candidate"]
    m = run["metrics"]

    def pick(d: dict) -> dict:
        return {"hit_fraction": d["hit_fraction"], "token_hit_ratio": d["token_hit_ratio"],
                "saved_prefill_tokens": d["saved_prefill_tokens"],
                "measured_requests": d["measured_requests"]}

    return {"capacity": capacity, "usable_blocks": capacity - 1, "totals": pick(m["totals"]),
            "groups": {g: pick(v) for g, v in sorted(m["groups"].items())},
            "roles": {r: pick(v) for r, v in sorted(m["roles"].items())},
            "aborted": run["aborted"]}


def _replay_all(trace: str, jobs: list[tuple[str, int]], workers: int, executor: str,
                address: str | None) -> list[dict]:
    """Every (policy, capacity) job's point, in the jobs' order whatever the executor."""
    if executor == "ray" and jobs:
        got: dict[int, dict] = {}
        run_ray(replay_point, [(trace, p, c) for p, c in jobs], workers, address,
                got.__setitem__)
        return [got[i] for i in range(len(jobs))]
    if workers <= 1 or len(jobs) <= 1:
        return [replay_point(trace, p, c) for p, c in jobs]
    with ProcessPoolExecutor(max_workers=min(workers, len(jobs))) as pool:
        futures = [pool.submit(replay_point, trace, p, c) for p, c in jobs]
        return [f.result() for f in futures]


# -- the curve --------------------------------------------------------------------------

def target_capacities(points: list[dict], target: float) -> dict:
    """The smallest capacity whose hit fraction reaches ``target``: overall, per group,
    per role (None where no capacity does)."""
    def first(get) -> int | None:
        for p in points:
            v = get(p)
            if v is not None and v >= target:
                return p["capacity"]
        return None

    names_g = sorted({g for p in points for g in p["groups"]})
    names_r = sorted({r for p in points for r in p["roles"]})
    return {"totals": first(lambda p: p["totals"]["hit_fraction"]),
            "groups": {g: first(lambda p, g=g: p["groups"].get(g, {}).get("hit_fraction"))
                       for g in names_g},
            "roles": {r: first(lambda p, r=r: p["roles"].get(r, {}).get("hit_fraction"))
                      for r in names_r}}


def capacity_curve(trace: str, policies: list[str], capacities: list[int],
                   target: float = 0.5, workers: int = 1, executor: str = "local",
                   address: str | None = None) -> dict:
    """The curve document (JSON-ready, deterministic: no time, no path other than the
    trace as given, and the same whichever executor ran the replays)."""
    if np is None:
        raise EngineUnavailable("psgate curve computes with numpy, which is not installed; "
                                "install it with: pip install 'psgate[curve]'")
    check_target(target)
    check_executor(executor, workers)
    out: dict = {"psgate_curve": CURVE_FORMAT, "trace": trace, "replay_model": REPLAY_MODEL,
                 "capacities": capacities, "target": target, "policies": {}}
    one_pass: dict[str, dict] = {}
    jobs: list[tuple[str, int]] = []
    for policy in policies:
        if policy == "lru":
            one = lru_one_pass(trace, capacities)
            one_pass[policy] = one
            jobs += [(policy, c) for c in capacities if c in one["inexact"]]
        else:
            jobs += [(policy, c) for c in capacities]
    replayed = dict(zip(jobs, _replay_all(trace, jobs, workers, executor, address)))
    for policy in policies:
        one = one_pass.get(policy)
        points = []
        for i, c in enumerate(capacities):
            if one is not None and c not in one["inexact"]:
                p = dict(one["points"][i], method="one-pass")
            else:
                p = dict(replayed[(policy, c)], method="replay")
                if one is not None:
                    p["reason"] = one["inexact"][c]
            points.append(p)
        entry = {"method": "one-pass" if one is not None else "replay per capacity",
                 "points": points, "target_capacity": target_capacities(points, target)}
        if one is not None:
            entry["peak_pinned_blocks"] = one["peak_pinned_blocks"]
            entry["min_one_pass_capacity"] = one["peak_pinned_blocks"] + 1
        out["policies"][policy] = entry
    return out


def csv_rows(curve: dict) -> list[list]:
    """One row per policy, capacity and scope (totals, each group, each role)."""
    rows: list[list] = [["policy", "capacity", "method", "scope", "name", *METRICS]]
    for policy, entry in curve["policies"].items():
        for p in entry["points"]:
            scopes = [("totals", "", p["totals"])]
            scopes += [("group", g, v) for g, v in p["groups"].items()]
            scopes += [("role", r, v) for r, v in p["roles"].items()]
            for scope, name, v in scopes:
                rows.append([policy, p["capacity"], p["method"], scope, name,
                             *(v.get(mt) for mt in METRICS)])
    return rows
