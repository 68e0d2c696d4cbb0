"""belady: a clairvoyant REFERENCE heuristic. Not an optimum, not a bound, not deployable.

    next_use(b) = index of the next request in the trace naming b's content, or never
    select_victim(): the candidate with the farthest next use (never first);
                     ties: the least recently freed

Computed from the trace itself (psgate.trace.future). With chained prefixes (a hit
needs every earlier block), blocks pinned in batches and per-role metrics, farthest
next use is not optimal for any metric psgate reports: it is a yardstick, labelled
so in every ledger row. Uses are counted in trace order; a request admitted after
a later one (quota waits) sees that order, not its admission order.
"""

from __future__ import annotations

from array import array
from bisect import bisect_right
from heapq import heapify, heappop, heappush

from psgate.policy import Decision, EvictionPolicy, PolicyRequest, PoolInfo

NEVER = 1 << 62


class Belady(EvictionPolicy):
    name = "belady"
    api_version = 1
    summary = "clairvoyant reference heuristic (farthest next use); not a bound, not deployable"
    defaults = {}
    needs_future = True
    wants_block_keys = True

    def bind(self, pool: PoolInfo) -> None:
        super().bind(pool)
        n = pool.num_blocks
        self.key = array("q", [-1]) * n
        self.next_use = array("q", [0]) * n
        self.freed_seq = array("q", [0]) * n
        self.ver = array("i", [0]) * n
        self.cand = bytearray(n)
        self.num_cand = 0
        self.seq = 0
        self.cur = -1
        self.heap: list[tuple[int, int, int, int]] = []
        self.by_key: dict[int, list[int]] = {}     # content key -> candidate blocks

    # Without its future this policy would rank every block "never used again" and evict
    # in free order (lru's choice) under belady's name: a replay that forgot set_future
    # fails instead.
    uses: dict | None = None

    def set_future(self, uses: dict) -> None:
        self.uses = uses

    def _next(self, k: int) -> int:
        a = self.uses.get(k)
        if a is None:
            return NEVER
        i = bisect_right(a, self.cur)
        return a[i] if i < len(a) else NEVER

    def _refresh(self, b: int) -> None:
        nu = self._next(self.key[b])
        self.next_use[b] = nu
        self.ver[b] += 1
        heappush(self.heap, (-nu, self.freed_seq[b], self.ver[b], b))
        if len(self.heap) > 2 * self.num_cand + 64:
            self.heap = [e for e in self.heap if self.cand[e[3]] and self.ver[e[3]] == e[2]]
            heapify(self.heap)

    def on_admit(self, req: PolicyRequest, now_ns: int) -> None:
        if self.uses is None:
            raise RuntimeError("belady: no future given (set_future was not called "
                               "before the replay)")
        self.cur = req.index
        for k in req.block_keys or ():
            for b in self.by_key.get(k, ()):
                self._refresh(b)

    def on_cached(self, block: int, req: PolicyRequest, pos: int, parent: int,
                  key: int = -1) -> None:
        self.key[block] = key

    def on_free(self, blocks: list[int], now_ns: int) -> None:
        for b in blocks:
            self.seq += 1
            self.freed_seq[b] = self.seq
            self.cand[b] = 1
            self.num_cand += 1
            self.by_key.setdefault(self.key[b], []).append(b)
            self._refresh(b)

    def _drop(self, b: int) -> None:
        self.cand[b] = 0
        self.num_cand -= 1
        self.ver[b] += 1
        lst = self.by_key[self.key[b]]
        lst.remove(b)
        if not lst:
            del self.by_key[self.key[b]]

    def on_touch(self, block: int) -> None:
        self._drop(block)

    def select_victim(self, req: PolicyRequest, now_ns: int) -> Decision:
        h = self.heap
        while not (self.cand[h[0][3]] and self.ver[h[0][3]] == h[0][2]):
            heappop(h)
        _, seq, _, b = h[0]
        nu = self.next_use[b]
        return Decision(victim=b, num_candidates=self.num_cand, position=0,
                        queue="farthest-next-use",
                        rank={"reference": "clairvoyant heuristic, not a bound",
                              "next_use_request": None if nu == NEVER else nu,
                              "freed_seq": seq})

    def on_evict(self, block: int) -> None:
        self._drop(block)
        self.key[block] = -1

    @property
    def num_candidates(self) -> int:
        return self.num_cand

    def candidates(self) -> list[int]:
        return [b for b in range(len(self.cand)) if self.cand[b]]
