"""TokenBuckets (psgate/policy/buckets.py) against the arithmetic written here, in both of
the module's forms: as installed (compiled where the install compiled it) and interpreted
from its source."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import both_forms
from psgate.policy import buckets

form = both_forms(buckets)



# (rho, beta, weight) of three contracts
CONTRACTS = [(1.0, 4.0, 1.0), (4.0, 16.0, 4.0), (2.0, 4.0, 2.0)]


def test_a_bucket_refills_to_its_burst_and_a_charge_puts_it_in_debt(form):
    tb = form.TokenBuckets()
    g = tb.add_group()
    i = tb.add(g, 0, 1.0, 4.0, 1.0, 0.0)
    assert tb.index == {(0, 0): 0} and tb.group_buckets == [[0]]
    assert tb.bhat(i, 0.0) == 4.0 and tb.bhat(i, 100.0) == 4.0        # full: capped
    assert tb.charge(i, 7, 1.0) == -3.0                                 # 4 - 7
    assert (tb.B[i], tb.t0[i], tb.zero_t[i]) == (-3.0, 1.0, 4.0)        # clears at 1 + 3/1
    assert (tb.S[g], tb.k[g], tb.version[i]) == (4.0, 1, 1)
    assert tb.bhat(i, 2.5) == -1.5
    assert tb.clear_next(3.9) == -1
    assert tb.clear_next(4.0) == g and (tb.S[g], tb.k[g]) == (0.0, 0)
    assert tb.clear_next(9.0) == -1
    assert tb.charge(i, 1, 9.0) == 3.0                                  # refilled to 4, less 1
    assert tb.zero_t[i] == -math.inf and tb.k[g] == 0


def test_debts_sum_over_a_group_s_contracts(form):
    """raw = (3-t)+ + (8-4t)+ + (2-2t)+; normalized divides each by its weight; W_g is the
    largest weight among the buckets still in debt; a group without buckets owes the int
    0, as sum() of nothing is."""
    tb = form.TokenBuckets()
    g, h, e = tb.add_group(), tb.add_group(), tb.add_group()
    assert tb.debts(e, 0.0) == (0, 0, 1.0) and type(tb.debts(e, 0.0)[0]) is int
    for c, n in ((0, 7), (1, 24), (2, 6)):
        tb.charge(tb.add(g, c, *CONTRACTS[c], 0.0), n, 0.0)
    tb.add(h, 1, *CONTRACTS[1], 0.0)
    expect = {0.0: (13.0, 6.0, 4.0), 0.5: (9.5, 4.5, 4.0), 1.0: (6.0, 3.0, 4.0),
              2.0: (1.0, 1.0, 1.0), 3.0: (0.0, 0.0, 1.0)}
    for t, want in expect.items():
        assert tb.debts(g, t) == want, t
        assert (tb.raw_debt(g, t), tb.norm_debt(g, t), tb.weight(g, t)) == want, t
        assert tb.debts(h, t) == (0.0, 0.0, 1.0)


charges = st.lists(st.tuples(st.integers(0, 2), st.integers(0, 2), st.integers(0, 20),
                             st.integers(0, 30)), min_size=1, max_size=80)


@settings(max_examples=100, deadline=None)
@given(ops=charges)
def test_sums_follow_the_buckets_in_debt(form, ops):
    """After any charges, at times that only move forward, with every cleared bucket taken
    out (clear_next until -1): the groups come out of clear_next in the order of their
    buckets' (zero_t, index); each group's k is its number of buckets still in debt and S
    the sum of their zero_t; the heap of clearing times stays within its bound."""
    tb = form.TokenBuckets()
    for _ in range(3):
        tb.add_group()
    in_debt: dict[int, float] = {}          # bucket: its zero_t, while counted
    t = 0.0
    for g, c, n, dt in ops:
        t += dt / 10
        cleared = []
        while (cg := tb.clear_next(t)) >= 0:
            cleared.append(cg)
        due = sorted((z, i) for i, z in in_debt.items() if z <= t)
        assert cleared == [tb.group[i] for _, i in due]
        for _, i in due:
            del in_debt[i]
        i = tb.index.get((g, c))
        if i is None:
            i = tb.add(g, c, *CONTRACTS[c], t)
        before = tb.bhat(i, t)
        assert tb.charge(i, n, t) == before - n
        in_debt.pop(i, None)
        if tb.zero_t[i] > t:
            assert tb.zero_t[i] == t - tb.B[i] / tb.rho[i]
            in_debt[i] = tb.zero_t[i]
        for grp in range(3):
            zs = [in_debt[j] for j in tb.group_buckets[grp] if j in in_debt]
            assert tb.k[grp] == len(zs)
            assert tb.S[grp] == pytest.approx(sum(zs), rel=1e-9, abs=1e-9)
        assert len(tb.zheap) <= 2 * len(tb.B) + form.ZHEAP_SLACK + 1
