"""isolated-lru: scenario tests with exact block ids and eviction order.

Block size 4; 6 usable blocks. Scope x reuses the prefix a1 a2; scope y floods one-block
prompts b1..b6; x comes back. With two scopes seen, each has a quota of 3 blocks.
"""

from __future__ import annotations

import pytest

from helpers import run_events
from psgate.errors import InputError
from psgate.policies import make_policy

FLOOD = [
    {"t": 0, "id": "A", "scope": "x", "blocks": ["a1", "a2"], "tail": 1, "done_t": 0.5},
    {"t": 1, "id": "H1", "scope": "x", "blocks": ["a1", "a2"], "tail": 1, "done_t": 1.5},
] + [{"t": 2 + i, "id": f"Y{i}", "scope": "y", "blocks": [f"b{i}"], "done_t": 2.5 + i}
     for i in range(1, 7)] + [
    {"t": 10, "id": "H2", "scope": "x", "blocks": ["a1", "a2"], "tail": 1, "done_t": 10.5},
]


def hits_of(result, rid):
    return next(o.cached_tokens for o in result.requests if o.id == rid)


def test_lru_lets_the_flood_evict_the_other_scopes_prefix(tmp_path):
    result, log, _ = run_events(tmp_path, FLOOD, 7, "lru")
    assert log.evictions == ["g:a2", "g:a1", "g:b1", "g:b2", "g:b3"]
    assert hits_of(result, "H2") == 0


def test_the_quota_protects_a_scope_from_another_scopes_flood(tmp_path):
    result, log, engine = run_events(tmp_path, FLOOD, 7, "isolated-lru")
    # y caches b1..b4 into free blocks (4 > its quota 3); Y5 and Y6 are at their quota:
    # each evicts y's own LRU block. H2 (x: 2 blocks, within its 3) needs one block for
    # its tail: y is over its quota, so y's LRU block goes, not lru's choice.
    assert log.block_ids == {"A": [1, 2, 3], "H1": [1, 2, 3], "Y1": [3], "Y2": [4],
                             "Y3": [5], "Y4": [6], "Y5": [3], "Y6": [4], "H2": [1, 2, 5]}
    assert log.evictions == ["g:b1", "g:b2", "g:b3"]
    assert [(d.victim, d.queue, d.position) for d in log.decisions] == [
        (3, "own", 0), (4, "own", 0), (5, "over", 0)]
    assert [d.rank for d in log.decisions] == [
        {"rule": "own", "scope": "y", "used": 4, "quota": 3, "req_scope": "y",
         "req_used": 4, "req_quota": 3, "freed_t": 3.5},
        {"rule": "own", "scope": "y", "used": 4, "quota": 3, "req_scope": "y",
         "req_used": 4, "req_quota": 3, "freed_t": 4.5},
        {"rule": "over", "scope": "y", "used": 4, "quota": 3, "req_scope": "x",
         "req_used": 2, "req_quota": 3, "freed_t": 5.5},
    ]
    assert hits_of(result, "H2") == 8
    pol = engine.policy
    assert pol.names == ["x", "y"] and pol.used == [2, 3] and pol.quota == [3, 3]


def test_within_quota_everyone_falls_back_to_global_lru(tmp_path):
    # one scope: its quota is the whole pool, so every eviction is lru's
    events = [dict(e, scope="x") for e in FLOOD]
    _, log, _ = run_events(tmp_path, events, 7, "isolated-lru")
    _, lru_log, _ = run_events(tmp_path, events, 7, "lru")
    assert log.victims == lru_log.victims
    assert log.evictions == ["g:a2", "g:a1", "g:b1", "g:b2", "g:b3"]
    # the pool full of x's blocks is x at its quota (own), then H2's misses leave room
    assert [d.queue for d in log.decisions] == ["own", "own", "own", "global", "global"]


def test_quotas_are_an_allowlist(tmp_path):
    # x may hold half the pool; y is not named, so its quota is 0 and its own blocks go
    # first even before it reaches x's size
    _, log, engine = run_events(tmp_path, FLOOD, 7, "isolated-lru", quotas={"x": 0.5})
    assert engine.policy.quota == [3, 0]
    assert log.evictions == ["g:b1", "g:b2", "g:b3"]
    assert [d.queue for d in log.decisions] == ["own", "own", "over"]
    # a large enough quota for y lets its flood evict x's prefix by global LRU
    _, log, _ = run_events(tmp_path, FLOOD, 7, "isolated-lru", quotas={"x": 0.5, "y": 1})
    assert log.evictions[:2] == ["g:a2", "g:a1"]
    assert [d.queue for d in log.decisions][:2] == ["global", "global"]


def test_over_takes_the_oldest_head_among_scopes_over_their_quota(tmp_path):
    # quotas x 1/6 (1 block), y 1/6, z 1: x caches x1 x2 (freed first), y y1 y2, then z
    # needs blocks while within its quota: x's and y's heads are compared by release
    events = [
        {"t": 0, "id": "X", "scope": "x", "blocks": ["c1", "c2"], "done_t": 0.5},
        {"t": 1, "id": "Y", "scope": "y", "blocks": ["d1", "d2"], "done_t": 1.5},
        {"t": 2, "id": "Z", "scope": "z", "blocks": ["e1", "e2", "e3", "e4"],
         "done_t": 2.5},
    ]
    _, log, _ = run_events(tmp_path, events, 7, "isolated-lru",
                           quotas={"x": 1 / 6, "y": 1 / 6, "z": 1})
    # Z takes the free blocks 5 6 and evicts two. X's blocks were freed first (last
    # block first), so x's head c2 is older than y's d2 and goes; x is then at its
    # quota (1 block), not over, and y's head d2 goes
    assert log.evictions == ["g:c2", "g:d2"] and log.block_ids["Z"] == [5, 6, 2, 4]
    assert [(d.queue, d.rank["scope"], d.rank["used"], d.rank["quota"])
            for d in log.decisions] == [("over", "x", 2, 1), ("over", "y", 2, 1)]


def test_quotas_are_validated():
    for quotas in ({"x": 0}, {"x": 1.5}, {"x": -0.1}, {"x": float("nan")}, {"x": "0.5"},
                   {"x": True}, [0.5], {1: 0.5}):
        with pytest.raises(InputError):
            make_policy("isolated-lru", {"quotas": quotas})
    make_policy("isolated-lru", {"quotas": {"x": 1, "y": 0.25}})
