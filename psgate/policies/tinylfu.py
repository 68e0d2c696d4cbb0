"""tinylfu: W-TinyLFU (Einziger, Friedman & Manes, ACM TOS 2017; Caffeine) over the
candidate blocks.

    c = usable blocks; window W (LRU), main = SLRU: probation P, protected R (LRU each)
    w = max(1, round(window_ratio x c))          window_ratio 0.01 (Caffeine's 1%)
    r = round(protected_ratio x (c - w))         protected_ratio 0.8 (Caffeine's 80%)
    sketch: count-min, depth 4, width 4 x next_pow2(c) 4-bit counters per row
            (Caffeine's table: next_pow2(c) longs of 16 counters); after
            W = sample_factor x c recorded accesses (10, Caffeine's sample size) every
            counter and the sample count are halved (the paper's reset)

    on_cached(b, key):  record(key); b -> W
    on_hit(b):          record(key(b)); b in P -> R
    rebalance (after a batch is cached and after each release):
        while |W| > w and |P| + |R| < c - w:  W's LRU candidate -> P (main has room)
        while |R| > r:                         R's LRU candidate -> P (demotion)
    evict():   (j = evictions already made in this allocation batch)
        C = W's LRU candidate; V = P's LRU candidate, else R's
        if C and |W| + j + 1 > w:        the block to come pushes C out of the window:
            if V and est(C) > est(V):    V evicted, C -> P     (C admitted; "candidate" won)
            elif V:                      C evicted             (C rejected; "victim" won)
            else:                        C evicted
        else:                            V evicted (else C)

Adapting the paper's object cache to a block pool (choices made here):

- Every computed block is cached (vLLM caches it; nothing can refuse it), so TinyLFU's
  admission is applied where the paper applies it, when the window's LRU block would
  leave the window for a full main: at eviction time. The engine evicts *before* it
  caches the batch that needs the room, so each eviction of a batch stands for one
  incoming block (the counter j, reset when a batch starts and ends): while the window
  is full, the window's LRU candidate duels main's victim, estimated frequency against
  estimated frequency, and the loser is evicted; a tie rejects the candidate, as
  Caffeine's ``admit`` (candidate > victim). When main has room the window's overflow
  enters probation without a duel, as in the paper (``rebalance``). Caffeine's random
  admission of a warm candidate (its hash-flooding guard) is left out: no randomness.
  The paper's doorkeeper (Caffeine has none) is left out.
- Pinned blocks are in the cache, so they count toward |W|, |P| and |R|; they are
  never candidates. C and V are the least recently used *unpinned* blocks of their
  segments, so a pinned block the source would have picked is skipped, and a pinned
  block that overflows a segment moves when it is released. A hit on a probation block
  promotes it to protected even while it is pinned; the demotion that follows takes
  protected's LRU candidate.
- Recency is the order of release (``on_free``, vLLM's free-queue order), as for lru: a
  request's blocks are released last block first, so within a segment a chain's leaf
  goes before its parent (the paper says nothing about chains).
- The sketch records every access: computing a block (``on_cached``, the paper's miss)
  and each request's hit (``on_hit``). It is keyed by content (the block's chain hash in
  its namespace), so frequency outlives eviction; each key is mixed by a fixed-seed
  splitmix64 finalizer and rows are indexed by double hashing (no ``hash()``).
- Ledger: ``queue`` is the victim's segment (window, probation, protected), position 0;
  rank holds the victim's frequency estimate ``freq``, ``duel`` and, after a duel,
  ``candidate_freq``, ``victim_freq`` and ``winner`` (candidate: admitted, the main
  victim evicted; victim: the candidate evicted), plus the segment sizes and w.
  ``candidates()`` lists the window's candidates, then probation's, then protected's.
"""

from __future__ import annotations

from array import array
from typing import Any

from psgate.policy import BlockQueues, Decision, EvictionPolicy, PolicyRequest, PoolInfo

WINDOW, PROBATION, PROTECTED = 0, 1, 2
NAMES = ("window", "probation", "protected")
DEPTH = 4
MAX_COUNT = 15
M64 = (1 << 64) - 1
_HALVE = bytes(i >> 1 for i in range(256))


def mix64(key: int) -> int:
    """splitmix64's finalizer over key + a fixed odd constant: an int in [0, 2^64)."""
    z = (key + 0x9E3779B97F4A7C15) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


class CountMinSketch:
    """Depth-4 count-min sketch of 4-bit counters with the paper's reset (halving)."""

    def __init__(self, width: int, sample_size: int) -> None:
        self.width = width                   # a power of two
        self.mask = width - 1
        self.table = bytearray(DEPTH * width)
        self.sample_size = sample_size
        self.samples = 0
        self.resets = 0

    def _slots(self, z: int) -> tuple[int, int, int, int]:
        h1, h2, m, w = z & 0xFFFFFFFF, (z >> 32) | 1, self.mask, self.width
        return ((h1 & m), w + ((h1 + h2) & m), 2 * w + ((h1 + 2 * h2) & m),
                3 * w + ((h1 + 3 * h2) & m))

    def record(self, z: int) -> None:
        t = self.table
        for i in self._slots(z):
            if t[i] < MAX_COUNT:
                t[i] += 1
        self.samples += 1
        if self.samples >= self.sample_size:
            self.table = t.translate(_HALVE)
            self.samples //= 2
            self.resets += 1

    def estimate(self, z: int) -> int:
        t = self.table
        a, b, c, d = self._slots(z)
        return min(t[a], t[b], t[c], t[d])


class _Plan:
    __slots__ = ("victim", "seg", "admit", "duel", "cand_freq", "victim_freq", "freq")

    def __init__(self, victim: int, seg: int, admit: int, duel: bool, cand_freq: int,
                 victim_freq: int, freq: int) -> None:
        self.victim = victim
        self.seg = seg
        self.admit = admit          # the window candidate admitted to probation, or -1
        self.duel = duel
        self.cand_freq = cand_freq
        self.victim_freq = victim_freq
        self.freq = freq


class TinyLFUPolicy(EvictionPolicy):
    name = "tinylfu"
    api_version = 1
    summary = ("W-TinyLFU (TOS'17, Caffeine): 1% window LRU, count-min sketch (4-bit, "
               "depth 4, halved every 10 x capacity accesses) duels the window's LRU "
               "against the SLRU main's probation victim (80% protected) at eviction")
    defaults: dict[str, Any] = {"window_ratio": 0.01, "protected_ratio": 0.8,
                                "sample_factor": 10}

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        wr, pr, sf = (self.params[k] for k in ("window_ratio", "protected_ratio",
                                               "sample_factor"))
        if type(wr) not in (int, float) or not 0 < wr < 1:
            raise ValueError(f"'window_ratio' must be a number in (0, 1), found {wr!r}")
        if type(pr) not in (int, float) or not 0 <= pr <= 1:
            raise ValueError(f"'protected_ratio' must be a number in [0, 1], found {pr!r}")
        if type(sf) is not int or not 1 <= sf <= 1000:
            raise ValueError(f"'sample_factor' must be an integer in 1..1000, found {sf!r}")

    def bind(self, pool: PoolInfo) -> None:
        super().bind(pool)
        n = pool.num_blocks
        c = max(1, pool.num_usable)
        self.c = c
        self.w = max(1, round(self.params["window_ratio"] * c))
        self.main_cap = max(0, c - self.w)
        self.r = round(self.params["protected_ratio"] * self.main_cap)
        self.sketch = CountMinSketch(4 * (1 << (c - 1).bit_length()),
                                     self.params["sample_factor"] * c)
        self.seg = array("b", [-1]) * n
        self.z = array("Q", [0]) * n             # mix64 of the block's content key
        self.q = BlockQueues(n, 3)               # candidates per segment, LRU first
        self.size = [0, 0, 0]                    # cached blocks per segment, pinned included
        self.j = 0                               # evictions so far in this batch
        self._plan: _Plan | None = None

    # -- helpers --------------------------------------------------------------
    def _move(self, b: int, seg: int) -> None:
        """Candidate b to the MRU end of seg."""
        self.size[self.seg[b]] -= 1
        self.q.remove(b)
        self.seg[b] = seg
        self.size[seg] += 1
        self.q.append(seg, b)

    def _rebalance(self) -> None:
        size, q, move = self.size, self.q, self._move
        room = self.main_cap - size[PROBATION] - size[PROTECTED]
        while size[WINDOW] > self.w and room > 0 and q.sizes[WINDOW]:
            move(q.head(WINDOW), PROBATION)
            room -= 1
        while size[PROTECTED] > self.r and q.sizes[PROTECTED]:
            move(q.head(PROTECTED), PROBATION)

    # -- events ---------------------------------------------------------------
    def on_admit(self, req: PolicyRequest, now_ns: int) -> None:
        self._plan = None
        self.j = 0

    def on_cached(self, block: int, req: PolicyRequest, pos: int, parent: int,
                  key: int = -1) -> None:
        self._plan = None
        z = mix64(key) if key >= 0 else mix64(-1 - key)
        self.z[block] = z
        self.sketch.record(z)
        self.seg[block] = WINDOW
        self.size[WINDOW] += 1

    def end_admit(self, req: PolicyRequest, now_ns: int) -> dict | None:
        self._plan = None
        self.j = 0
        self._rebalance()
        return None

    def on_hit(self, block: int, req: PolicyRequest, pos: int) -> None:
        self._plan = None
        self.sketch.record(self.z[block])
        if self.seg[block] == PROBATION:
            if self.q.where[block] >= 0:       # still a candidate: keep its queue in step
                self._move(block, PROTECTED)
                return
            self.seg[block] = PROTECTED
            self.size[PROBATION] -= 1
            self.size[PROTECTED] += 1

    def on_touch(self, block: int) -> None:
        self._plan = None
        self.q.remove(block)

    def on_free(self, blocks: list[int], now_ns: int) -> None:
        self._plan = None
        q, seg = self.q, self.seg
        for b in blocks:
            s = seg[b]
            if s < 0:                          # cached without on_cached: a window block
                seg[b] = s = WINDOW
                self.size[WINDOW] += 1
            q.append(s, b)
        self._rebalance()

    def _choose(self) -> _Plan:
        q, est = self.q, self.sketch.estimate
        c = q.head(WINDOW)
        v, vseg = q.head(PROBATION), PROBATION
        if v < 0:
            v, vseg = q.head(PROTECTED), PROTECTED
        if c >= 0 and (self.size[WINDOW] + self.j + 1 > self.w or v < 0):
            if v < 0:
                f = est(self.z[c])
                return _Plan(c, WINDOW, -1, False, f, -1, f)
            fc, fv = est(self.z[c]), est(self.z[v])
            if fc > fv:
                return _Plan(v, vseg, c, True, fc, fv, fv)
            return _Plan(c, WINDOW, -1, True, fc, fv, fc)
        f = est(self.z[v])
        return _Plan(v, vseg, -1, False, -1, -1, f)

    def _decision(self, plan: _Plan) -> Decision:
        q, size = self.q, self.size
        rank: dict[str, Any] = {"segment": NAMES[plan.seg], "freq": plan.freq,
                                "duel": plan.duel}
        if plan.duel:
            rank["candidate_freq"] = plan.cand_freq
            rank["victim_freq"] = plan.victim_freq
            rank["winner"] = "candidate" if plan.admit >= 0 else "victim"
        rank.update(window=size[WINDOW], window_target=self.w, probation=size[PROBATION],
                    protected=size[PROTECTED])
        return Decision(victim=plan.victim, num_candidates=q.sizes[0] + q.sizes[1] + q.sizes[2],
                        position=0, queue=NAMES[plan.seg],
                        segments={"window": q.sizes[0], "probation": q.sizes[1],
                                  "protected": q.sizes[2]},
                        rank=rank)

    def select_victim(self, req: PolicyRequest, now_ns: int) -> Decision:
        plan = self._plan
        if plan is None:
            plan = self._plan = self._choose()
        return self._decision(plan)

    def on_evict(self, block: int) -> None:
        plan, self._plan = self._plan, None
        if plan is None or plan.victim != block:
            plan = self._choose() if self.q.where[block] >= 0 else None
            if plan is not None and plan.victim != block:
                plan = None
        self._apply(block, plan)

    def _apply(self, block: int, plan: _Plan | None) -> None:
        if plan is not None and plan.admit >= 0:
            self._move(plan.admit, PROBATION)
        s = self.seg[block]
        if self.q.where[block] >= 0:
            self.q.remove(block)
        if s >= 0:
            self.size[s] -= 1
        self.seg[block] = -1
        self.j += 1

    def evict_batch(self, req: PolicyRequest, now_ns: int, num_blocks: int,
                    decisions: list[Decision] | None) -> list[int]:
        """select_victim then on_evict, num_blocks times, in one call."""
        victims: list[int] = []
        choose, apply = self._choose, self._apply
        self._plan = None
        for _ in range(num_blocks):
            plan = choose()
            if decisions is not None:
                decisions.append(self._decision(plan))
            apply(plan.victim, plan)
            victims.append(plan.victim)
        return victims

    # -- views ----------------------------------------------------------------
    @property
    def num_candidates(self) -> int:
        q = self.q
        return q.sizes[0] + q.sizes[1] + q.sizes[2]

    def candidates(self) -> list[int]:
        return self.q.items(WINDOW) + self.q.items(PROBATION) + self.q.items(PROTECTED)
