"""Which cached blocks are leaves: no resident block was computed on top of them.

    cached(b, parent):  parent[b] = parent; children[b] = 0; children[parent] += 1
    evicted(b):         children[parent[b]] -= 1; the parent, where that was its last
                        child (it became a leaf), else -1

A block's parent is the block its request held at the previous position when it was
cached. Evicting only leaves never orphans a block. A generation counter per block
guards a parent link against the parent's id having been reused for other content
(possible only when a non-leaf is evicted, which leaf-only policies do not do).

The module is written in Cython's pure-Python mode and is its own source: ``pip install``
compiles it (``leaf_tracker.pxd`` declares :class:`LeafTracker`'s fields and methods,
which PrefixShield's compiled paths call as C methods), and without a compiler it runs
as written.
"""

try:
    import cython
except ImportError:
    from psgate import cython_shadow as cython

from array import array

if not cython.compiled:     # compiled, leaf_tracker.pxd cimports it
    from psgate.flat import ints


@cython.cclass
class LeafTracker:
    """The tree of a pool's cached blocks: ``parent``, ``parent_gen``, ``gen`` and
    ``children``, an ``array('i')`` each, one item per block. The arrays never grow, so
    their items are taken once (``c_*``: compiled, pointers; interpreted, the arrays)."""

    def __init__(self, num_blocks):
        self.num_blocks = num_blocks
        self.parent = array("i", [-1]) * num_blocks
        self.parent_gen = array("i", [0]) * num_blocks
        self.gen = array("i", [0]) * num_blocks
        self.children = array("i", [0]) * num_blocks
        self.c_parent = ints(self.parent)
        self.c_parent_gen = ints(self.parent_gen)
        self.c_gen = ints(self.gen)
        self.c_children = ints(self.children)

    def _check(self, b, parent):
        if not 0 <= b < self.num_blocks or parent >= self.num_blocks:
            raise IndexError(f"block {b} (parent {parent}) is outside the pool "
                             f"({self.num_blocks} blocks)")
        return 0

    def cached(self, b, parent):
        """b now holds content computed on top of parent (-1: none)."""
        self._check(b, parent)
        self.c_parent[b] = parent
        self.c_children[b] = 0
        if parent >= 0:
            self.c_parent_gen[b] = self.c_gen[parent]
            self.c_children[parent] += 1

    def is_leaf(self, b):
        """Whether no resident block was computed on top of b."""
        self._check(b, -1)
        return self.c_children[b] == 0

    def evicted(self, b):
        """Forget b; its parent if b was that parent's last child, else -1."""
        self._check(b, -1)
        p: cython.int = self.c_parent[b]
        self.c_gen[b] += 1
        self.c_parent[b] = -1
        if p >= 0 and self.c_parent_gen[b] == self.c_gen[p]:
            self.c_children[p] -= 1
            if self.c_children[p] == 0:
                return p
        return -1
