"""LeafTracker (psgate/policy/leaf_tracker.py) in both of the module's forms: as installed
(compiled where the install compiled it) and interpreted from its source."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import both_forms
from psgate.policy import leaf_tracker

form = both_forms(leaf_tracker)



def test_a_chain_s_leaf_goes_and_its_parent_becomes_the_leaf(form):
    """Blocks 0 <- 1 <- 2 and 0 <- 3 (two requests sharing block 0): only 2 and 3 are
    leaves. Evicting 2 makes 1 a leaf (returned); evicting 3 leaves 0 with 1's child
    link, so 0 is not returned; evicting 1 then returns 0."""
    tree = form.LeafTracker(5)
    for b, parent in ((0, -1), (1, 0), (2, 1), (3, 0)):
        tree.cached(b, parent)
    assert [tree.is_leaf(b) for b in range(4)] == [False, False, True, True]
    assert list(tree.children[:4]) == [2, 1, 0, 0]
    assert tree.evicted(2) == 1 and tree.is_leaf(1)
    assert tree.evicted(3) == -1 and not tree.is_leaf(0)
    assert tree.evicted(1) == 0 and tree.is_leaf(0)
    assert list(tree.parent[:4]) == [-1, -1, -1, -1]


def test_a_link_to_a_parent_whose_id_was_reused_is_ignored(form):
    """Block 0 is evicted while 1 still names it as parent (a non-leaf eviction), and 0 is
    cached again for other content: 1's eviction must not take a child from the new 0."""
    tree = form.LeafTracker(3)
    tree.cached(0, -1)
    tree.cached(1, 0)
    assert tree.evicted(0) == -1            # 0 had no parent; its generation moves on
    tree.cached(0, -1)
    tree.cached(2, 0)
    assert tree.evicted(1) == -1 and list(tree.children) == [1, 0, 0]
    assert tree.evicted(2) == 0


def test_blocks_outside_the_pool_are_refused(form):
    tree = form.LeafTracker(2)
    for call in (lambda: tree.cached(2, -1), lambda: tree.cached(0, 2),
                 lambda: tree.evicted(-1), lambda: tree.is_leaf(2)):
        with pytest.raises(IndexError, match="outside the pool"):
            call()


@settings(max_examples=150, deadline=None)
@given(ops=st.lists(st.tuples(st.booleans(), st.integers(0, 7), st.integers(-1, 7)),
                    max_size=80))
def test_leaves_are_the_model_s_under_leaf_only_evictions(form, ops):
    """Cache a block on a resident parent, or evict a resident leaf, as leaf-only policies
    do: a block is a leaf exactly when no resident block names it as parent, and
    evicted returns the parent that became a leaf."""
    tree = form.LeafTracker(8)
    resident: dict[int, int] = {}            # block -> parent
    for cache, b, parent in ops:
        kids = {p for p in resident.values() if p >= 0}
        if cache and b not in resident and (parent == -1 or parent in resident):
            tree.cached(b, parent)
            resident[b] = parent
        elif not cache and b in resident and b not in kids:
            p = resident.pop(b)
            left = {q for q in resident.values() if q >= 0}
            assert tree.evicted(b) == (p if p >= 0 and p not in left else -1)
        kids = {p for p in resident.values() if p >= 0}
        for r in resident:
            assert tree.is_leaf(r) == (r not in kids)
