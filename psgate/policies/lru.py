"""lru: vLLM's native eviction order.

    on_free(blocks):   append each block to the back of the queue
    on_touch(block):   unlink it (a hit takes it out of the free queue)
    select_victim():   the front of the queue

This is exactly vLLM v1's ``FreeKVCacheBlockQueue`` restricted to cached
blocks: the engine keeps truly free blocks in front of them, as vLLM's
``prepend_n`` does, and hands out those first.

The module is written in Cython's pure-Python mode and is its own source: ``pip
install`` compiles it (``lru.pxd`` gives the C types of the two walks over the queue
and of :class:`LRUDecision`, whose fields the compact ledger's coder reads), and
without a compiler it runs as written.
"""

try:
    import cython
except ImportError:
    from psgate import cython_shadow as cython

from array import array

from psgate.policy import BlockQueues, Decision, EvictionPolicy, PolicyRequest, PoolInfo

if not cython.compiled:     # compiled, lru.pxd cimports them
    from psgate.flat import ints, llongs
    from psgate.policy import FieldDecision

NS_PER_S = 1_000_000_000
EXACT = 1 << 53        # |ns| up to this: ns / 1e9 in doubles is Python's ns / 10**9


def freed_seconds(ns: cython.longlong):
    """A time in ns as seconds, as Python's ``ns / 10**9`` gives it (a float)."""
    if -EXACT <= ns <= EXACT:
        return cython.cast(cython.double, ns) / 1e9
    return cython.cast(object, ns) / NS_PER_S


@cython.cclass
class LRUDecision(FieldDecision):
    """lru's Decision for a victim of its own walk: the candidates there were before it
    and the time it was freed; it has no responsible group, runner-up or segments."""

    # the fields every lru victim has alike
    queue = "lru"
    responsible = responsible_p_before = responsible_p_after = None
    runner_up = runner_up_p = segments = None

    def __init__(self, victim: cython.int, num_candidates: cython.Py_ssize_t,
                 freed_ns: cython.longlong):
        """The walk makes these without this; here for a reader that makes one itself."""
        self.victim = victim
        self.num_cand = num_candidates
        self.freed_ns = freed_ns
        self.rank_d = None

    @property
    def rank(self):
        if self.rank_d is None:
            self.rank_d = {"freed_t": freed_seconds(self.freed_ns)}
        return self.rank_d

    def decision(self):
        return Decision(self.victim, self.num_cand, 0, "lru", None, None, None, None, None,
                        None, self.rank)


def append_freed(q: BlockQueues, freed_at, blocks: list,
                 now_ns: cython.longlong) -> cython.void:
    """Each block to the back of queue 0, freed at ``now_ns``."""
    nxt: cython.p_int = ints(q.next)
    prv: cython.p_int = ints(q.prev)
    where: cython.p_int = ints(q.where)
    freed_ns: cython.p_longlong = llongs(freed_at)
    s: cython.int = q.num_blocks
    last: cython.int = prv[s]
    b: cython.int
    for b in blocks:
        prv[b] = last
        nxt[last] = b
        where[b] = 0
        freed_ns[b] = now_ns
        last = b
    nxt[last] = s
    prv[s] = last
    q.sizes[0] += len(blocks)


def take_front(q: BlockQueues, freed_at, num_blocks: cython.Py_ssize_t,
               decisions: list | None) -> list:
    """The first ``num_blocks`` of queue 0, unlinked in one pass; with ``decisions``, an
    LRUDecision for each appended to it."""
    nxt: cython.p_int = ints(q.next)
    prv: cython.p_int = ints(q.prev)
    where: cython.p_int = ints(q.where)
    freed_ns: cython.p_longlong = llongs(freed_at)
    s: cython.int = q.num_blocks
    size: cython.Py_ssize_t = q.sizes[0]
    victims: list = []
    num: cython.Py_ssize_t = 0
    b: cython.int = nxt[s]
    d: LRUDecision
    while num < num_blocks and b != s:
        if decisions is not None:
            d = LRUDecision.__new__(LRUDecision)
            d.victim = b
            d.num_cand = size - num
            d.freed_ns = freed_ns[b]
            d.rank_d = None
            decisions.append(d)
        victims.append(b)
        where[b] = -1
        num += 1
        b = nxt[b]
    nxt[s] = b
    prv[b] = s
    q.sizes[0] = size - num
    return victims


@cython.annotation_typing(False)     # its methods' annotations document, compiled too
class LRUPolicy(EvictionPolicy):
    name = "lru"
    api_version = 1
    summary = "vLLM native: evict the head of the free queue (least recently freed)"
    defaults = {}

    def bind(self, pool: PoolInfo) -> None:
        super().bind(pool)
        self._q = BlockQueues(pool.num_blocks, 1)
        self._freed_ns = array("q", [0]) * pool.num_blocks

    def on_free(self, blocks: list[int], now_ns: int) -> None:
        if blocks:
            append_freed(self._q, self._freed_ns, blocks, now_ns)

    def on_touch(self, block: int) -> None:
        self._q.remove(block)

    def touch_queues(self):
        return self._q if type(self).on_touch is LRUPolicy.on_touch else None

    def _decision(self, b: int, num_candidates: int) -> Decision:
        return Decision(victim=b, num_candidates=num_candidates, position=0, queue="lru",
                        rank={"freed_t": freed_seconds(self._freed_ns[b])})

    def select_victim(self, req: PolicyRequest, now_ns: int) -> Decision:
        return self._decision(self._q.head(0), self._q.sizes[0])

    def on_evict(self, block: int) -> None:
        self._q.remove(block)

    def evict_batch(self, req: PolicyRequest, now_ns: int, num_blocks: int,
                    decisions: list[Decision] | None) -> list[int]:
        """The first num_blocks of the queue, unlinked in one pass; a subclass that
        decides its own Decision (``_decision``) gets it called per victim."""
        if decisions is None or type(self)._decision is LRUPolicy._decision:
            return take_front(self._q, self._freed_ns, num_blocks, decisions)
        size = self._q.sizes[0]
        victims = take_front(self._q, self._freed_ns, num_blocks, None)
        decisions.extend(self._decision(b, size - i) for i, b in enumerate(victims))
        return victims

    @property
    def num_candidates(self) -> int:
        return self._q.sizes[0]

    def candidates(self) -> list[int]:
        return self._q.items(0)
