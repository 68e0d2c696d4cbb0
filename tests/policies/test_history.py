"""PrefixHistory against the reference it replaces: one OrderedDict LRU set per group."""

from __future__ import annotations

from collections import OrderedDict

from hypothesis import given, settings
from hypothesis import strategies as st

from psgate.policy.history import PrefixHistory

# (group, prefix): content keys in two namespaces of 2**4 hashes (ns 0 and 1 belong to
# group 0, ns 2 to group 1, as the sim engine's namespaces never span groups), or labels
_KEYS = st.one_of(
    st.tuples(st.integers(0, 1), st.integers(0, 15)).map(lambda t: (0, (t[0] << 4) | t[1])),
    st.integers(0, 15).map(lambda h: (1, (2 << 4) | h)),
    st.tuples(st.integers(0, 1), st.sampled_from(["p", "q", "r"])))


@settings(max_examples=300, deadline=None, derandomize=True)
@given(ops=st.lists(_KEYS, max_size=400), bound=st.integers(1, 6),
       shift=st.sampled_from([None, 4]))
def test_history_matches_an_ordered_dict_per_group(ops, bound, shift):
    hist = PrefixHistory(bound, shift)
    ref = [OrderedDict(), OrderedDict()]
    for _ in ref:
        hist.add_group()
    for i, (g, key) in enumerate(ops):
        assert hist.contains(g, key) == (key in ref[g])
        if type(key) is int and i % 2:          # the batch forms, one key at a time
            assert hist.contains_keys(g, [key]) == [key in ref[g]]
            hist.touch_keys(g, [key])
        else:
            hist.touch(g, key)
        if key in ref[g]:
            ref[g].move_to_end(key)
        else:
            ref[g][key] = None
            if len(ref[g]) > bound:
                ref[g].popitem(last=False)
        assert hist.items(g) == list(ref[g])
    for g in (0, 1):
        assert hist.num_live[g] == len(ref[g])


@settings(max_examples=100, deadline=None, derandomize=True)
@given(batches=st.lists(st.lists(st.integers(0, 40), max_size=12, unique=True), max_size=60),
       bound=st.integers(1, 8))
def test_batch_touches_match_single_ones(batches, bound):
    one, many = PrefixHistory(bound, 4), PrefixHistory(bound, 4)
    one.add_group(), many.add_group()
    for keys in batches:
        assert many.contains_keys(0, keys) == [one.contains(0, k) for k in keys]
        many.touch_keys(0, keys)
        for k in keys:
            one.touch(0, k)
        assert many.items(0) == one.items(0)


def test_stale_entries_are_compacted():
    hist = PrefixHistory(4, 32)
    g = hist.add_group()
    for i in range(20000):
        hist.touch(g, i % 3)            # three keys touched over and over
    assert hist.items(g) == [0, 1, 2][20000 % 3:] + [0, 1, 2][:20000 % 3]
    assert len(hist.keys[g]) - hist.head[g] < 3 * 2 + 1024 + 1
