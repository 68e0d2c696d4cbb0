"""PrefixHistory against the reference it replaces: one OrderedDict LRU set per group.

Each property runs on the installed module (compiled where the install could compile it)
and on the same source interpreted, loaded from its ``.py`` under another name."""

from __future__ import annotations

from collections import OrderedDict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from helpers import interpreted

from psgate import core
from psgate.policy import history
from psgate.policy.history import OPAQUE_KEYS_FROM


FORMS = {"installed": history.PrefixHistory, "interpreted": interpreted(history).PrefixHistory}
form = pytest.mark.parametrize("form", sorted(FORMS))

# (group, prefix): content keys in two namespaces of 2**4 hashes (ns 0 and 1 belong to
# group 0, ns 2 to group 1, as the sim engine's namespaces never span groups), or labels
_KEYS = st.one_of(
    st.tuples(st.integers(0, 1), st.integers(0, 15)).map(lambda t: (0, (t[0] << 4) | t[1])),
    st.integers(0, 15).map(lambda h: (1, (2 << 4) | h)),
    st.integers(0, 3).map(lambda h: (0, OPAQUE_KEYS_FROM | h)),   # no slot: the dict
    st.tuples(st.integers(0, 1), st.sampled_from(["p", "q", "r"])))


@form
@settings(max_examples=300, deadline=None, derandomize=True)
@given(ops=st.lists(_KEYS, max_size=400), bound=st.integers(1, 6),
       shift=st.sampled_from([None, 4]), compact_min=st.sampled_from([1, 4, 1024]))
def test_history_matches_an_ordered_dict_per_group(form, ops, bound, shift, compact_min):
    hist = FORMS[form](bound, shift)
    hist.compact_min = compact_min          # small: drops and compactions interleave
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


@form
@settings(max_examples=100, deadline=None, derandomize=True)
@given(batches=st.lists(st.lists(st.integers(0, 40), max_size=12, unique=True), max_size=60),
       bound=st.integers(1, 8), compact_min=st.sampled_from([2, 1024]))
def test_batch_touches_match_single_ones(form, batches, bound, compact_min):
    one, many = FORMS[form](bound, 4), FORMS[form](bound, 4)
    one.add_group(), many.add_group()
    one.compact_min = many.compact_min = compact_min
    for keys in batches:
        assert many.contains_keys(0, keys) == [one.contains(0, k) for k in keys]
        many.touch_keys(0, keys)
        for k in keys:
            one.touch(0, k)
        assert many.items(0) == one.items(0)


@form
def test_stale_entries_are_compacted(form):
    hist = FORMS[form](4, 32)
    g = hist.add_group()
    for i in range(20000):
        hist.touch(g, i % 3)            # three keys touched over and over
    assert hist.items(g) == [0, 1, 2][20000 % 3:] + [0, 1, 2][:20000 % 3]
    assert len(hist.keys[g]) - hist.head[g] < 3 * 2 + history.COMPACT_MIN + 1


def test_the_installed_history_is_compiled_where_the_core_is():
    """The compiled core calls PrefixHistory's methods as C methods: it cimports the class,
    so where the core is built, so is this module."""
    if core.quiet() is None:
        pytest.skip("the compiled core is not built here")
    assert history.__file__.endswith((".so", ".pyd"))


@form
def test_keys_whose_namespace_is_no_int32_are_kept_in_the_dict(form):
    """A slot keeps its namespace as an int32: with a small key_shift, a key whose
    namespace is larger is kept in the dict, by the batch forms and the single ones."""
    hist = FORMS[form](8, 4)
    g = hist.add_group()
    big = [((1 << 31) << 4) | 1, ((1 << 40) << 4) | 1, (5 << 4) | 1]   # one hash, three ns
    assert hist.contains_keys(g, big) == [False, False, False]
    hist.touch_keys(g, big[:2])
    assert [hist.contains(g, k) for k in big] == [True, True, False]
    assert hist.contains_keys(g, big) == [True, True, False]
    hist.touch(g, big[2])
    assert hist.contains_keys(g, tuple(big)) == [True, True, True]
    assert hist.items(g) == big
    assert set(hist.other) == {(g, big[0]), (g, big[1])} and hist.slot_ns[1] == 5


@form
def test_a_policy_may_keep_attributes_on_the_history(form):
    hist = FORMS[form](2, 32)
    hist.owner_note = "mine"
    g = hist.add_group()
    hist.touch_keys(g, (1, 2))                       # any sequence of int keys
    assert hist.owner_note == "mine" and hist.items(g) == [1, 2]
