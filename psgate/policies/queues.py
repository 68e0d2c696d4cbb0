"""Intrusive doubly linked block queues over flat arrays.

Every policy keeps its eviction order here: a block sits in at most one queue,
append/remove/head are O(1), and the cost is three int32 slots per block plus
three per queue, not a Python object per block. Queue ``q``'s sentinel lives at
index ``num_blocks + q``.
"""

from __future__ import annotations

from array import array


class BlockQueues:
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
