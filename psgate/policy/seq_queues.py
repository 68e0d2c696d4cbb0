"""Queues of blocks ordered by a per-block sequence number, with O(log n) insertion at the
block's own place.

    push(q, b, seq):  b joins queue q; its entry (seq, b) goes into q's heap
    remove(b):        b leaves its queue; its entry stays, dead, until it reaches the top
                      or the heap is compacted
    head(q):          the live entry with the least (seq, block): dead entries above it
                      are popped on the way

A policy's native free-queue order is the order blocks were freed, and a block that becomes
eligible late (a parent whose last child just left) must go back to *its* place, not the
tail, which a linked list cannot do cheaply. An entry is live while its block is still in
that queue with that seq; a heap is compacted when it holds more than twice its live entries
plus ``COMPACT_SLACK``. Entries are pairs of whole numbers compared as pairs, so a queue's
head, its items and when it is compacted do not depend on the heap's layout. A block
removed and pushed again into the same queue at an *unchanged* seq leaves two entries that
both look live: a caller whose seq can repeat for a block adds a stamp in its low bits.

Each queue's heap is an ``array('q')`` holding entry i as its items 2i (the seq, any int64)
and 2i + 1 (the block), sifted by the functions below. The module is written in Cython's
pure-Python mode and is its own source: ``pip install`` compiles it (``seq_queues.pxd``
declares :class:`SeqQueues`' fields and methods, which PrefixShield's compiled paths call
as C methods), and without a compiler it runs as written.
"""

try:
    import cython
except ImportError:
    from psgate import cython_shadow as cython

from array import array

if not cython.compiled:     # compiled, seq_queues.pxd cimports them
    from psgate.flat import append_llong, ints, llongs, truncate_llongs

# A heap with more entries than twice its live ones plus this is compacted.
COMPACT_SLACK = 32


def before(s1, b1, s2, b2):
    """Whether entry (s1, b1) comes before (s2, b2)."""
    return s1 < s2 or (s1 == s2 and b1 < b2)


def is_live(where, sq, q, s, b):
    """Whether entry (s, b) of queue q is live: b is still in q, at seq s."""
    return where[b] == q and sq[b] == s


def put(a, i, s, b):
    """Entry i of a becomes (s, b)."""
    a[2 * i] = s
    a[2 * i + 1] = b


@cython.boundscheck(False)
@cython.wraparound(False)
def sift_down(a, n, i, s, b):
    """Entry (s, b) placed in the heap of the n entries of a from entry i down (entry i is
    a hole)."""
    c: cython.Py_ssize_t
    while True:
        c = 2 * i + 1
        if c >= n:
            break
        if c + 1 < n and before(a[2 * c + 2], a[2 * c + 3], a[2 * c], a[2 * c + 1]):
            c += 1
        if not before(a[2 * c], a[2 * c + 1], s, b):
            break
        put(a, i, a[2 * c], a[2 * c + 1])
        i = c
    put(a, i, s, b)


@cython.boundscheck(False)
@cython.wraparound(False)
def heap_push(h, s, b):
    """Entry (s, b) into the heap h (an array('q'))."""
    append_llong(h, s)
    append_llong(h, b)
    a: cython.p_longlong = llongs(h)     # taken after the appends, which may move the items
    i: cython.Py_ssize_t = len(h) // 2 - 1
    p: cython.Py_ssize_t
    while i > 0:
        p = (i - 1) >> 1
        if not before(s, b, a[2 * p], a[2 * p + 1]):
            break
        put(a, i, a[2 * p], a[2 * p + 1])
        i = p
    put(a, i, s, b)
    return 0


def heap_pop(h):
    """The heap h (an array('q')) loses its least entry (it has one)."""
    a: cython.p_longlong = llongs(h)
    n: cython.Py_ssize_t = len(h) // 2 - 1
    if n:
        sift_down(a, n, 0, a[2 * n], a[2 * n + 1])
    truncate_llongs(h, 2 * n)
    return 0


def heapify(a, n):
    """The n entries of a made a heap."""
    i: cython.Py_ssize_t = n // 2 - 1
    while i >= 0:
        sift_down(a, n, i, a[2 * i], a[2 * i + 1])
        i -= 1


@cython.cclass
class SeqQueues:
    """Queues of blocks, each ordered by the seq its blocks were pushed with (the module
    docstring has the layout): ``num_queues`` at first, more by ``add_queue``. A queue is
    its index, a block an id below ``num_blocks``, a seq any int64. ``where[b]``: the
    queue holding b, or -1; ``seq[b]``: its seq there; ``live[q]``: how many blocks
    queue q holds."""

    MASK = (1 << 22) - 1    # the most blocks (the leaf-first policies' max_blocks)

    def __init__(self, num_blocks: int, num_queues: int = 0) -> None:
        if num_blocks > SeqQueues.MASK:
            raise ValueError(f"SeqQueues supports at most {SeqQueues.MASK} blocks, "
                             f"found {num_blocks}")
        self.num_blocks = num_blocks
        self.where = array("i", [-1]) * num_blocks
        self.seq = array("q", [0]) * num_blocks
        self.heaps = []
        self.live = array("q")
        for _ in range(num_queues):
            self.add_queue()

    def add_queue(self):
        """A new empty queue; its index."""
        self.heaps.append(array("q"))
        append_llong(self.live, 0)
        return len(self.heaps) - 1

    @cython.boundscheck(False)
    @cython.wraparound(False)
    def push(self, q, b, seq):
        """b (in no queue) joins queue q at seq."""
        if not (0 <= q < len(self.heaps) and 0 <= b < self.num_blocks):
            raise IndexError(f"queue {q} or block {b} out of range")
        ints(self.where)[b] = q
        llongs(self.seq)[b] = seq
        heap_push(self.heaps[q], seq, b)
        llongs(self.live)[q] += 1

    @cython.boundscheck(False)
    @cython.wraparound(False)
    def remove(self, b):
        """b leaves its queue."""
        if not 0 <= b < self.num_blocks:
            raise IndexError(f"block {b} out of range")
        where: cython.p_int = ints(self.where)
        q: cython.int = where[b]
        if q < 0:
            raise ValueError(f"block {b} is in no queue")
        where[b] = -1
        live: cython.p_longlong = llongs(self.live)
        live[q] -= 1
        if len(self.heaps[q]) // 2 > 2 * live[q] + COMPACT_SLACK:
            self.compact(q)

    @cython.boundscheck(False)
    @cython.wraparound(False)
    def compact(self, q):
        """Queue q's heap keeps its live entries only."""
        h = self.heaps[q]
        a: cython.p_longlong = llongs(h)
        where: cython.p_int = ints(self.where)
        sq: cython.p_longlong = llongs(self.seq)
        n: cython.Py_ssize_t = len(h) // 2
        i: cython.Py_ssize_t
        m: cython.Py_ssize_t = 0
        for i in range(n):
            if is_live(where, sq, q, a[2 * i], a[2 * i + 1]):
                put(a, m, a[2 * i], a[2 * i + 1])
                m += 1
        heapify(a, m)
        truncate_llongs(h, 2 * m)

    @cython.boundscheck(False)
    @cython.wraparound(False)
    def head(self, q):
        """The block at the head of queue q, -1 when it is empty."""
        if not 0 <= q < len(self.heaps):
            raise IndexError(f"queue {q} out of range")
        h = self.heaps[q]
        where: cython.p_int = ints(self.where)
        sq: cython.p_longlong = llongs(self.seq)
        a: cython.p_longlong
        while len(h):
            a = llongs(h)
            if is_live(where, sq, q, a[0], a[1]):
                return a[1]
            heap_pop(h)
        return -1

    def first_queue(self, q, num):
        """The first of queues q .. q + num - 1 that is not empty; q + num when all are."""
        i: cython.int
        for i in range(q, q + num):
            if self.head(i) >= 0:
                return i
        return q + num

    def first_two_families(self, families, width):
        """Of the given families of ``width`` queues (family f: queues width * f onwards),
        the two whose best blocks come first, a block ranked by its queue's place in the
        family, then its seq (a family with no block last); (first, second), -1 where
        there is none. (PrefixShield: the groups tied at the top, by their best
        candidates' segment and native order.)"""
        f: cython.int
        q: cython.int
        place: cython.int
        seq: cython.longlong
        best: cython.int = -1
        best_place: cython.int = 0
        best_seq: cython.longlong = 0
        nxt: cython.int = -1
        next_place: cython.int = 0
        next_seq: cython.longlong = 0
        for f in families:
            q = self.first_queue(width * f, width)
            place = q - width * f
            seq = llongs(self.seq)[self.head(q)] if place < width else 0
            if best < 0 or place < best_place or (place == best_place and seq < best_seq):
                nxt, next_place, next_seq = best, best_place, best_seq
                best, best_place, best_seq = f, place, seq
            elif nxt < 0 or place < next_place or (place == next_place and seq < next_seq):
                nxt, next_place, next_seq = f, place, seq
        return best, nxt

    def items(self, q):
        """The blocks of queue q in order."""
        if not 0 <= q < len(self.heaps):
            raise IndexError(f"queue {q} out of range")
        h = self.heaps[q]
        where: cython.p_int = ints(self.where)
        sq: cython.p_longlong = llongs(self.seq)
        return [b for s, b in sorted(zip(h[0::2], h[1::2])) if is_live(where, sq, q, s, b)]

    def __contains__(self, b: cython.int) -> bool:
        if not 0 <= b < self.num_blocks:
            raise IndexError(f"block {b} out of range")
        return self.where[b] != -1

    @cython.boundscheck(False)
    @cython.wraparound(False)
    def gather(self, other, stride):
        """Every block queued in ``other`` (in queue q) queued here in queue q % stride at
        its seq, these queues being empty: one queue over a family of others (PrefixShield's
        all-groups queues from its group queues)."""
        if other.num_blocks != self.num_blocks or stride < 1 or len(self.heaps) < stride:
            raise ValueError("not queues of the same pool, or too few queues here")
        b: cython.Py_ssize_t
        q: cython.int
        s: cython.Py_ssize_t
        live: cython.p_longlong = llongs(self.live)
        for s in range(stride):
            if live[s] or len(self.heaps[s]):
                raise ValueError(f"queue {s} is not empty")
        # the heaps grow below; none of these arrays moves
        where: cython.p_int = ints(self.where)
        sq: cython.p_longlong = llongs(self.seq)
        from_where: cython.p_int = ints(other.where)
        from_seq: cython.p_longlong = llongs(other.seq)
        for b in range(self.num_blocks):
            q = from_where[b]
            if q >= 0:
                s = q % stride
                where[b] = s
                sq[b] = from_seq[b]
                append_llong(self.heaps[s], from_seq[b])
                append_llong(self.heaps[s], b)
                live[s] += 1
        for s in range(stride):
            h = self.heaps[s]
            heapify(llongs(h), len(h) // 2)
