"""The contract every registered policy keeps, checked on random traces.

Never evicts a pinned block (and every other hard invariant holds under the
paranoid checker), deterministic, explains every decision, and - where the
policy claims it - work-conserving.
"""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from psgate.policies import policy_class, policy_names

from helpers import replay_file, write_lines
from test_differential import traces

POLICIES = [n for n in policy_names() if not n.startswith("test-")]
SETTINGS = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow,
                                           HealthCheck.function_scoped_fixture])


def test_registry_has_the_design_policies():
    for name in ("lru", "prefixshield", "prefixshield-noseg", "prefixshield-nogate",
                 "static-quota", "belady"):
        assert name in POLICIES


@pytest.mark.parametrize("policy", POLICIES)
@SETTINGS
@given(lines=traces(), capacity=st.integers(4, 16))
def test_contract(tmp_path, policy, lines, capacity):
    p = write_lines(tmp_path, lines)
    r1, log1, eng = replay_file(p, capacity, policy=policy, paranoid=True)
    assert r1.aborted is None
    bad = {n: v.first_violation for n, v in r1.invariants.items() if not v.holds}
    assert not bad, bad
    # deterministic: the same replay again gives the same decisions and outcomes
    r2, log2, _ = replay_file(p, capacity, policy=policy)
    assert log1.evictions == log2.evictions and log1.block_ids == log2.block_ids
    assert [(o.id, o.cached_tokens, o.state) for o in r1.requests] == \
        [(o.id, o.cached_tokens, o.state) for o in r2.requests]
    # explains every decision
    for d in log1.decisions:
        assert d.num_candidates >= 1 and d.position >= 0 and d.queue
        assert d.rank and json.dumps(d.rank)
        assert all(v is None or not isinstance(v, float) or math.isfinite(v)
                   for v in d.rank.values())


@pytest.mark.parametrize("policy", [p for p in POLICIES if policy_class(p).work_conserving])
@SETTINGS
@given(lines=traces(), capacity=st.integers(4, 16))
def test_work_conserving_policies_never_hold_back(tmp_path, policy, lines, capacity):
    """Such a policy never refuses an admission nor forces evictions over free blocks,
    so its waits are exactly the engine's capacity waits."""
    import psgate.policies.base as base
    calls = {"allowed": 0, "refused": 0, "forced": 0}
    cls = policy_class(policy)
    orig_allowed, orig_reclaim = cls.admission_allowed, cls.reclaim_first

    def allowed(self, *a):
        ok = orig_allowed(self, *a)
        calls["allowed" if ok else "refused"] += 1
        return ok

    def reclaim(self, *a):
        n = orig_reclaim(self, *a)
        calls["forced"] += n
        return n

    cls.admission_allowed, cls.reclaim_first = allowed, reclaim
    try:
        replay_file(write_lines(tmp_path, lines), capacity, policy=policy)
    finally:
        cls.admission_allowed, cls.reclaim_first = orig_allowed, orig_reclaim
    assert calls["refused"] == 0 and calls["forced"] == 0
    assert base.EvictionPolicy.admission_allowed is not allowed
