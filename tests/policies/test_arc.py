"""arc: scenario tests with exact block ids and eviction order.

Block size 4; ``cap`` configured blocks give cap-1 usable ones. A request with
``tail: 1`` lets a later request hit every full block (the hit cap is
prompt_tokens - 1) and holds one more, uncached, block for its partial tail.
"""

from __future__ import annotations

import pytest

from helpers import run_events
from psgate.errors import InputError
from psgate.policies import make_policy
from psgate.policy import PoolInfo

# A computes the prefix a1 a2; H1 and H2 reuse it; S1..S6 scan six one-block prompts
# once each; H3 comes back for the prefix. 6 usable blocks.
SCAN = [
    {"t": 0, "id": "A", "blocks": ["a1", "a2"], "tail": 1, "done_t": 0.5},
    {"t": 1, "id": "H1", "blocks": ["a1", "a2"], "tail": 1, "done_t": 1.5},
    {"t": 2, "id": "H2", "blocks": ["a1", "a2"], "tail": 1, "done_t": 2.5},
] + [{"t": 3 + i, "id": f"S{i}", "blocks": [f"b{i}"], "done_t": 3.5 + i}
     for i in range(1, 7)] + [
    {"t": 10, "id": "H3", "blocks": ["a1", "a2"], "tail": 1, "done_t": 10.5},
]


def hits_of(result, rid):
    return next(o.cached_tokens for o in result.requests if o.id == rid)


def test_lru_loses_the_reused_prefix_to_a_one_pass_scan(tmp_path):
    result, log, _ = run_events(tmp_path, SCAN, 7, "lru")
    # the prefix was freed at 2.5, before every scan block: S5 and S6 take it (leaf
    # first), and H3 misses it and evicts three scan blocks for its own
    assert log.evictions == ["g:a2", "g:a1", "g:b1", "g:b2", "g:b3"]
    assert hits_of(result, "H3") == 0


def test_arc_keeps_the_reused_prefix_in_t2_and_evicts_the_scan_from_t1(tmp_path):
    result, log, engine = run_events(tmp_path, SCAN, 7, "arc")
    # a1 a2 were hit: T2. The scan fills T1 (4 blocks: 3 4 5 6); p = 0, so REPLACE
    # takes T1's least recently freed block each time and the prefix stays.
    assert log.block_ids == {"A": [1, 2, 3], "H1": [1, 2, 3], "H2": [1, 2, 3], "S1": [3],
                             "S2": [4], "S3": [5], "S4": [6], "S5": [3], "S6": [4],
                             "H3": [1, 2, 5]}
    assert log.evictions == ["g:b1", "g:b2", "g:b3"]
    assert [d.victim for d in log.decisions] == [3, 4, 5]
    assert all((d.queue, d.position) == ("T1", 0) for d in log.decisions)
    assert [d.rank for d in log.decisions] == [
        {"list": "T1", "p": 0.0, "t1": 4, "t2": 2, "b1": b1, "b2": 0, "replace": "T1",
         "fallback": False} for b1 in (0, 1, 2)]
    assert hits_of(result, "H3") == 8
    pol = engine.policy
    names = engine.hashes.names
    assert [names[k & 0xFFFFFFFF] for k in pol.b1] == ["b1", "b2", "b3"]   # LRU first
    assert pol.size == [3, 2] and pol.lst[1] == pol.lst[2] == 1


def test_ghost_hit_in_b1_grows_p_and_enters_t2(tmp_path):
    events = SCAN + [{"t": 11, "id": "R", "blocks": ["b1"], "done_t": 11.5}]
    _, log, engine = run_events(tmp_path, events, 7, "arc")
    # R recomputes b1, a ghost in B1, into the truly free block 5 (H3's tail): p =
    # min(6, 0 + max(|B2| / |B1|, 1)) = 1 and the block enters T2
    assert log.evictions == ["g:b1", "g:b2", "g:b3"] and log.block_ids["R"] == [5]
    pol = engine.policy
    assert pol.p == 1.0 and pol.lst[5] == 1 and pol.size == [3, 3]
    names = engine.hashes.names
    assert [names[k & 0xFFFFFFFF] for k in pol.b1] == ["b2", "b3"]


def bound(c):
    pol = make_policy("arc")
    pol.bind(PoolInfo(num_blocks=c + 1, num_usable=c, block_size=4))
    return pol


def test_p_adapts_on_both_ghost_lists_and_replace_follows_it():
    pol = bound(4)
    for b in (1, 2, 3, 4):
        pol.on_cached(b, None, 0, -1, 100 + b)
    pol.on_free([1, 2, 3, 4], 0)
    pol.on_touch(1)
    pol.on_hit(1, None, 0)                  # T1 -> T2
    pol.on_free([1], 0)
    assert pol.size == [3, 1] and pol.candidates() == [2, 3, 4, 1]
    d = pol.select_victim(None, 0)
    assert (d.victim, d.queue) == (2, "T1")
    pol.on_evict(2)
    assert list(pol.b1) == [102]
    pol.on_cached(2, None, 0, -1, 102)      # B1 ghost hit: p 0 -> 1, into T2
    pol.on_free([2], 0)
    assert pol.p == 1.0 and pol.lst[2] == 1 and not pol.b1
    d = pol.select_victim(None, 0)          # |T1| = 2 > p = 1: T1
    assert (d.victim, d.rank["list"]) == (3, "T1")
    pol.on_evict(3)
    d = pol.select_victim(None, 0)          # |T1| = 1 = p: T2's LRU
    assert (d.victim, d.rank["replace"], d.rank["t1"]) == (1, "T2", 1)
    pol.on_evict(1)
    assert list(pol.b1) == [103] and list(pol.b2) == [101]
    pol.on_cached(1, None, 0, -1, 101)      # B2 ghost hit: p 1 -> max(0, 1 - 1) = 0
    assert pol.p == 0.0 and pol.lst[1] == 1 and not pol.b2


def test_pinned_blocks_count_in_t1_but_are_skipped():
    pol = bound(4)
    pol.on_cached(1, None, 0, -1, 11)
    pol.on_cached(2, None, 0, -1, 12)
    pol.on_free([1, 2], 0)
    pol.on_touch(2)
    pol.on_hit(2, None, 0)
    pol.on_free([2], 0)                     # T2: 2
    pol.on_cached(3, None, 0, -1, 13)       # T1: 1 (candidate), 3 (pinned: in use)
    assert pol.size == [2, 1] and pol.num_candidates == 2
    d = pol.select_victim(None, 0)
    assert (d.victim, d.rank["fallback"]) == (1, False)
    pol.on_evict(1)
    # |T1| = 1 > p = 0 picks T1, whose only block is pinned: T2's LRU goes instead
    d = pol.select_victim(None, 0)
    assert (d.victim, d.queue, d.rank["replace"], d.rank["fallback"]) == (2, "T2", "T1", True)
    assert d.rank["t1"] == 1


def test_ghost_directory_is_bounded_by_c():
    pol = bound(2)
    pol.on_cached(1, None, 0, -1, 1)
    pol.on_cached(2, None, 0, -1, 2)
    pol.on_free([1, 2], 0)
    pol.on_evict(pol.select_victim(None, 0).victim)     # 1 -> B1
    assert list(pol.b1) == [1]
    pol.on_cached(1, None, 0, -1, 3)                    # |T1| + |B1| = 3 > c = 2
    assert not pol.b1 and pol.size == [2, 0]


def test_select_does_not_mutate(tmp_path):
    _, _, engine = run_events(tmp_path, SCAN[:5], 7, "arc")
    pol = engine.policy
    before = (pol.candidates(), list(pol.size), pol.p, list(pol.b1), list(pol.b2))
    d1, d2 = pol.select_victim(None, 0), pol.select_victim(None, 0)
    assert (d1.victim, d1.rank) == (d2.victim, d2.rank)
    assert (pol.candidates(), list(pol.size), pol.p, list(pol.b1), list(pol.b2)) == before


def test_unknown_parameter_is_refused():
    with pytest.raises(InputError):
        make_policy("arc", {"p": 1})
