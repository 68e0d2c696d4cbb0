"""Intrusive doubly linked block queues over flat arrays.

Every policy keeps its eviction order here: a block sits in at most one queue,
append/remove/head are O(1), and the cost is three int32 slots per block plus
three per queue, not a Python object per block. Queue ``q``'s sentinel lives at
index ``num_blocks + q``.
"""

from __future__ import annotations

from array import array
from heapq import heapify, heappop, heappush


class BlockQueues:
    """FIFO queues of block ids over three int32 arrays: append, remove and head in O(1);
    ``where[b]`` is the queue holding b, or NONE."""

    NONE = -1

    def __init__(self, num_blocks: int, num_queues: int = 1) -> None:
        self.num_blocks = num_blocks
        n = num_blocks + num_queues
        self.prev = array("i", [0]) * n
        self.next = array("i", [0]) * n
        self.where = array("i", [self.NONE]) * num_blocks
        self.sizes = [0] * num_queues
        for q in range(num_queues):
            s = num_blocks + q
            self.prev[s] = s
            self.next[s] = s

    def add_queue(self) -> int:
        """A new empty queue; its index."""
        q = len(self.sizes)
        s = self.num_blocks + q
        self.prev.append(s)
        self.next.append(s)
        self.sizes.append(0)
        return q

    def append(self, q: int, b: int) -> None:
        s = self.num_blocks + q
        last = self.prev[s]
        self.prev[b] = last
        self.next[b] = s
        self.next[last] = b
        self.prev[s] = b
        self.where[b] = q
        self.sizes[q] += 1

    def remove(self, b: int) -> int:
        """Unlink b; returns the queue it was in."""
        q = self.where[b]
        p, n = self.prev[b], self.next[b]
        self.next[p] = n
        self.prev[n] = p
        self.where[b] = self.NONE
        self.sizes[q] -= 1
        return q

    def head(self, q: int) -> int:
        """The front block of q, or NONE when q is empty."""
        s = self.num_blocks + q
        b = self.next[s]
        return self.NONE if b == s else b

    def successor(self, b: int) -> int:
        """The block after b in its queue, or NONE at the end."""
        n = self.next[b]
        return self.NONE if n >= self.num_blocks else n

    def __contains__(self, b: int) -> bool:
        return self.where[b] != self.NONE

    def items(self, q: int) -> list[int]:
        out = []
        s = self.num_blocks + q
        b = self.next[s]
        while b != s:
            out.append(b)
            b = self.next[b]
        return out


class SeqQueues:
    """Queues ordered by a per-block sequence number, with O(log n) insertion at
    the block's own position.

    Native free-queue order is the order blocks were freed; a block that becomes
    eligible late (a parent whose last child just left) must go back to *its*
    place, not the tail, which a linked list cannot do cheaply. Entries are
    ints ``seq << 22 | block`` in one heap per queue; removal is lazy (an entry
    is live while the block is still in that queue with that seq) and a heap is
    compacted when it holds more than twice its live entries.
    """

    SHIFT = 22
    MASK = (1 << SHIFT) - 1

    def __init__(self, num_blocks: int, num_queues: int = 0) -> None:
        if num_blocks > self.MASK:
            raise ValueError(f"SeqQueues supports at most {self.MASK} blocks")
        self.where = array("i", [BlockQueues.NONE]) * num_blocks
        self.seq = array("q", [0]) * num_blocks
        self.heaps: list[list[int]] = [[] for _ in range(num_queues)]
        self.live: list[int] = [0] * num_queues

    def add_queue(self) -> int:
        self.heaps.append([])
        self.live.append(0)
        return len(self.heaps) - 1

    def push(self, q: int, b: int, seq: int) -> None:
        self.where[b] = q
        self.seq[b] = seq
        heappush(self.heaps[q], (seq << self.SHIFT) | b)
        self.live[q] += 1

    def remove(self, b: int) -> None:
        q = self.where[b]
        self.where[b] = BlockQueues.NONE
        self.live[q] -= 1
        h = self.heaps[q]
        if len(h) > 2 * self.live[q] + 32:
            self._compact(q)

    def _compact(self, q: int) -> None:
        where, seq, shift, mask = self.where, self.seq, self.SHIFT, self.MASK
        h = [e for e in self.heaps[q] if where[e & mask] == q and seq[e & mask] == e >> shift]
        heapify(h)
        self.heaps[q] = h

    def head(self, q: int) -> int:
        h = self.heaps[q]
        where, seq, shift, mask = self.where, self.seq, self.SHIFT, self.MASK
        while h:
            e = h[0]
            b = e & mask
            if where[b] == q and seq[b] == e >> shift:
                return b
            heappop(h)
        return BlockQueues.NONE

    def __contains__(self, b: int) -> bool:
        return self.where[b] != BlockQueues.NONE

    def items(self, q: int) -> list[int]:
        where, seq, shift, mask = self.where, self.seq, self.SHIFT, self.MASK
        return [e & mask for e in sorted(self.heaps[q])
                if where[e & mask] == q and seq[e & mask] == e >> shift]


class LeafTracker:
    """Which cached blocks are leaves: no resident block was computed on top of them.

    A block's parent is the block its request held at the previous position
    when it was cached. Evicting only leaves never orphans a block. A
    generation counter per block guards a parent link against the parent's id
    having been reused for other content (possible only when a non-leaf is
    evicted, which leaf-only policies do not do).
    """

    def __init__(self, num_blocks: int) -> None:
        self.parent = array("i", [-1]) * num_blocks
        self.parent_gen = array("i", [0]) * num_blocks
        self.gen = array("i", [0]) * num_blocks
        self.children = array("i", [0]) * num_blocks

    def cached(self, b: int, parent: int) -> None:
        self.parent[b] = parent
        self.children[b] = 0
        if parent >= 0:
            self.parent_gen[b] = self.gen[parent]
            self.children[parent] += 1

    def is_leaf(self, b: int) -> bool:
        return self.children[b] == 0

    def evicted(self, b: int) -> int:
        """Forget b; returns its parent if b was that parent's last child, else -1."""
        self.gen[b] += 1
        p = self.parent[b]
        self.parent[b] = -1
        if p >= 0 and self.parent_gen[b] == self.gen[p]:
            self.children[p] -= 1
            if self.children[p] == 0:
                return p
        return -1
