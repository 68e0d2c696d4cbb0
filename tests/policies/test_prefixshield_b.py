"""prefixshield-b (psgate's extension): the bounded Probationary segment and its
adaptive bound, with exact victims; invariants on random traces.

Block size 4; ``cap`` configured blocks give cap-1 usable ones. Contracts as in
test_prefixshield where a test needs debt (standard rho 1 / beta 4, ...).
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from psgate.errors import InputError
from psgate.policies import make_policy, policy_names
from psgate.policies.prefixshield import NORMAL, PROBATIONARY, REUSE
from psgate.policies.prefixshield_b import EVIDENCE, NATIVE_CHOICE, SEGMENT_CHOICE

from helpers import NoteLog, replay_file, write, write_lines
from test_differential import traces
from test_prefixshield import C, KC, Driver, random_trace


def _checked(path, cap, params=None, policy="prefixshield-b"):
    result, log, engine = replay_file(path, cap, policy=policy, paranoid=True, params=params,
                                      recorder=NoteLog())
    assert result.aborted is None
    bad = {n: v.first_violation for n, v in result.invariants.items() if not v.holds}
    assert not bad, bad
    return result, log, engine


def test_registered_with_its_parameters_and_the_family_claims():
    assert "prefixshield-b" in policy_names()
    p = make_policy("prefixshield-b")
    assert p.params["probationary_bound"] == "adaptive" and p.params["initial_bound"] == 0.0
    assert p.params["evidence_fill"] == 0.5 and p.params["output_weight"] == 0.25
    assert p.claims() == ("I1", "I2") and p.params["leaf_only"] is True
    assert make_policy("prefixshield-b", {"probationary_bound": 0.25}).adaptive is False


@pytest.mark.parametrize("params,needle", [
    ({"probationary_bound": "auto"}, "'probationary_bound' must be a number in [0, 1] or"),
    ({"probationary_bound": 1.5}, "'probationary_bound' must be a number in [0, 1]"),
    ({"probationary_bound": True}, "'probationary_bound' must be a number"),
    ({"initial_bound": -0.1}, "'initial_bound' must be a number in [0, 1]"),
    ({"evidence_fill": 2}, "'evidence_fill' must be a number in [0, 1], found 2"),
    ({"bound": 0.1}, "unknown parameter(s) for policy 'prefixshield-b': bound"),
])
def test_bad_parameters_are_input_errors(params, needle):
    with pytest.raises(InputError) as exc:
        make_policy("prefixshield-b", params)
    assert needle in str(exc.value)


# -- the bound -----------------------------------------------------------------------------

def _bound_trace(tmp_path, debt: bool):
    """g's candidates: a1 <- a2 (Reuse, freed at 1.5) and c1 <- c2 (Probationary, freed at
    2.5); then h needs 4 of them. With ``debt`` g also holds 12 pinned blocks charged
    beyond its burst, so g is the responsible group for every victim; without, nobody
    owes anything and the order is the global one, the only one the bound governs."""
    events = [
        {"t": 0, "id": "A", "prefix": "p", "blocks": ["a1", "a2"], "tail": 1, "done_t": 0.5},
        {"t": 1, "id": "B", "prefix": "p", "blocks": ["a1", "a2"], "tail": 1, "done_t": 1.5},
        {"t": 2, "id": "C", "prefix": "q", "blocks": ["c1", "c2"], "tail": 1, "done_t": 2.5},
    ]
    if debt:
        events.append({"t": 2, "id": "D", "prefix": "z", "done_t": 100,
                       "blocks": [f"d{i:x}" for i in range(12)]})
    n = 7 if debt else 19        # h needs every free block and 4 candidates
    events.append({"t": 3, "id": "E", "group": "h", "blocks": [f"e{i:x}" for i in range(n)],
                   "tail": 1, "done_t": 4})
    return write(tmp_path, events, name=f"bound-{debt}.jsonl")


@pytest.mark.parametrize("debt", [False, True])
@pytest.mark.parametrize("bound,expect,orders", [
    # T = 0: prefixshield's order (Probationary first), as long as candidates exist
    (0.0, ["c2", "c1", "a2", "a1"], ["segments"] * 4),
    # T = round(0.1 x 20) = 2: segments while 2 Probationary candidates remain, then native
    (0.1, ["c2", "a2", "a1", "c1"], ["segments", "native", "native", "native"]),
    # T = 4 > the 2 Probationary candidates: native free-queue order throughout
    (0.2, ["a2", "a1", "c2", "c1"], ["native"] * 4),
    (1.0, ["a2", "a1", "c2", "c1"], ["native"] * 4),
])
def test_segment_order_only_while_probationary_candidates_reach_the_bound(
        tmp_path, debt, bound, expect, orders):
    params = {"probationary_bound": bound}
    if debt:
        # a responsible group gives up its blocks in prefixshield's order, whatever T
        params["contracts"] = C
        expect, orders = ["c2", "c1", "a2", "a1"], ["segments"] * 4
    result, log, engine = _checked(_bound_trace(tmp_path, debt), 21, params)
    assert log.evictions == [f"g:{x}" for x in expect]
    assert [d.rank["order"] for d in log.decisions] == orders
    assert [d.rank["probationary_bound"] for d in log.decisions] == [round(bound * 20)] * 4
    cls = {"a": "reuse", "c": "probationary"}
    assert [d.rank["class"] for d in log.decisions] == [cls[x[0]] for x in expect]
    # the Probationary candidates before each victim
    got = [d.rank["probationary_candidates"] for d in log.decisions]
    left, want = 2, []
    for x in expect:
        want.append(left)
        left -= x[0] == "c"
    assert got == want
    if debt:
        assert {d.responsible for d in log.decisions} == {"g"}
        assert [d.queue for d in log.decisions] == [f"g/{c}" for c in
                                                     (d.rank["class"] for d in log.decisions)]
    else:
        assert all(d.responsible is None and d.rank["global_fallback"] for d in log.decisions)
    # at the end: h's blocks and D's (19 in either case), all Probationary candidates
    pol = engine.policy
    assert pol.num_prob == sum(1 for b in pol.candidates() if pol.cls[b] == PROBATIONARY) == 19


def test_bound_zero_matches_prefixshield_on_a_multi_group_trace(tmp_path):
    path = random_trace(tmp_path, 5, num_requests=300)
    _, ps, _ = _checked(path, 40, {"contracts": KC}, policy="prefixshield")
    _, b0, _ = _checked(path, 40, {"contracts": KC, "probationary_bound": 0.0})
    assert ps.evictions == b0.evictions and len(ps.evictions) > 100
    assert [(d.queue, d.responsible, d.responsible_p_after) for d in ps.decisions] == \
        [(d.queue, d.responsible, d.responsible_p_after) for d in b0.decisions]
    # a bound that matters changes some decisions, never the invariants
    _, b3, _ = _checked(path, 40, {"contracts": KC, "probationary_bound": 0.3})
    assert b3.evictions != ps.evictions
    assert {d.rank["order"] for d in b3.decisions} == {"segments", "native"}


# -- the adaptive bound ------------------------------------------------------------------------

def _evict(d, n, t):
    """Select and evict n victims inside an admission of a neutral group at time t."""
    out = []

    def during():
        for _ in range(n):
            v = d.p.select_victim(None, round(t * 1e9)).victim
            d.p.on_evict(v)
            out.append(v)

    d.admit(t, "n", during=during)
    return out


def _ev(**counts):
    """A ledger note's ``evidence``: the given counts, zeros elsewhere."""
    return {k: counts.get(k, 0) for k in EVIDENCE}


def _proven_reuse(d, group, key, t, t_hit):
    """A candidate of ``group`` in Reuse: cached at t with content ``key``, freed, hit by
    the same group at t_hit (proven reuse, owing nothing), freed again."""
    (blk,), _ = d.admit(t, group, new=1, keys=[key])
    d.free([blk], t)
    d.admit(t_hit, group, hits=[blk])
    d.free([blk], t_hit)
    return blk


def _setup(d):
    """g's candidates: a0 (key 11, Reuse, freed first) and b = [b0 <- b1] (keys 12, 13,
    Probationary, freed later)."""
    p = d.p
    a0 = _proven_reuse(d, "g", 11, 0.0, 0.25)
    b, _ = d.admit(0.5, "g", new=2, keys=[12, 13])               # Probationary, freed later
    d.free(b, 0.5)
    assert p.num_prob == 2 and p.cls[a0] == REUSE
    return a0, b


def test_regrets_of_each_order_move_the_bound():
    d = Driver("prefixshield-b", num_blocks=101, initial_bound=0.01)     # 100 usable; T = 1
    p = d.p
    assert p.adaptive and p.bound == 1
    a0, b = _setup(d)
    # 2 Probationary candidates >= T: segment order takes b's leaf where native order
    # would take a0: a pair (13, a0)
    assert _evict(d, 1, 0.75) == [b[1]]
    assert p.ghost_tags() == [(13, SEGMENT_CHOICE)] and list(p.spared) == [a0]
    # g recomputes it before anyone reuses a0: a regret of segment order, so T rises
    (c,), note = d.admit(1.0, "g", new=1, hits=[b[0]], keys=[13])
    assert note["evidence"] == _ev(regret_segment=1)
    assert note["probationary_bound"] == 2 and p.bound == 2 and not p.ghost and not p.spared
    assert (p.cls[b[0]], p.cls[c]) == (REUSE, NORMAL)            # c is a re-admission
    d.free([b[0], c], 1.0)
    # no Probationary candidate, 0 < T, and the requester owes nothing: native order
    # takes a0 (proven reuse, freed earliest) and spares the Normal leaf c
    assert p.num_prob == 0 and _evict(d, 1, 1.25) == [a0]
    assert p.ghost_tags() == [(11, NATIVE_CHOICE)] and list(p.spared) == [c]
    # g recomputes a0's content first: native order's regret, T falls
    _, note = d.admit(1.5, "g", new=1, keys=[11])
    assert note["evidence"] == _ev(regret_native=1)
    assert p.bound == 1 and p.evidence_totals == [1, 1, 0, 0, 0]


@pytest.mark.parametrize("requester,standing", [("n", True), ("h", False)])
def test_with_no_probationary_candidate_a_requester_not_in_good_standing_gets_segments(
        requester, standing):
    # fixed T = 5; g's candidates: a0 (Reuse, freed first) and m (Normal); p stays pinned
    d = Driver("prefixshield-b", num_blocks=101, contracts=C, probationary_bound=0.05)
    p = d.p
    a0 = _proven_reuse(d, "g", 11, 0.0, 0.0)
    d.admit(0.0, "g", new=1, prefix="p", keys=[21])
    (m,), _ = d.admit(0.0, "g", new=1, prefix="p", keys=[22])
    d.free([m], 0.0)
    assert (p.cls[a0], p.cls[m], p.num_prob) == (REUSE, NORMAL, 0)
    # h has spent 3 of its 4-block burst (owes nothing, below half); n has spent nothing
    d.admit(0.0, "h", new=3, keys=[31, 32, 33])
    seen = []

    def during():
        dec = p.select_victim(None, round(0.1 * 1e9))
        p.on_evict(dec.victim)
        seen.append(dec)

    d.admit(0.1, requester, during=during)
    (dec,) = seen
    assert dec.responsible is None and dec.rank["requester_in_good_standing"] is standing
    # n: native order, the Reuse block freed first; h: the paper's order, Normal first
    assert dec.victim == (a0 if standing else m)
    assert dec.rank["order"] == ("native" if standing else "segments")
    assert dec.rank["orders_agree"] is False


def test_evidence_against_the_defence_counts_only_from_a_group_in_good_standing():
    # h's standard contract: rho 1, beta 4 blocks; 100 usable blocks, T = 1
    d = Driver("prefixshield-b", num_blocks=101, contracts=C, initial_bound=0.01)
    p = d.p
    assert p.evidence_fill == 0.5
    x = _proven_reuse(d, "h", 31, 0.0, 0.0)
    (y,), _ = d.admit(0.0, "h", new=1, keys=[32])                # Probationary
    d.free([y], 0.0)
    # nobody owes anything; 1 Probationary candidate >= T: segment order takes y where
    # native order would take x
    assert _evict(d, 1, 0.25) == [y] and p.ghost_tags() == [(32, SEGMENT_CHOICE)]
    (z,), _ = d.admit(0.25, "h", new=1, keys=[41])
    d.free([z], 0.25)
    # h owes nothing but has 1.5 of its 4-block burst left (below half): its regret of
    # segment order, evidence against the defence, is ignored
    assert p.bhat(p.buckets.index[(p.gids["h"], p.cidx["standard"])], 0.5) == 1.5
    (y2,), note = d.admit(0.5, "h", new=1, keys=[32])
    assert note["raw_debt"] == 0
    assert note["evidence"] == _ev(ignored=1) and p.bound == 1 and not p.pairs
    d.free([y2], 0.5)
    # segment order takes z (Probationary) and spares x
    assert _evict(d, 1, 0.6) == [z] and list(p.spared) == [x]
    # h overdraws; reusing x first is a credit of segment order, evidence for the
    # defence: it counts although h is in debt
    w, note = d.admit(0.75, "h", new=6, keys=[51, 52, 53, 54, 55, 56])
    assert note["raw_debt"] > 0
    _, note = d.admit(1.0, "h", hits=[x])
    assert note["evidence"] == _ev(credit_segment=1) and p.bound == 0
    d.free(w, 1.0)
    # h is responsible now: its own segment order takes its Probationary leaf where its
    # native order would take y2; recomputing that leaf in debt moves nothing
    assert _evict(d, 1, 1.25) == [w[-1]] and list(p.spared) == [y2]
    _, note = d.admit(1.5, "h", new=1, hits=w[:-1], keys=[56])
    assert note["evidence"] == _ev(ignored=1)
    assert p.bound == 0 and p.evidence_totals == [0, 0, 1, 0, 2] and not p.pairs


def test_credits_when_the_spared_block_is_reused_first():
    # segment order took b1 and spared a0; a0 is reused first: segment order was right
    d = Driver("prefixshield-b", num_blocks=101, initial_bound=0.01)    # T = 1
    p = d.p
    a0, b = _setup(d)
    assert p.bound == 1 and _evict(d, 1, 0.75) == [b[1]]                # 2 >= T: segments
    assert p.ghost_tags() == [(13, SEGMENT_CHOICE)]
    _, note = d.admit(1.0, "g", hits=[a0])
    assert note["evidence"] == _ev(credit_segment=1) and note["probationary_bound"] == 0
    assert not p.ghost and not p.spared and not p.pairs
    # b1's content needed later: the pair is settled already, nothing moves
    _, note = d.admit(1.25, "g", new=1, hits=[b[0]], keys=[13])
    assert "evidence" not in note and p.bound == 0
    # native order took a0 and spared b1; b is reused first: native order was right
    d = Driver("prefixshield-b", num_blocks=101, initial_bound=0.05)    # T = 5
    p = d.p
    a0, b = _setup(d)
    assert _evict(d, 1, 0.75) == [a0] and p.ghost_tags() == [(11, NATIVE_CHOICE)]
    assert list(p.spared) == [b[1]]
    _, note = d.admit(1.0, "g", hits=b)
    assert note["evidence"] == _ev(credit_native=1) and p.bound == 6
    assert p.evidence_totals == [0, 0, 0, 1, 0]


def test_a_pair_whose_spared_block_is_evicted_keeps_its_regret_side():
    d = Driver("prefixshield-b", num_blocks=101)
    p = d.p
    a0, b = _setup(d)
    assert _evict(d, 1, 0.75) == [b[1]]          # spares a0
    assert _evict(d, 1, 0.8) == [b[0]]           # spares a0 again
    assert len(p.spared[a0]) == 2
    assert _evict(d, 1, 0.9) == [a0]             # the only candidate: the orders agree
    assert not p.spared and p.ghost_tags() == [(13, SEGMENT_CHOICE), (12, SEGMENT_CHOICE)]
    _, note = d.admit(1.0, "g", new=2, keys=[12, 13])
    assert note["evidence"] == _ev(regret_segment=2) and p.bound == 2


def test_ghost_holds_at_most_usable_keys(tmp_path):
    # 3 usable blocks; aa is proven reuse and the oldest candidate throughout; r_i caches
    # c_i and, from r1 on, segment order evicts c_(i-1) where native order would take aa
    events = [{"t": 0, "id": "a", "blocks": ["aa"], "tail": 1, "done_t": 0.5},
              {"t": 1, "id": "b", "blocks": ["aa"], "tail": 1, "done_t": 1.5}]
    events += [{"t": 2 + i, "id": f"r{i}", "blocks": [f"c{i}"], "tail": 1,
                "done_t": 2.5 + i} for i in range(8)]
    events += [{"t": 20 + n, "id": f"x{j}", "blocks": [f"c{j}"], "tail": 1,
                "done_t": 20.5 + n} for n, j in enumerate((6, 5))]
    seen = {"keys": [], "ghost": []}

    def spy(engine, log):
        pol = engine.policy
        evict = pol.on_evict

        def on_evict(b):
            seen["keys"].append(pol.key[b])
            evict(b)
            seen["ghost"].append(list(pol.ghost))
            assert len(pol.ghost) == len(pol.pairs) <= 3
            assert sum(map(len, pol.spared.values())) <= len(pol.pairs)   # open pairs only

        pol.on_evict = on_evict

    result, log, engine = replay_file(write(tmp_path, events), 4, policy="prefixshield-b",
                                      paranoid=True, recorder=NoteLog(), setup=spy)
    assert all(v.holds for v in result.invariants.values())
    assert log.evictions[:7] == [f"g:c{i}" for i in range(7)]
    assert not any(d.rank["orders_agree"] for d in log.decisions[:7])
    keys = seen["keys"]
    assert seen["ghost"][6] == keys[4:7]            # c0..c3 pushed out, oldest first
    assert [log.notes[x]["evidence"] for x in ("x6", "x5")] == [_ev(regret_segment=1)] * 2
    assert [log.notes[x]["probationary_bound"] for x in ("x6", "x5")] == [1, 2]


def test_adaptive_bound_is_clamped_to_zero_and_the_usable_blocks():
    for initial, tag, want in ((1.0, SEGMENT_CHOICE, 100), (0.0, NATIVE_CHOICE, 0)):
        d = Driver("prefixshield-b", num_blocks=101, initial_bound=initial)
        d.p.pairs[0] = [77, -1, tag]         # an open pair whose spared block is gone
        d.p.ghost[77] = 0
        _, note = d.admit(0.0, "g", new=1, keys=[77])
        assert sum(note["evidence"].values()) == 1 and d.p.bound == want


def test_fixed_bound_keeps_no_ghost():
    d = Driver("prefixshield-b", num_blocks=11, probationary_bound=0.5)
    a, _ = d.admit(0.0, "g", new=2, keys=[1, 2])
    d.free(a, 0.0)
    _evict(d, 2, 0.5)
    _, note = d.admit(1.0, "g", new=2, keys=[1, 2])
    assert not d.p.ghost and not d.p.pairs and "evidence" not in note and d.p.bound == 5


# -- invariants ------------------------------------------------------------------------------

def _counting(engine, log):
    """Check the policy's Probationary candidate count against a recount at every decision."""
    pol = engine.policy
    select = pol.select_victim

    def checked(req, now):
        want = sum(1 for b in pol.candidates() if pol.cls[b] == PROBATIONARY)
        assert pol.num_prob == want
        return select(req, now)

    pol.select_victim = checked


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
@pytest.mark.parametrize("params", [{}, {"initial_bound": 0.3}, {"probationary_bound": 0.1},
                                    {"probationary_bound": 0.6},
                                    {"probationary_bound": 0.2, "leaf_only": False}])
def test_invariants_hold_on_random_multi_group_traces(tmp_path, seed, params):
    path = random_trace(tmp_path, seed, num_requests=250)
    result, log, _ = replay_file(path, 30 + 7 * seed, policy="prefixshield-b", paranoid=True,
                                 params={"contracts": KC, **params}, setup=_counting)
    assert result.aborted is None
    bad = {n: v.first_violation for n, v in result.invariants.items() if not v.holds}
    assert not bad, bad
    assert result.invariants["I1"].checks > 0 and result.invariants["I2"].checks > 0
    assert len(log.evictions) > 50
    if params.get("leaf_only", True):
        assert result.orphans["orphans_created"] == 0


@settings(max_examples=80, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(lines=traces(), capacity=st.integers(4, 16), bound=st.sampled_from([0.0, 0.2, 0.5]))
def test_random_small_traces_paranoid_and_bound_zero_is_prefixshield(tmp_path, lines,
                                                                     capacity, bound):
    p = write_lines(tmp_path, lines)
    r, log, _ = replay_file(p, capacity, policy="prefixshield-b", paranoid=True,
                            params={"probationary_bound": bound}, setup=_counting)
    assert r.aborted is None and all(v.holds for v in r.invariants.values())
    if bound == 0.0:
        _, ref, _ = replay_file(p, capacity, policy="prefixshield")
        assert log.evictions == ref.evictions


# -- the charge of generated-token blocks ---------------------------------------------------

# buckets that hardly refill over a replay, so a balance is burst minus the charges
SLOW = {"critical": [1e-9, 6.0], "standard": [1e-9, 4.0], "best-effort": [1e-9, 3.0]}

class _Notes(NoteLog):
    """Every admission batch's note, per request, in order (the step scheduler writes one
    per allocation batch)."""

    def __init__(self) -> None:
        super().__init__()
        self.all: dict[str, list[dict]] = {}

    def admission(self, now_ns, req, hits, allocated, new_blocks, note) -> None:
        super().admission(now_ns, req, hits, allocated, new_blocks, note)
        self.all.setdefault(req.id, []).append(dict(note))


def _step_replay(path, cap, params):
    from psgate.engines import engine_class
    from psgate.trace.reader import HashTable, TraceReader, TraceSource, validate_trace
    hashes = HashTable()
    header, summary = validate_trace(str(path), hashes)
    log = _Notes()
    policy = make_policy("prefixshield-b", params)
    engine = engine_class("sim", "step")(header=header, hashes=hashes, capacity=cap,
                                         policy=policy, contracts=C, paranoid=True,
                                         done_ids=summary.done_ids, recorder=log,
                                         groups=summary.groups)
    with TraceReader(TraceSource(str(path), path), hashes) as reader:
        result = engine.run(reader.events())
    assert result.aborted is None
    bad = {n: v.first_violation for n, v in result.invariants.items() if not v.holds}
    assert not bad, bad
    # the checker's own buckets (charges from the engine's count of output blocks) agree
    (audit,) = engine.auditors
    for (g, c), (b, t0) in audit.buckets.items():
        i = policy.buckets.index[(policy.gids[g], policy.cidx[c])]
        assert b == pytest.approx(policy.buckets.B[i], abs=1e-9) and t0 == policy.buckets.t0[i]
    return log, policy


def test_generated_token_blocks_are_charged_output_weight_each(tmp_path):
    """One request, 2 prompt blocks of 4 tokens, 17 tokens generated: the prompt batch is
    charged 2, each batch that caches full output blocks output_weight per block; the
    ledger note says how many were output blocks and what was charged, and the bucket
    (standard, burst 4, no refill to speak of) ends at 4 - (2 + weight x outputs)."""
    path = write(tmp_path, [{"t": 0.0, "id": "r", "blocks": ["a1", "a2"], "out": 17}])
    for weight in (0.25, 0.5, 1.0):
        log, policy = _step_replay(path, 16, {"contracts": SLOW, "output_weight": weight})
        notes = log.all["r"]
        assert notes[0]["charged"] == 2 and "output_blocks" not in notes[0]
        outputs = [n for n in notes[1:] if n.get("charged")]
        num_out = sum(n["charged"] for n in outputs)
        assert num_out >= 3                        # 17 tokens of KV fill 4 blocks of 4
        for n in outputs:
            if weight == 1.0:
                assert "charge" not in n and "output_blocks" not in n
            else:
                assert n["output_blocks"] == n["charged"]
                assert n["charge"] == pytest.approx(weight * n["charged"])
        g = policy.gids["g"]
        (i,) = policy.buckets.group_buckets[g]
        assert policy.buckets.B[i] == pytest.approx(4 - (2 + weight * num_out), abs=1e-6)


def test_output_weight_zero_charges_prompt_blocks_only_and_is_valid(tmp_path):
    path = write(tmp_path, [{"t": 0.0, "id": "r", "blocks": ["a1", "a2"], "out": 17}])
    log, policy = _step_replay(path, 16, {"contracts": SLOW, "output_weight": 0.0})
    (i,) = policy.buckets.group_buckets[policy.gids["g"]]
    assert policy.buckets.B[i] == pytest.approx(4 - 2, abs=1e-6)


def test_the_checker_buckets_take_the_weight_from_the_engine_count():
    """BucketAudit charges num_materialized - num_output + weight x num_output, whatever
    the policy claims: three admissions of 4 blocks, 3 of them generated, weight 0.25,
    leave a burst of 4 at 4 - 3 x 1.75."""
    from psgate.invariants.prefixshield import BucketAudit
    audit = BucketAudit({"standard": [1.0, 4.0]}, 1e-9, ("I1", "I2"), 0.25)
    for _ in range(3):
        audit.admitted("x", "g", "standard", 0.0, 4, {"charged": 4, "group": "g",
                                                      "contract": "standard"}, 3)
    assert audit.raw_debt("g", 0.0) == pytest.approx(3 * 1.75 - 4)
    assert audit.results()["I1"].holds
    full = BucketAudit({"standard": [1.0, 4.0]}, 1e-9, ("I1",))
    full.admitted("x", "g", "standard", 0.0, 4, {"charged": 4, "group": "g",
                                                 "contract": "standard"}, 3)
    assert full.raw_debt("g", 0.0) == 0.0 and full._bhat("g", "standard", 0.0) == 0.0


@pytest.mark.parametrize("v,needle", [
    (-0.5, "'output_weight' must be a number in [0, 1], found -0.5"),
    (1.5, "'output_weight' must be a number in [0, 1], found 1.5"),
    ("low", "parameter 'output_weight': expected a number, found 'low'"),
])
def test_bad_output_weight_is_an_input_error(v, needle):
    with pytest.raises(InputError) as exc:
        make_policy("prefixshield-b", {"output_weight": v})
    assert needle in str(exc.value)


def test_prefixshield_charges_every_block_alike(tmp_path):
    """The paper's policy keeps weight 1: its notes never carry a weighted charge."""
    from psgate.engines import engine_class
    from psgate.trace.reader import HashTable, TraceReader, TraceSource, validate_trace
    path = write(tmp_path, [{"t": 0.0, "id": "r", "blocks": ["a1", "a2"], "out": 17}])
    hashes = HashTable()
    header, summary = validate_trace(str(path), hashes)
    log = _Notes()
    engine = engine_class("sim", "step")(header=header, hashes=hashes, capacity=16,
                                         policy=make_policy("prefixshield", {"contracts": KC}),
                                         contracts=C, done_ids=summary.done_ids,
                                         recorder=log, groups=summary.groups)
    with TraceReader(TraceSource(str(path), path), hashes) as reader:
        engine.run(reader.events())
    notes = log.all["r"]
    assert sum(n.get("charged", 0) for n in notes) >= 5
    assert not any("charge" in n for n in notes)
