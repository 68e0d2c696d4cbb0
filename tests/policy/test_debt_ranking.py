"""DebtRanking (psgate/policy/debt_ranking.py) against the ranking computed here by brute
force, in both of the module's forms: as installed (compiled where the install compiled
it) and interpreted from its source."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import interpreted
from psgate.policy import buckets, debt_ranking

FORMS = {"installed": (debt_ranking, buckets)}


@pytest.fixture(scope="module", params=["installed", "interpreted"])
def form(request):
    if request.param not in FORMS:
        FORMS[request.param] = (interpreted(debt_ranking), interpreted(buckets))
    return FORMS[request.param]


def _make(form, num_groups, min_rho=1.0):
    from array import array
    ranking_mod, buckets_mod = form
    tb = buckets_mod.TokenBuckets()
    elig = array("q")
    rk = ranking_mod.DebtRanking(tb, elig, min_rho)
    for _ in range(num_groups):
        tb.add_group()
        elig.append(0)
        rk.add_group()
    return tb, elig, rk


def test_groups_rank_by_their_lines_and_a_moved_group_by_its_batch_p(form):
    """Three groups in debt at t=0: g0 owes 6 blocks (one bucket, clears at t=6), g1 two
    buckets of 2 (k=2, S=4: P = 4 - 2t), g2 3 blocks. At t=1 P is (5, 2, 2): g0 tops, and
    of g1 and g2, tied below it, the runner-up is g2, the head of the per-k heap made
    first (k=1, g0's): g1 stays on its line. g0 gives victims until it falls to 1.5,
    under both: g1 is pulled in, the tie tops, sorted, and g0 runs up. The batch ends:
    all three back on their lines, and a moved group's P stays until its batch ends."""
    tb, elig, rk = _make(form, 4)
    for g, c, n in ((0, 0, 6), (1, 0, 2), (1, 1, 2), (2, 0, 3)):
        tb.charge(tb.add(g, c, 1.0, 10.0, 1.0, 0.0), 10 + n, 0.0)
    assert [tb.k[g] for g in range(4)] == [1, 2, 1, 0]
    for g in range(4):
        elig[g] = 1
        rk.relist(g)
    assert rk.ranked(1.0) == ([0], 5.0, 2, 2.0)
    assert (rk.num_top, rk.top_g, rk.top_p, rk.runner_g, rk.runner_p) == (1, 0, 5.0, 2, 2.0)
    assert list(rk.moved) == [1, 0, 1, 0] and rk.p(0, 1.0) == 5.0 and rk.p(3, 1.0) == 0.0
    rk.responsible(0, 4.0, 1)
    rk.responsible(0, 1.5, 1)
    assert rk.ranked(1.0) == ([1, 2], 2.0, 0, 1.5)
    assert rk.end_batch() == 3 and rk.num_moved == 0 and list(rk.moved) == [0] * 4
    assert rk.ranked(1.0) == ([0], 5.0, 2, 2.0)
    assert rk.ranked(2.5) == ([0], 5.0, 2, 2.0)             # held until the batch ends
    rk.end_batch()
    assert rk.ranked(2.5) == ([0], 3.5, 2, 0.5)             # g1 (k=2) fell to -1 at 2.5


def test_a_group_without_eligible_blocks_or_out_of_range_is_not_ranked(form):
    tb, elig, rk = _make(form, 2)
    for g in range(2):
        tb.charge(tb.add(g, 0, 1.0, 1.0, 1.0, 0.0), 5 + g, 0.0)
        elig[g] = 1
        rk.relist(g)
    assert rk.ranked(0.0)[:3] == ([1], 5.0, 0)
    rk.end_batch()
    elig[1] = 0
    rk.drop(1)
    assert rk.ranked(0.0) == ([0], 4.0, -1, 0.0)
    rk.end_batch()
    elig[0] = 0                         # not dropped: its entry is current, and not live
    assert rk.ranked(0.0) == ([], 0.0, -1, 0.0)
    with pytest.raises(IndexError):
        rk.relist(2)
    with pytest.raises(IndexError):
        rk.p(-1, 0.0)


ops = st.lists(st.tuples(st.sampled_from("charge charge elig drop resp rank end".split()),
                         st.integers(0, 5), st.integers(0, 2), st.integers(1, 12)),
               min_size=1, max_size=120)


@settings(max_examples=150, deadline=None)
@given(ops=ops)
def test_the_ranking_is_the_brute_force_order(form, ops):
    """Under the policy's discipline (relist after a charge, a cleared debt, a first
    eligible block; drop after the last; responsible on the top group; time moving
    forward), every ranking is the brute force's: the groups with eligible blocks and a
    line (k > 0) or a batch P, each at its batch P or min_rho (S - k t); the top groups
    sorted, their P, and a runner-up at the largest P below theirs. The per-k heaps stay
    within their compaction bound."""
    groups, min_rho = 6, 0.5
    tb, elig, rk = _make(form, groups, min_rho)
    moved: dict[int, float] = {}
    t = 0.0
    for op, g, c, n in ops:
        t += n / 8
        g2 = tb.clear_next(t)
        while g2 >= 0:
            rk.relist(g2)
            g2 = tb.clear_next(t)
        if op == "charge":
            i = tb.index.get((g, c))
            if i is None:
                i = tb.add(g, c, (1.0, 2.0, 0.5)[c], 4.0, (2.0, 4.0, 1.0)[c], t)
            tb.charge(i, n, t)
            rk.relist(g)
        elif op == "elig":
            elig[g] += 1
            if elig[g] == 1:
                rk.relist(g)
        elif op == "drop" and elig[g]:
            elig[g] -= 1
            if elig[g] == 0:
                rk.drop(g)
        elif op == "end":
            assert rk.end_batch() == len(moved)
            moved.clear()
        elif op in ("rank", "resp"):
            p = {h: moved[h] if h in moved else min_rho * (tb.S[h] - tb.k[h] * t)
                 for h in range(groups) if elig[h] and (h in moved or tb.k[h] > 0)}
            top, top_p, runner, runner_p = rk.ranked(t)
            want_p = max(p.values(), default=0.0)
            assert top == sorted(h for h in p if p[h] == want_p) and top_p == want_p
            below = [q for q in p.values() if q < want_p]
            if below:
                assert runner_p == max(below) and p[runner] == runner_p
            else:
                assert (runner, runner_p) == (-1, 0.0)
            for h in range(groups):          # pulled in: held at its P for the batch
                if rk.moved[h] and h not in moved:
                    assert rk.moved_p[h] == p[h]
                    moved[h] = p[h]
            assert set(top) | {runner} - {-1} <= set(moved)
            if op == "resp" and top:
                moved[top[0]] = top_p - n / 4
                rk.responsible(top[0], top_p - n / 4, 1)
        assert all(s <= 2 * groups + 32 + 1 for s in rk.heap_sizes().values())


@settings(max_examples=100, deadline=None)
@given(entries=st.lists(st.tuples(st.integers(-5, 5), st.integers(0, 9)), unique=True,
                        max_size=60), num_pops=st.integers(0, 60))
def test_the_heap_functions_pop_entries_in_order(entries, num_pops):
    """sift_up and pop_top (the interpreted source, which the install compiles) keep a
    heap: pushes then pops give the entries sorted, ties on the key broken by the group."""
    from array import array
    mod = FORMS.get("interpreted", (None,))[0] or interpreted(debt_ranking)
    a = array("d", [0.0]) * (3 * len(entries))
    for n, (k, g) in enumerate(entries):
        mod.sift_up(a, n, float(k), float(g), 1.0)
    n = len(entries)
    popped = []
    for _ in range(min(num_pops, n)):
        popped.append((int(a[0]), int(a[1])))
        n = mod.pop_top(a, n)
    assert popped == sorted(entries)[:len(popped)]
