"""The field's classic policies: fifo, mru, lfu, slru and tlru. Scenario tests with exact
block ids and eviction order, each beside what lru does on the same trace, and property
tests (leaves only, no orphans; the cases where a policy must evict as lru does).

Block size 4; ``cap`` configured blocks give cap-1 usable ones, handed out lowest id
first. A request with ``tail: 0, out: 0`` holds exactly its full prompt blocks; ``tail:
1`` lets a later request hit every full block (the hit cap is prompt_tokens - 1) and
takes one more, uncached, block while it runs.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import random_traces, replay_checked, replay_file, run_events, write_lines
from psgate.errors import InputError
from psgate.policies import make_policy
from psgate.policy.base import PoolInfo

FIELD = ("fifo", "mru", "lfu", "slru", "tlru")


def run(tmp_path, events, cap, policy, **params):
    return run_events(tmp_path, events, cap, policy, **params)


def lru_evictions(tmp_path, events, cap):
    return run(tmp_path, events, cap, "lru")[1].evictions


# -- fifo -------------------------------------------------------------------------------
def test_fifo_first_cached_first_out_whatever_the_hits(tmp_path):
    events = [
        {"t": 0, "id": "A", "blocks": ["a1"], "done_t": 0.1},
        {"t": 1, "id": "B", "blocks": ["b1"], "done_t": 1.1},
        {"t": 2, "id": "H", "blocks": ["a1"], "tail": 1, "done_t": 2.1},    # hits a1
        {"t": 3, "id": "C", "blocks": ["c1", "c2", "c3"], "done_t": 3.1},
    ]
    _, log, _ = run(tmp_path, events, 4, "fifo")
    assert log.block_ids == {"A": [1], "B": [2], "H": [1, 3], "C": [3, 1, 2]}
    assert log.evictions == ["g:a1", "g:b1"]            # a1 was cached first: its hit
    assert [d.rank for d in log.decisions] == [          # does not move it
        {"cached_seq": 1, "leaf": True}, {"cached_seq": 2, "leaf": True}]
    assert all((d.queue, d.position) == ("leaf", 0) for d in log.decisions)
    assert lru_evictions(tmp_path, events, 4) == ["g:b1", "g:a1"]


def test_fifo_a_chains_leaf_goes_before_its_older_parent(tmp_path):
    # B computes b2 on top of A's a1: FIFO order a1 b2 c1, but a1 is not a leaf while
    # b2 is resident. b2 goes first, then a1 (a leaf now, at its own old place), then c1.
    events = [
        {"t": 0, "id": "A", "blocks": ["a1"], "done_t": 0.1},
        {"t": 1, "id": "B", "blocks": ["a1", "b2"], "done_t": 1.1},
        {"t": 2, "id": "C", "blocks": ["c1"], "done_t": 2.1},
        {"t": 3, "id": "D", "blocks": ["d1", "d2", "d3"], "done_t": 3.1},
    ]
    result, log, _ = run(tmp_path, events, 4, "fifo")
    assert log.block_ids == {"A": [1], "B": [1, 2], "C": [3], "D": [2, 1, 3]}
    assert log.evictions == ["g:b2", "g:a1", "g:c1"]
    assert [d.rank["cached_seq"] for d in log.decisions] == [2, 1, 3]
    assert [d.segments for d in log.decisions] == [
        {"leaf": 2, "nonleaf": 1}, {"leaf": 2, "nonleaf": 0}, {"leaf": 1, "nonleaf": 0}]
    assert result.orphans["orphans_created"] == 0


def test_fifo_within_one_request_the_leaf_goes_first(tmp_path):
    events = [
        {"t": 0, "id": "A", "blocks": ["a1", "a2"], "done_t": 0.1},
        {"t": 1, "id": "B", "blocks": ["b1"], "done_t": 1.1},
        {"t": 2, "id": "C", "blocks": ["c1", "c2", "c3"], "done_t": 2.1},
    ]
    _, log, _ = run(tmp_path, events, 5, "fifo")
    assert log.block_ids["C"] == [4, 2, 1]
    assert log.evictions == ["g:a2", "g:a1"]             # cached second, but the leaf
    assert [d.rank["cached_seq"] for d in log.decisions] == [2, 1]


# -- mru --------------------------------------------------------------------------------
MRU_EVENTS = [
    {"t": 0, "id": "A", "blocks": ["a1", "a2"], "done_t": 0.1},     # frees a2, a1
    {"t": 1, "id": "B", "blocks": ["b1"], "done_t": 1.1},
    {"t": 2, "id": "C", "blocks": ["c1"], "done_t": 2.1},
    {"t": 3, "id": "D", "blocks": ["d1", "d2", "d3"], "done_t": 3.1},
]


def test_mru_most_recently_freed_leaf_first(tmp_path):
    # freed order a2 (1), a1 (2), b1 (3), c1 (4). mru takes c1, b1, then a2: a1 was freed
    # after a2 but is its parent (a plain MRU would take a1 and orphan a2).
    result, log, _ = run(tmp_path, MRU_EVENTS, 5, "mru")
    assert log.block_ids == {"A": [1, 2], "B": [3], "C": [4], "D": [4, 3, 2]}
    assert log.evictions == ["g:c1", "g:b1", "g:a2"]
    assert [d.rank for d in log.decisions] == [{"freed_seq": s, "leaf": True}
                                               for s in (4, 3, 1)]
    assert result.orphans["orphans_created"] == 0
    assert lru_evictions(tmp_path, MRU_EVENTS, 5) == ["g:a2", "g:a1", "g:b1"]


def test_mru_takes_a_parent_next_once_its_leaf_is_gone(tmp_path):
    events = MRU_EVENTS[:2] + [{"t": 2, "id": "D", "blocks": ["d1", "d2"], "done_t": 2.1}]
    _, log, _ = run(tmp_path, events, 4, "mru")
    assert log.evictions == ["g:b1", "g:a2"]
    events = MRU_EVENTS[:1] + [{"t": 2, "id": "D", "blocks": ["d1", "d2", "d3"],
                                "done_t": 2.1}]
    _, log, _ = run(tmp_path, events, 4, "mru")
    assert log.evictions == ["g:a2", "g:a1"]              # a1 a leaf now, freed last


# -- lfu --------------------------------------------------------------------------------
# a1 is hit twice, b1 once, c1 never; H1's extra block (4) is free again after it.
LFU_EVENTS = [
    {"t": 0, "id": "A", "blocks": ["a1"], "done_t": 0.1},
    {"t": 1, "id": "B", "blocks": ["b1"], "done_t": 1.1},
    {"t": 2, "id": "C", "blocks": ["c1"], "done_t": 2.1},
    {"t": 3, "id": "H1", "blocks": ["a1"], "tail": 1, "done_t": 3.1},
    {"t": 3.5, "id": "H2", "blocks": ["a1"], "tail": 1, "done_t": 3.6},
    {"t": 4, "id": "H3", "blocks": ["b1"], "tail": 1, "done_t": 4.1},
    {"t": 5, "id": "D", "blocks": ["d1", "d2"], "done_t": 5.1},
    {"t": 6, "id": "E", "blocks": ["e1", "e2", "e3"], "done_t": 6.1},
]


def test_lfu_least_frequent_first_ties_least_recent(tmp_path):
    _, log, _ = run(tmp_path, LFU_EVENTS, 5, "lfu")
    assert log.block_ids["D"] == [4, 3] and log.block_ids["E"] == [3, 4, 2]
    # D: c1 (0 hits). E: d2, d1 (0 hits; D freed d2 first), then b1 (1 hit); a1 (2) stays
    assert log.evictions == ["g:c1", "g:d2", "g:d1", "g:b1"]
    assert [(d.rank["freq"], d.rank["freed_seq"]) for d in log.decisions] == [
        (0, 3), (0, 7), (0, 8), (1, 6)]
    assert all(d.rank["leaf"] and d.rank["agings"] == 0 for d in log.decisions)
    assert lru_evictions(tmp_path, LFU_EVENTS, 5) == ["g:c1", "g:a1", "g:b1", "g:d2"]


def bare(policy, n=5, **params):
    pol = make_policy(policy, params or None)
    pol.bind(PoolInfo(num_blocks=n, num_usable=n - 1, block_size=4))
    return pol


def drain(pol):
    out = []
    while pol.num_candidates:
        d = pol.select_victim(None, 0)
        out.append((d.victim, d.rank))
        pol.on_evict(d.victim)
    return out


@pytest.mark.parametrize("aging_factor, order, agings", [
    (0, [2, 1], 0),     # never aged: block 1 (2 hits) outlives block 2 (1 hit)
    (1, [1, 2], 1),     # W = 4 accesses: the 4th (block 1's 2nd hit) halves 2 -> 1, then
])                      # block 2's hit makes it 1 too: a tie, and block 1 was freed first
def test_lfu_counts_halve_every_aging_period(aging_factor, order, agings):
    pol = bare("lfu", aging_factor=aging_factor)
    pol.on_cached(1, None, 0, -1)
    pol.on_cached(2, None, 0, -1)
    pol.on_hit(1, None, 0)
    pol.on_hit(1, None, 0)
    pol.on_hit(2, None, 0)
    pol.on_free([1, 2], 0)
    out = drain(pol)
    assert [b for b, _ in out] == order
    assert all(r["agings"] == agings for _, r in out)
    assert [r["freq"] for _, r in out] == ([1, 2] if aging_factor == 0 else [1, 1])


def test_lfu_aging_rekeys_candidates():
    pol = bare("lfu", aging_factor=1)           # W = 4
    for b in (1, 2, 3):
        pol.on_cached(b, None, 0, -1)
    pol.on_hit(1, None, 0)                      # 4th access: halving (1 -> 0)
    pol.on_hit(1, None, 0)
    pol.on_hit(1, None, 0)                      # block 1: 2
    pol.on_free([1, 2], 0)
    for _ in range(2):                          # accesses 3, 4: halving while 1 and 2
        pol.on_hit(3, None, 0)                  # are candidates: block 1 2 -> 1
    assert pol.agings == 2 and pol.freq[1] == 1
    pol.on_free([3], 0)                         # block 3: 2 hits, halved to 1, then 1 more
    assert [(b, r["freq"]) for b, r in drain(pol)] == [(2, 0), (1, 1), (3, 1)]


# -- slru -------------------------------------------------------------------------------
def test_slru_a_hit_protects_a_block_that_lru_evicts(tmp_path):
    events = [
        {"t": 0, "id": "A", "blocks": ["a1"], "done_t": 0.1},
        {"t": 1, "id": "B", "blocks": ["b1"], "done_t": 1.1},
        {"t": 2, "id": "C", "blocks": ["c1"], "done_t": 2.1},
        {"t": 3, "id": "H", "blocks": ["a1"], "tail": 1, "done_t": 3.1},   # a1 -> protected
        {"t": 4, "id": "D", "blocks": ["d1", "d2"], "done_t": 4.1},
        {"t": 5, "id": "E", "blocks": ["e1", "e2"], "done_t": 5.1},
    ]
    _, log, engine = run(tmp_path, events, 5, "slru", protected_ratio=0.5)
    assert log.block_ids["D"] == [4, 2] and log.block_ids["E"] == [3, 2]
    assert log.evictions == ["g:b1", "g:c1", "g:d2"]
    assert [d.queue for d in log.decisions] == ["probationary"] * 3
    assert log.decisions[0].rank == {"protected": False, "recency_seq": 4, "leaf": True,
                                     "protected_size": 1, "protected_cap": 2}
    assert engine.policy.seg.items(1) == [1]                   # a1 is still protected
    assert lru_evictions(tmp_path, events, 5) == ["g:b1", "g:c1", "g:a1"]


# a1 and b1 are hit (promoted) in turn; e1 enters probation after both hits.
DEMOTE = [
    {"t": 0, "id": "A", "blocks": ["a1"], "done_t": 0.1},
    {"t": 1, "id": "B", "blocks": ["b1"], "done_t": 1.1},
    {"t": 2, "id": "C", "blocks": ["c1"], "done_t": 2.1},
    {"t": 3, "id": "H1", "blocks": ["a1"], "tail": 1, "done_t": 3.1},
    {"t": 4, "id": "H2", "blocks": ["b1"], "tail": 1, "done_t": 4.1},
    {"t": 4.5, "id": "E", "blocks": ["e1"], "done_t": 4.6},
    {"t": 5, "id": "D", "blocks": ["d1", "d2", "d3"], "done_t": 5.1},
]


@pytest.mark.parametrize("ratio, evictions, cap", [
    # cap round(0.25 x 5) = 1: b1's promotion demotes a1 to probation's MRU end (its
    # recency then, t=4), so a1 goes right after c1 and before the younger e1
    (0.25, ["g:c1", "g:a1"], 1),
    # cap 2: no demotion, probation holds c1 and e1 only
    (0.5, ["g:c1", "g:e1"], 2),
])
def test_slru_protected_overflow_demotes_to_probation(tmp_path, ratio, evictions, cap):
    _, log, engine = run(tmp_path, DEMOTE, 6, "slru", protected_ratio=ratio)
    assert log.evictions == evictions
    assert all(d.queue == "probationary" and d.rank["protected_cap"] == cap
               for d in log.decisions)
    assert lru_evictions(tmp_path, DEMOTE, 6) == ["g:c1", "g:a1"]


def test_slru_with_no_protected_share_is_lru(tmp_path):
    _, log, _ = run(tmp_path, LFU_EVENTS, 5, "slru", protected_ratio=0)
    assert log.evictions == lru_evictions(tmp_path, LFU_EVENTS, 5)


# -- tlru -------------------------------------------------------------------------------
def tlru_events(t_c, hit=False):
    # A holds a1 from t=0 to 5 (last use 0); B uses b1 at t=1 (freed first: lru's
    # victim). 3 usable blocks: C takes the free block 3, then evicts one.
    ev = [
        {"t": 0, "id": "A", "blocks": ["a1"], "done_t": 5},
        {"t": 1, "id": "B", "blocks": ["b1"], "done_t": 1.1},
        {"t": t_c, "id": "C", "blocks": ["c1", "c2"], "done_t": t_c + 0.1},
    ]
    if hit:     # a reuse of a1 at t=2 refreshes its TTL (its extra block 3 is freed)
        ev.insert(2, {"t": 2, "id": "H", "blocks": ["a1"], "tail": 1, "done_t": 2.1})
    return ev


@pytest.mark.parametrize("t_c, hit, victim, queue, idle_s", [
    (10.5, False, "g:a1", "expired", 10.5),   # a1 expired at 10, b1 only at 11
    (9.5, False, "g:b1", "live", 8.5),        # nothing expired: lru's order
    (11.5, False, "g:b1", "expired", 10.5),   # both expired: lru's order among them
    (10.5, True, "g:b1", "live", 9.5),        # H reused a1 at t=2: alive until 12
])
def test_tlru_expired_before_unexpired_lru_within_each(tmp_path, t_c, hit, victim, queue,
                                                       idle_s):
    events = tlru_events(t_c, hit)
    _, log, _ = run(tmp_path, events, 4, "tlru", ttl_s=10)
    assert log.evictions == [victim]
    d = log.decisions[0]
    assert d.queue == queue and d.rank["expired"] == (queue == "expired")
    assert d.rank["idle_s"] == pytest.approx(idle_s) and d.rank["ttl_s"] == 10.0
    assert d.rank["leaf"] is True


def test_tlru_ttl_evicts_what_lru_keeps(tmp_path):
    events = tlru_events(10.5)
    _, log, _ = run(tmp_path, events, 4, "tlru", ttl_s=10)
    assert log.block_ids == {"A": [1], "B": [2], "C": [3, 1]}
    assert log.evictions == ["g:a1"] and log.victims == [1]
    assert log.decisions[0].rank == {"expired": True, "idle_s": 10.5, "ttl_s": 10.0,
                                     "freed_seq": 2, "leaf": True}
    _, lru_log, _ = run(tmp_path, events, 4, "lru")
    assert lru_log.evictions == ["g:b1"] and lru_log.victims == [2]   # lru keeps a1
    # with the default TTL (300 s) nothing has expired: tlru decides as lru
    _, log, _ = run(tmp_path, events, 4, "tlru")
    assert log.evictions == ["g:b1"] and log.decisions[0].queue == "live"


def test_tlru_expiry_while_a_candidate_moves_it_ahead(tmp_path):
    # b1 (used at t=1) and c1 (t=2) are candidates when a1's TTL (used t=0) runs out;
    # D at t=3.5 finds a1 expired and takes it, although a1 was freed last (t=3)
    events = [
        {"t": 0, "id": "A", "blocks": ["a1"], "done_t": 3},
        {"t": 1, "id": "B", "blocks": ["b1"], "done_t": 1.1},
        {"t": 2, "id": "C", "blocks": ["c1"], "done_t": 2.1},
        {"t": 3.5, "id": "D", "blocks": ["d1", "d2"], "done_t": 3.6},
    ]
    _, log, _ = run(tmp_path, events, 4, "tlru", ttl_s=3.2)
    assert log.evictions == ["g:a1", "g:b1"]
    assert [d.queue for d in log.decisions] == ["expired", "live"]
    assert lru_evictions(tmp_path, events, 4) == ["g:b1", "g:c1"]


# -- every one of them --------------------------------------------------------------------
@pytest.mark.parametrize("policy, params, message", [
    ("lfu", {"aging_factor": -1}, "aging_factor"),
    ("slru", {"protected_ratio": 1}, "protected_ratio"),
    ("slru", {"protected_ratio": -0.1}, "protected_ratio"),
    ("tlru", {"ttl_s": 0}, "ttl_s"),
])
def test_parameters_are_checked(policy, params, message):
    with pytest.raises(InputError, match=message):
        make_policy(policy, params)


def test_registered_with_summaries_and_defaults():
    from psgate.policies import policy_class
    expected = {"fifo": {}, "mru": {}, "lfu": {"aging_factor": 10},
                "slru": {"protected_ratio": 0.8}, "tlru": {"ttl_s": 300.0}}
    for name, defaults in expected.items():
        cls = policy_class(name)
        assert cls.name == name and cls.api_version == 1 and cls.summary
        assert cls.defaults == defaults


CHAINS = [["a1", "a2", "a3", "a4"], ["a1", "a2", "b3"], ["a1", "c2"], ["d1", "d2"]]
VARIANTS = [("fifo", None), ("mru", None), ("lfu", None), ("lfu", {"aging_factor": 0.5}),
            ("slru", None), ("slru", {"protected_ratio": 0}), ("tlru", None),
            ("tlru", {"ttl_s": 0.02})]
PROPERTY = settings(max_examples=40, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow,
                                           HealthCheck.function_scoped_fixture])


@pytest.mark.parametrize("policy, params", VARIANTS, ids=lambda v: str(v))
@PROPERTY
@given(lines=random_traces(CHAINS), capacity=st.integers(2, 14))
def test_leaves_only_never_orphans(tmp_path, policy, params, lines, capacity):
    p = write_lines(tmp_path, lines)
    result, log, _ = replay_checked(p, capacity, policy, params)
    assert result.orphans["orphans_created"] == 0
    assert all(d.rank["leaf"] and not d.rank.get("ancestry_fallback")
               for d in log.decisions)


@pytest.mark.parametrize("policy, params", [("slru", {"protected_ratio": 0}),
                                            ("tlru", {"ttl_s": 10 ** 6})],
                         ids=["slru-0", "tlru-no-expiry"])
@PROPERTY
@given(lines=random_traces(CHAINS), capacity=st.integers(2, 14))
def test_degenerate_settings_evict_as_lru(tmp_path, policy, params, lines, capacity):
    p = write_lines(tmp_path, lines)
    _, log, _ = replay_file(p, capacity, policy=policy, params=params)
    _, lru_log, _ = replay_file(p, capacity, policy="lru")
    assert log.victims == lru_log.victims


# -- tlru and retention_s (SGLang's soft retention time) ----------------------------------
def test_tlru_retention_s_is_the_requests_ttl(tmp_path):
    events = tlru_events(10.5)
    events[0]["retention_s"] = 20           # a1 kept 20 s from its use: alive at 10.5
    _, log, _ = run(tmp_path, events, 4, "tlru", ttl_s=10)
    assert log.evictions == ["g:b1"]        # without it: a1 (expired), see above
    assert log.decisions[0].queue == "live" and log.decisions[0].rank["ttl_s"] == 10.0
    events = tlru_events(10.5)
    events[1]["retention_s"] = 2            # b1 expires at 3 -> goes ahead of a1 anyway
    events[0]["retention_s"] = 20
    _, log, _ = run(tmp_path, events, 4, "tlru", ttl_s=10)
    assert log.evictions == ["g:b1"] and log.decisions[0].queue == "expired"


def test_tlru_a_shorter_retention_never_cuts_an_earlier_one(tmp_path):
    events = tlru_events(10.5, hit=True)
    events[0]["retention_s"] = 20           # A: keep a1 until 20
    events[2]["retention_s"] = 1            # H reuses a1 at 2 asking for 1 s: still 20
    _, log, _ = run(tmp_path, events, 4, "tlru", ttl_s=10)
    assert log.evictions == ["g:b1"]
    events[0].pop("retention_s")            # A: 10 s (until 10); H: 1 s -> max(10, 3)
    _, log, _ = run(tmp_path, events, 4, "tlru", ttl_s=10)
    assert log.evictions == ["g:a1"] and log.decisions[0].queue == "expired"


def test_policies_say_which_hints_they_honour():
    from psgate.policies import describe
    assert describe("priority-lru")["hints"] == ["priority", "priority_until", "retention"]
    assert describe("tlru")["hints"] == ["retention_s"]
    assert describe("lru")["hints"] == []
