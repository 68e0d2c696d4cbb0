"""Intrusive doubly linked block queues over flat arrays.

Every policy keeps its eviction order here: a block sits in at most one queue,
append/remove/head are O(1), and the cost is three int32 slots per block plus
three per queue, not a Python object per block. Queue ``q``'s sentinel lives at
index ``num_blocks + q``. ``SeqQueues`` (``psgate.policy.seq_queues``) orders blocks by a
key instead (heaps); ``LeafCandidates`` keeps a leaf-first policy's candidates, over a
``LeafTracker`` (``psgate.policy.leaf_tracker``).
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from typing import Any

from psgate.policy.base import Decision
from psgate.policy.leaf_tracker import LeafTracker
from psgate.policy.seq_queues import SeqQueues


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


class LeafCandidates:
    """The candidates of a leaf-first policy: a chain's leaf goes before its parent.

    Several policies (``leaf-lru``, ``fifo``, ``mru``, ``lfu``, ``slru``, ``tlru``) rank
    blocks their own way but evict, as SGLang's radix cache does, only *leaves*: a
    block with a resident child is not eligible, or evicting it would orphan the
    blocks computed on top of it. This holds that machinery once, so that a policy
    keeps only its ranking:

    - ``tree``, a :class:`LeafTracker` (the policy reports ``cached`` to it);
    - two :class:`SeqQueues`, ``LEAVES`` and ``NONLEAF``, ordered by an integer key
      the policy supplies (smallest first; a non-negative int64, ties broken by block
      id); ``push(b, key)`` puts a freed block in ``LEAVES`` when it has no resident
      child, else in ``NONLEAF``; ``rekey(b, key)`` moves a candidate whose rank
      changed within its queue; ``remove(b)`` (alias ``touch``) drops a candidate;
    - ``cand[b]`` (1 while b is a candidate) and ``num``, the number of candidates.

    ``evicted(b)`` forgets b and, when b was its parent's last resident child and
    the parent is a candidate, moves the parent from ``NONLEAF`` to ``LEAVES`` under
    the key it was pushed with: it becomes eligible at its own place, not the tail.

    ``head()`` is the first leaf; when there is none, ``fallback()`` is the first
    non-leaf. With prefix hits that is unreachable (a pinned child has a pinned
    parent); it is a guard, and such a decision is marked ``ancestry_fallback``.
    ``decision(rank, queue)`` makes that choice and its ledger row, with the policy's
    own rank fields.

    Entries go stale lazily (see :class:`SeqQueues`): a block removed and pushed again
    into the same queue under an *unchanged* key leaves two entries that both look
    live. A policy whose key can repeat for a block (``fifo``'s FIFO place) adds a
    per-block stamp in the key's low bits.
    """

    LEAVES, NONLEAF = 0, 1

    def __init__(self, num_blocks: int) -> None:
        self.tree = LeafTracker(num_blocks)
        self.q = SeqQueues(num_blocks, 2)
        self.cand = bytearray(num_blocks)
        self._children = self.tree.children      # never replaced

    def cached(self, b: int, parent: int) -> None:
        """b now holds content computed on top of parent (-1: none)."""
        self.tree.cached(b, parent)

    def push(self, b: int, key: int) -> None:
        """b became a candidate, ranked by key: in LEAVES if it has no resident child."""
        self.q.push(1 if self._children[b] else 0, b, key)     # NONLEAF / LEAVES
        self.cand[b] = 1

    def remove(self, b: int) -> None:
        """b stops being a candidate (a hit touched it, or it is evicted)."""
        self.q.remove(b)
        self.cand[b] = 0

    touch = remove

    def rekey(self, b: int, key: int) -> None:
        """Candidate b's rank changed: it goes back, in the same queue, under key
        (which must differ from its current one, see the class docstring)."""
        q = self.q
        w = q.where[b]
        q.remove(b)
        q.push(w, b, key)

    def evicted(self, b: int) -> bool:
        """The engine evicted b: it leaves the candidates and the tree; a parent it
        leaves a leaf moves to LEAVES at its own key. Whether b was a candidate."""
        q, cand = self.q, self.cand
        was = cand[b]
        if was:
            q.remove(b)
            cand[b] = 0
        parent = self.tree.evicted(b)
        if parent >= 0 and cand[parent] and q.where[parent] == 1:
            key = q.seq[parent]
            q.remove(parent)
            q.push(0, parent, key)
        return bool(was)

    @property
    def num(self) -> int:
        """How many candidates (every candidate is live in one of the two queues)."""
        live = self.q.live
        return live[0] + live[1]

    def head(self) -> int:
        """The first leaf candidate (smallest key), or -1 when there is none."""
        return self.q.head(0)

    def fallback(self) -> int:
        """The first non-leaf candidate, or -1 (the guard: ask only when head() is -1)."""
        return self.q.head(1)

    def decision(self, rank: Callable[[int, bool], dict[str, Any]],
                 queue: Callable[[int], str] | None = None) -> Decision:
        """The decision (nothing moves) to evict head(), at position 0 of queue(b)
        ("leaf" without one), ranked by rank(b, True); with no leaf, fallback():
        queue "ancestry-fallback", rank(b, False) plus ``ancestry_fallback``.
        Segments: the live leaf / non-leaf counts."""
        b = self.q.head(0)
        if b >= 0:
            return Decision(victim=b, num_candidates=self.num, position=0,
                            queue="leaf" if queue is None else queue(b),
                            segments=self.segments(), rank=rank(b, True))
        b = self.q.head(1)      # the guard
        r = rank(b, False)
        r["ancestry_fallback"] = True
        return Decision(victim=b, num_candidates=self.num, position=0,
                        queue="ancestry-fallback", segments=self.segments(), rank=r)

    def segments(self) -> dict[str, int]:
        """Live counts, for ``Decision.segments``: {"leaf": n, "nonleaf": n}."""
        live = self.q.live
        return {"leaf": live[0], "nonleaf": live[1]}

    def items(self) -> list[int]:
        """The candidates in order: the leaves by key, then the non-leaves."""
        return self.q.items(0) + self.q.items(1)
