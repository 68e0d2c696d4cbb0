"""DebtRanking (psgate/policy/debt_ranking.py) against the ranking computed here by brute
force, in both of the module's forms: as installed (compiled where the install compiled
it) and interpreted from its source."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import both_forms, interpreted
from psgate.policy import buckets, debt_ranking

form = both_forms(debt_ranking, buckets)


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


def _check_brute_force(tb, elig, rk, moved, t, min_rho, top, top_p, runner, runner_p):
    """The ranking (top, top_p, runner, runner_p) is the brute force's over the groups
    with eligible blocks and a line (k > 0) or a batch P (``moved``, which learns the
    groups the ranking pulled in)."""
    p = {h: moved[h] if h in moved else min_rho * (tb.S[h] - tb.k[h] * t)
         for h in range(len(elig)) if elig[h] and (h in moved or tb.k[h] > 0)}
    want_p = max(p.values(), default=0.0)
    assert top == sorted(h for h in p if p[h] == want_p) and top_p == want_p
    below = [q for q in p.values() if q < want_p]
    if below:
        assert runner_p == max(below) and p[runner] == runner_p
    else:
        assert (runner, runner_p) == (-1, 0.0)
    for h in range(len(elig)):           # pulled in: held at its P for the batch
        if rk.moved[h] and h not in moved:
            assert rk.moved_p[h] == p[h]
            moved[h] = p[h]
    assert set(top) | {runner} - {-1} <= set(moved)


def _clear_debts(tb, rk, t):
    """Buckets whose debt cleared by t leave their groups' lines (PrefixShield._advance)."""
    g = tb.clear_next(t)
    while g >= 0:
        rk.line_moved(g)
        g = tb.clear_next(t)


def _moves_a_group(tb, elig, rk, op, g, c, n, t):
    """Whether op is one that moves group g, done as the policy does it: a charge of n
    blocks to its bucket for contract c (made on first use), an eligible block gained
    (``elig``) or lost (``drop``)."""
    if op == "charge":
        i = tb.index.get((g, c))
        if i is None:
            i = tb.add(g, c, (1.0, 2.0, 0.5)[c], 4.0, (2.0, 4.0, 1.0)[c], t)
        tb.charge(i, n, t)
        rk.line_moved(g)
    elif op == "elig":
        elig[g] += 1
        if elig[g] == 1:
            rk.relist(g)
    elif op == "drop" and elig[g]:
        elig[g] -= 1
        if elig[g] == 0:
            rk.drop(g)
    else:
        return op == "drop"
    return True


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
        _clear_debts(tb, rk, t)
        if _moves_a_group(tb, elig, rk, op, g, c, n, t):
            pass
        elif op == "end":
            assert rk.end_batch() == len(moved)
            moved.clear()
        elif op in ("rank", "resp"):
            top, top_p, runner, runner_p = rk.ranked(t)
            _check_brute_force(tb, elig, rk, moved, t, min_rho, top, top_p, runner, runner_p)
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
    mod = interpreted(debt_ranking)
    a = array("d", [0.0]) * (3 * len(entries))
    for n, (k, g) in enumerate(entries):
        mod.sift_up(a, n, float(k), float(g), 1.0)
    n = len(entries)
    popped = []
    for _ in range(min(num_pops, n)):
        popped.append((int(a[0]), int(a[1])))
        n = mod.pop_top(a, n)
    assert popped == sorted(entries)[:len(popped)]


def test_a_run_of_victims_leaves_the_ranking_as_one_took_per_victim(form):
    """g0 (P 5) tops ahead of g2 (P 2). Three victims of 1 each: as a run, nothing is
    written until it ends (flush, or anything that reads the ranking); then g0's P, its
    version and the kept ranking are those three calls of took leave. A fourth victim
    takes g0 to 2, no longer above the runner-up: the run ends by itself and the ranking
    is made afresh, the tie sorted."""
    states = []
    for how in ("took", "run"):
        tb, elig, rk = _make(form, 3)
        for g, n in ((0, 6), (2, 3)):
            tb.charge(tb.add(g, 0, 1.0, 10.0, 1.0, 0.0), 10 + n, 0.0)
            elig[g] = 1
            rk.relist(g)
        assert rk.cached(1.0) == ([0], 5.0, 2, 2.0) and rk.valid
        for p_after in (4.0, 3.0, 2.5):
            if how == "took":
                rk.took(0, p_after)
            else:
                rk.run(0, p_after, 2, 2.0, 1.0)
                assert (rk.run_g, rk.run_p, rk.run_w) == (0, p_after, 1.0)
                assert rk.moved_p[0] == 5.0             # written when the run ends
        if how == "run":
            assert rk.run_n == 3
            rk.flush()
            assert rk.run_g == -1
        assert rk.valid and rk.moved_p[0] == 2.5
        states.append((list(rk.gver), list(rk.moved_p), rk.cached(1.0)))
        assert states[-1][2] == ([0], 2.5, 2, 2.0)
        if how == "run":
            rk.run(0, 2.0, 2, 2.0, 0.5)
            assert rk.run_g == -1 and not rk.valid      # met the runner-up: ended
        else:
            rk.took(0, 2.0)
            assert not rk.valid
        assert rk.cached(1.0) == ([0, 2], 2.0, -1, 0.0)
    assert states[0] == states[1]


def test_whatever_reads_or_moves_the_ranking_ends_a_run_first(form):
    """A pending run is written before a relist, a drop, the batch's end, a ranking (kept
    or afresh) or another victim, so none of them sees g0 at its P before the run."""
    for end in ("relist", "drop", "end_batch", "ranked", "cached", "took"):
        tb, elig, rk = _make(form, 2)
        tb.charge(tb.add(0, 0, 1.0, 10.0, 1.0, 0.0), 16, 0.0)
        elig[0] = elig[1] = 1
        rk.relist(0)
        assert rk.cached(0.0) == ([0], 6.0, -1, 0.0)
        rk.run(0, 5.0, -1, 0.0, 1.0)
        if end == "relist":
            rk.relist(1)
        elif end == "drop":
            elig[1] = 0
            rk.drop(1)
        elif end == "end_batch":
            assert rk.end_batch() == 1
            assert rk.moved[0] == 0 and rk.cached(0.0) == ([0], 6.0, -1, 0.0)
            continue
        elif end == "took":
            rk.took(0, 4.0)
            assert rk.run_g == -1 and rk.moved_p[0] == 4.0
            assert rk.valid and rk.cached(0.0) == ([0], 4.0, -1, 0.0)
            continue
        else:
            assert getattr(rk, end)(0.0) == ([0], 5.0, -1, 0.0)
        assert rk.run_g == -1 and rk.moved_p[0] == 5.0, end
        assert rk.valid == (end in ("ranked", "cached"))
        assert rk.cached(0.0) == ([0], 5.0, -1, 0.0)


def test_inv_w_is_kept_until_the_line_moves(form):
    """1 / W_g, W_g the largest weight among g's buckets in debt: kept while g's line
    holds, computed again after line_moved (a charge, a debt that cleared)."""
    tb, elig, rk = _make(form, 1)
    light = tb.add(0, 0, 1.0, 10.0, 2.0, 0.0)
    heavy = tb.add(0, 1, 1.0, 10.0, 4.0, 0.0)
    tb.charge(light, 12, 0.0)
    rk.line_moved(0)
    assert rk.inv_w(0, 0.0) == 0.5
    tb.charge(heavy, 12, 0.0)
    assert rk.inv_w(0, 0.0) == 0.5                      # not told: kept
    rk.line_moved(0)
    assert rk.inv_w(0, 0.0) == 0.25
    with pytest.raises(IndexError):
        rk.inv_w(1, 0.0)


batch_ops = st.lists(st.tuples(st.sampled_from("admit charge elig drop look took run run"
                                                .split()),
                               st.integers(0, 5), st.integers(0, 2), st.integers(1, 12)),
                     min_size=1, max_size=150)


@settings(max_examples=150, deadline=None)
@given(ops=batch_ops)
def test_the_ranking_kept_between_victims_is_the_brute_force_order(form, ops):
    """Under the policy's batches (time moves at an admission: start_batch ends the last
    batch, clears debts and forgets the ranking), the ranking that ``cached`` gives, kept
    through ``took`` and runs of victims, is the brute force's every time it is read."""
    groups, min_rho = 6, 0.5
    tb, elig, rk = _make(form, groups, min_rho)
    moved: dict[int, float] = {}
    t = 0.0
    for op, g, c, n in ops:
        if op == "admit":
            assert rk.num_moved == len(moved)
            moved.clear()
            t += n / 8
            rk.start_batch(t)
            assert rk.num_moved == 0 and not rk.valid and tb.clear_next(t) == -1
        elif _moves_a_group(tb, elig, rk, op, g, c, n, t):
            pass
        elif op in ("look", "took", "run"):
            top, top_p, runner, runner_p = rk.cached(t)
            _check_brute_force(tb, elig, rk, moved, t, min_rho, top, top_p, runner, runner_p)
            if op == "look" or not top:
                continue
            h, w = top[0], n / 4
            if op == "took" or len(top) > 1:
                moved[h] = top_p - w
                rk.took(h, top_p - w)
                continue
            for _ in range(c + 1):          # victims of h while it stays alone on top
                top_p -= w
                moved[h] = top_p
                rk.run(h, top_p, runner, runner_p, w)
                if rk.run_g < 0:
                    break


def test_start_batch_takes_a_cleared_debt_off_its_group_s_line(form):
    """g0 owes 6 blocks (clears at t=6), g1 owes 5 (t=5). At t=1 g0 tops; a batch at t=5.5
    ends the last one and takes g1's cleared bucket off its line, so g1 is neither top
    nor runner-up: only g0 ranks, at 0.5."""
    tb, elig, rk = _make(form, 2)
    for g, n in ((0, 6), (1, 5)):
        tb.charge(tb.add(g, 0, 1.0, 10.0, 1.0, 0.0), 10 + n, 0.0)
        elig[g] = 1
        rk.relist(g)
    assert rk.cached(1.0) == ([0], 5.0, 1, 4.0)
    rk.start_batch(5.5)
    assert list(tb.k) == [1, 0] and rk.num_moved == 0 and not rk.valid
    assert rk.cached(5.5) == ([0], 0.5, -1, 0.0)
