"""tinylfu: scenario tests with exact block ids and eviction order, the sketch, the duel.

Block size 4; ``cap`` configured blocks give cap-1 usable ones (6 here: window w = 1,
main 5, protected target 4).
"""

from __future__ import annotations

import pytest

from helpers import run_events
from psgate.errors import InputError
from psgate.policies import make_policy
from psgate.policies.tinylfu import CountMinSketch, mix64
from psgate.policy import PoolInfo
from test_arc import SCAN, hits_of


def test_tinylfu_keeps_the_reused_prefix_the_scan_loses_its_duels(tmp_path):
    result, log, engine = run_events(tmp_path, SCAN, 7, "tinylfu")
    # A's blocks enter the window; released, a2 overflows into probation and its hits
    # promote it to protected; a1 is hit in the window (estimate 3 after H2). Main has
    # room while S1..S4 run, so the window's overflow (a1, b1, b2, b3) enters probation
    # without a duel. From S5 on the cache is full: the window's LRU (the last scan
    # block) duels probation's LRU a1 (3 against 1) and loses, every time.
    assert log.block_ids == {"A": [1, 2, 3], "H1": [1, 2, 3], "H2": [1, 2, 3], "S1": [3],
                             "S2": [4], "S3": [5], "S4": [6], "S5": [6], "S6": [6],
                             "H3": [1, 2, 6]}
    assert log.evictions == ["g:b4", "g:b5", "g:b6"]
    assert all((d.victim, d.queue, d.position) == (6, "window", 0) for d in log.decisions)
    common = {"segment": "window", "freq": 1, "duel": True, "winner": "victim",
              "window": 1, "window_target": 1}
    assert [d.rank for d in log.decisions] == [
        {**common, "candidate_freq": 1, "victim_freq": 3, "probation": 4, "protected": 1},
        {**common, "candidate_freq": 1, "victim_freq": 3, "probation": 4, "protected": 1},
        # H3 hit a1 (to protected) first: the duel is then against b1, a tie, which
        # the candidate loses
        {**common, "candidate_freq": 1, "victim_freq": 1, "probation": 3, "protected": 2},
    ]
    assert hits_of(result, "H3") == 8
    pol = engine.policy
    assert pol.seg[1] == pol.seg[2] == 2        # the prefix is protected


def bound(c, **params):
    pol = make_policy("tinylfu", params or None)
    pol.bind(PoolInfo(num_blocks=c + 1, num_usable=c, block_size=4))
    return pol


def test_a_more_frequent_candidate_wins_the_duel_and_enters_probation():
    pol = bound(6)
    assert (pol.w, pol.main_cap, pol.r) == (1, 5, 4)
    for b in (1, 2, 3, 4, 5):
        pol.on_cached(b, None, 0, -1, 200 + b)
    pol.end_admit(None, 0)
    pol.on_free([1, 2, 3, 4, 5], 0)            # window overflow -> probation (room)
    assert pol.candidates() == [5, 1, 2, 3, 4] and pol.size == [1, 4, 0]
    pol.on_cached(6, None, 0, -1, 206)
    for _ in range(3):
        pol.on_hit(6, None, 0)                 # estimate 4
    pol.end_admit(None, 0)
    pol.on_free([6], 0)                        # 5 -> probation; main is now full
    assert pol.size == [1, 5, 0]
    pol.on_admit(None, 0)
    d = pol.select_victim(None, 0)
    assert (d.victim, d.queue) == (1, "probation")
    assert d.rank["duel"] and d.rank["winner"] == "candidate"
    assert (d.rank["candidate_freq"], d.rank["victim_freq"]) == (4, 1)
    pol.on_evict(1)
    assert pol.seg[6] == 1 and pol.candidates() == [2, 3, 4, 5, 6]
    d = pol.select_victim(None, 0)             # no window candidate: main's LRU, no duel
    assert (d.victim, d.rank["duel"]) == (2, False)


def test_a_hit_in_probation_promotes_and_protected_overflow_demotes():
    pol = bound(6, protected_ratio=0.2)        # protected target round(0.2 x 5) = 1
    for b in (1, 2, 3):
        pol.on_cached(b, None, 0, -1, b)
    pol.end_admit(None, 0)
    pol.on_free([1, 2, 3], 0)                  # 1 2 -> probation, 3 stays in the window
    for b in (1, 2):
        pol.on_touch(b)
        pol.on_hit(b, None, 0)                 # both promoted while pinned
    assert pol.size == [1, 0, 2]
    pol.on_free([2, 1], 0)                     # protected over its target: LRU 2 demoted
    assert pol.seg[2] == 1 and pol.seg[1] == 2 and pol.size == [1, 1, 1]


def test_sketch_counts_saturate_at_15_and_halve_after_w_samples():
    assert mix64(0) == 0xE220A8397B1DCDAF      # splitmix64's first output: no hash()
    s = CountMinSketch(16, 20)
    z = mix64(7)
    for _ in range(16):
        s.record(z)
    assert s.estimate(z) == 15 and s.samples == 16
    for _ in range(4):
        s.record(z)                            # the 20th sample resets
    assert s.estimate(z) == 7 and s.samples == 10 and s.resets == 1
    assert s.estimate(mix64(8)) <= 7


def test_sketch_dimensions_follow_caffeine():
    pol = bound(1000)
    assert pol.sketch.width == 4 * 1024 and len(pol.sketch.table) == 4 * 4 * 1024
    assert pol.sketch.sample_size == 10 * 1000 and pol.w == 10 and pol.r == 792


def test_parameters_are_validated():
    for params in ({"window_ratio": 0}, {"window_ratio": 1}, {"protected_ratio": 1.5},
                   {"sample_factor": 0}, {"sample_factor": 2.5}, {"nope": 1}):
        with pytest.raises(InputError):
            make_policy("tinylfu", params)
