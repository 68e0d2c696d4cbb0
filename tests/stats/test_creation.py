"""A group's block creation read as a token bucket reads it: each function against small
examples worked by hand and, on random series, against its brute-force definition."""

from __future__ import annotations

import itertools
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from psgate.stats.creation import (envelope_burst, max_min_fair, owed_share, quantile,
                                   window_rates)

SETTINGS = settings(max_examples=150, deadline=None)


# -- brute-force definitions ---------------------------------------------------------------

def brute_window_rates(series, w):
    """At each creation i: blocks created so far (k <= i) in (t_i - w, t_i], over w."""
    return [sum(n for t, n in series[:i + 1] if t > ti - w) / w
            for i, (ti, _) in enumerate(series)]


def brute_envelope(series, rho):
    """max over i <= j of the blocks created from i to j less rho * (t_j - t_i); 0 for none."""
    return max((sum(n for _, n in series[i:j + 1]) - rho * (series[j][0] - series[i][0])
                for i in range(len(series)) for j in range(i, len(series))), default=0)


def brute_owed_share(series, rho: int, beta: int, t0: int, t1: int) -> Fraction:
    """The share of [t0, t1] a bucket (rho, beta), full at t0, is below zero, exactly, for
    integer times, blocks, rho and beta, all creations in [t0, t1].

    Its deficit at s is max(0, max over i with t_i <= s of created in [t_i, s] - rho (s - t_i)):
    every corner of that is a multiple of 1/rho, so on each cell between two such multiples
    "deficit > beta" is one thing; it is read at the cell's midpoint."""
    def deficit(s):
        return max([Fraction(0)] + [sum(n for t, n in series if ti <= t <= s) - rho * (s - ti)
                                    for ti, _ in series if ti <= s])

    cells = (t1 - t0) * rho
    owed = sum(1 for c in range(cells) if deficit(t0 + Fraction(2 * c + 1, 2 * rho)) > beta)
    return Fraction(owed, cells)


# -- strategies ----------------------------------------------------------------------------

def int_series(max_t=30, max_n=20, max_size=8):
    """Creations at integer times (non-decreasing, repeats allowed) of integer blocks."""
    return st.lists(st.tuples(st.integers(0, max_t), st.integers(0, max_n)),
                    max_size=max_size).map(sorted)


float_series = st.lists(
    st.tuples(st.floats(0, 1e4, allow_nan=False, allow_infinity=False),
              st.floats(0, 1e3, allow_nan=False, allow_infinity=False)),
    max_size=8).map(sorted)


# -- window_rates --------------------------------------------------------------------------

def test_window_rates_examples():
    assert window_rates([], 2.0) == []
    assert window_rates([(0.0, 2.0), (1.0, 3.0), (2.5, 1.0), (4.0, 4.0)], 2.0) == \
        [1.0, 2.5, 2.0, 2.5]
    # the window is (t - W, t]: a creation exactly W earlier has left it
    assert window_rates([(0.0, 1.0), (2.0, 1.0)], 2.0) == [0.5, 0.5]
    assert window_rates([(0.0, 1.0), (1.999, 1.0)], 2.0) == [0.5, 1.0]
    # at each creation: the ones at the same time before it count, the ones after do not
    assert window_rates([(1.0, 1.0), (1.0, 2.0), (1.0, 3.0)], 0.5) == [2.0, 6.0, 12.0]
    assert window_rates([(5.0, 10.0)], 10.0) == [1.0]


@SETTINGS
@given(series=int_series(), w=st.integers(1, 12))
def test_window_rates_is_the_brute_force(series, w):
    assert window_rates(series, w) == brute_window_rates(series, w)


@SETTINGS
@given(series=float_series, w=st.floats(0.01, 1e3))
def test_window_rates_is_the_brute_force_in_floats(series, w):
    got = window_rates(series, w)
    want = brute_window_rates(series, w)
    assert len(got) == len(want)
    for g, x in zip(got, want):
        # a running total loses at most a few ulps of the total created per subtraction
        assert g == pytest.approx(x, rel=1e-9, abs=1e-9 * sum(n for _, n in series) / w)


# -- envelope_burst ------------------------------------------------------------------------

def test_envelope_burst_examples():
    assert envelope_burst([], 3.0) == 0.0
    assert envelope_burst([(7.0, 5.0)], 3.0) == 5.0
    # 10 at t=0 and 10 at t=2 under rho=3: the pair owes 20 - 6 = 14
    assert envelope_burst([(0.0, 10.0), (2.0, 10.0)], 3.0) == 14.0
    # far enough apart, the bucket refills in between: the larger one alone
    assert envelope_burst([(0.0, 10.0), (10.0, 4.0)], 3.0) == 10.0
    # at one time they add up whatever rho
    assert envelope_burst([(1.0, 2.0), (1.0, 3.0)], 1e9) == 5.0
    # rho 0: everything ever created
    assert envelope_burst([(0.0, 1.0), (5.0, 2.0), (9.0, 3.0)], 0.0) == 6.0


@SETTINGS
@given(series=int_series(), rho=st.integers(0, 8))
def test_envelope_burst_is_the_brute_force(series, rho):
    assert envelope_burst(series, rho) == brute_envelope(series, rho)


@SETTINGS
@given(series=float_series, rho=st.floats(0, 1e3))
def test_envelope_burst_is_the_brute_force_in_floats(series, rho):
    scale = sum(n for _, n in series) + rho * (series[-1][0] if series else 0)
    assert envelope_burst(series, rho) == pytest.approx(brute_envelope(series, rho),
                                                        abs=1e-9 * max(1.0, scale))


@SETTINGS
@given(series=int_series(), rho=st.integers(1, 8), slack=st.integers(0, 5))
def test_a_bucket_of_the_envelope_burst_never_owes(series, rho, slack):
    beta = envelope_burst(series, rho)
    t1 = (series[-1][0] if series else 0) + slack + 1
    assert owed_share(series, rho, beta, 0, t1) == 0.0
    # one block less and it owes, if anything was created
    if beta >= 1:
        assert owed_share(series, rho, beta - 1, 0, t1) > 0.0


@SETTINGS
@given(series=float_series, rho=st.floats(0.01, 1e3))
def test_a_bucket_of_the_envelope_burst_never_owes_in_floats(series, rho):
    beta = envelope_burst(series, rho)
    t1 = (series[-1][0] if series else 0.0) + 1.0
    assert owed_share(series, rho, beta, 0.0, t1) <= 1e-9


# -- owed_share ----------------------------------------------------------------------------

def test_owed_share_examples():
    # beta 10, rho 1, 15 blocks at t=2: at -5 from t=2, back at 0 at t=7: 5 of 20 s
    assert owed_share([(2.0, 15.0)], 1.0, 10.0, 0.0, 20.0) == 0.25
    # the same at t=18: below zero past the end, so only 18..20 counts
    assert owed_share([(18.0, 15.0)], 1.0, 10.0, 0.0, 20.0) == 0.1
    # charged whole at its time: exactly beta never owes, beta + 1 owes 1/rho
    assert owed_share([(2.0, 10.0)], 1.0, 10.0, 0.0, 20.0) == 0.0
    assert owed_share([(2.0, 11.0)], 2.0, 10.0, 0.0, 20.0) == 0.5 / 20
    # a second creation while below zero digs deeper: -5 at t=2, -5 + 1 - 6 = -10 at t=3,
    # back at 0 at t=13
    assert owed_share([(2.0, 15.0), (3.0, 6.0)], 1.0, 10.0, 0.0, 20.0) == 11 / 20
    # the bucket holds at most beta: a long quiet spell does not bank more
    assert owed_share([(100.0, 15.0)], 1.0, 10.0, 0.0, 200.0) == 5 / 200
    # below zero for all of it
    assert owed_share([(0.0, 1000.0)], 1.0, 1.0, 0.0, 20.0) == 1.0
    # nothing created, or no span
    assert owed_share([], 1.0, 1.0, 0.0, 20.0) == 0.0
    assert owed_share([(2.0, 15.0)], 1.0, 10.0, 5.0, 5.0) == 0.0
    assert owed_share([(2.0, 15.0)], 1.0, 10.0, 5.0, 4.0) == 0.0


def test_owed_share_ignores_time_after_the_span():
    assert owed_share([(18.0, 15.0), (30.0, 1.0)], 1.0, 10.0, 0.0, 20.0) == 0.1


@SETTINGS
@given(series=int_series(max_t=12, max_n=12, max_size=6), rho=st.integers(1, 4),
       beta=st.integers(0, 15), slack=st.integers(0, 4))
def test_owed_share_is_the_brute_force(series, rho, beta, slack):
    t1 = (series[-1][0] if series else 0) + slack + 1
    assert owed_share(series, rho, beta, 0, t1) == pytest.approx(
        float(brute_owed_share(series, rho, beta, 0, t1)), abs=1e-9)


@SETTINGS
@given(series=int_series(), rho=st.integers(1, 8), betas=st.lists(st.integers(0, 60),
                                                                     min_size=2, max_size=5),
       slack=st.integers(0, 10))
def test_owed_share_is_a_share_and_falls_as_the_burst_grows(series, rho, betas, slack):
    t1 = (series[-1][0] if series else 0) + slack + 1
    shares = [owed_share(series, rho, b, 0, t1) for b in sorted(betas)]
    assert all(0.0 <= s <= 1.0 for s in shares)
    assert all(a >= b for a, b in zip(shares, shares[1:]))


@SETTINGS
@given(series=float_series, rho=st.floats(0.01, 1e3),
       betas=st.lists(st.floats(0, 1e4), min_size=2, max_size=5))
def test_owed_share_is_a_share_and_falls_as_the_burst_grows_in_floats(series, rho, betas):
    t1 = (series[-1][0] if series else 0.0) + 1.0
    shares = [owed_share(series, rho, b, 0.0, t1) for b in sorted(betas)]
    assert all(0.0 <= s <= 1.0 for s in shares)
    assert all(a >= b - 1e-9 for a, b in zip(shares, shares[1:]))


# -- max_min_fair --------------------------------------------------------------------------

def test_max_min_fair_examples():
    needs = {"a": 1.0, "b": 5.0, "c": 10.0}
    assert max_min_fair(needs, 12.0) == {"a": 1.0, "b": 5.0, "c": 6.0}
    assert max_min_fair(needs, 9.0) == {"a": 1.0, "b": 4.0, "c": 4.0}
    assert max_min_fair(needs, 3.0) == {"a": 1.0, "b": 1.0, "c": 1.0}
    assert max_min_fair(needs, 1.5) == {"a": 0.5, "b": 0.5, "c": 0.5}
    assert max_min_fair(needs, 16.0) == needs
    assert max_min_fair(needs, 100.0) == needs
    assert max_min_fair(needs, 0.0) == {"a": 0.0, "b": 0.0, "c": 0.0}
    assert max_min_fair({"a": 0.0, "b": 5.0}, 0.0) == {"a": 0.0, "b": 0.0}
    assert max_min_fair({"x": 3.0, "y": 3.0}, 4.0) == {"x": 2.0, "y": 2.0}
    assert max_min_fair({}, 5.0) == {}
    # in order of need, then key
    assert list(max_min_fair({"c": 2.0, "b": 1.0, "a": 2.0}, 10.0)) == ["b", "a", "c"]


needs_st = st.dictionaries(st.text("abcdefgh", min_size=1, max_size=3),
                           st.floats(0, 1e3, allow_nan=False, allow_infinity=False)
                           | st.integers(0, 20).map(float),
                           max_size=8)


@SETTINGS
@given(needs=needs_st, budget=st.floats(0, 5e3) | st.integers(0, 60).map(float))
def test_max_min_fair_water_fills(needs, budget):
    out = max_min_fair(needs, budget)
    assert set(out) == set(needs)
    total = sum(out.values())
    assert total <= budget + 1e-9
    assert total == pytest.approx(min(budget, sum(needs.values())), abs=1e-9)
    assert all(0.0 <= out[k] <= needs[k] for k in needs)
    capped = [k for k in needs if out[k] != needs[k]]
    levels = {out[k] for k in capped}
    # every capped key gets the same level, above which all their needs are
    assert len(levels) <= 1
    if capped:
        level = levels.pop()
        assert all(needs[k] > level for k in capped)
        # a need at or under the level is met exactly
        assert all(out[k] == needs[k] for k in needs if needs[k] <= level)
        assert total == pytest.approx(budget, abs=1e-9)
    else:
        assert sum(needs.values()) <= budget + 1e-9


@SETTINGS
@given(needs=needs_st, budget=st.floats(0, 5e3), data=st.data())
def test_max_min_fair_is_the_same_in_any_insertion_order(needs, budget, data):
    first = max_min_fair(needs, budget)
    order = data.draw(st.permutations(list(needs)))
    again = max_min_fair({k: needs[k] for k in order}, budget)
    assert list(again.items()) == list(first.items())


def test_max_min_fair_ties_are_the_same_in_every_order():
    needs = {"a": 3.0, "b": 3.0, "c": 1.0, "d": 3.0}
    want = max_min_fair(needs, 7.0)
    assert want == {"c": 1.0, "a": 2.0, "b": 2.0, "d": 2.0}
    for order in itertools.permutations(needs):
        assert list(max_min_fair({k: needs[k] for k in order}, 7.0).items()) == \
            list(want.items())


# -- quantile ------------------------------------------------------------------------------

def test_quantile_nearest_rank():
    assert quantile([], 0.5) == 0.0
    assert quantile([7.0], 0.0) == 7.0 and quantile([7.0], 1.0) == 7.0
    assert quantile([3.0, 1.0, 2.0], 0.5) == 2.0
    assert quantile([3.0, 1.0, 2.0], 0.33) == 1.0
    assert quantile([3.0, 1.0, 2.0], 0.34) == 2.0
    assert quantile([3.0, 1.0, 2.0], 1.0) == 3.0
    assert quantile([3.0, 1.0, 2.0], 0.0) == 1.0
    ten = [float(x) for x in range(10, 0, -1)]
    assert quantile(ten, 0.5) == 5.0
    assert quantile(ten, 0.9) == 9.0
    assert quantile(ten, 0.91) == 10.0
    assert quantile(ten, 0.99) == 10.0
    assert quantile(ten, 0.1) == 1.0
    assert quantile(ten, 0.11) == 2.0
    assert quantile([1.0, 1.0, 1.0, 5.0], 0.75) == 1.0
    assert quantile([1.0, 1.0, 1.0, 5.0], 0.76) == 5.0


@SETTINGS
@given(values=st.lists(st.integers(-50, 50).map(float), min_size=1, max_size=20),
       q=st.floats(0, 1))
def test_quantile_is_the_least_value_with_q_at_or_below_it(values, q):
    got = quantile(values, q)
    assert got in values
    want = min(v for v in values if sum(x <= v for x in values) >= q * len(values))
    assert got == want
    assert quantile(list(reversed(values)), q) == got
