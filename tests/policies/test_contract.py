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

from psgate.engines.base import NullRecorder
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


@pytest.mark.parametrize("policy", [p for p in POLICIES if policy_class(p).batches_evictions()])
@SETTINGS
@given(lines=traces(), capacity=st.integers(4, 16))
def test_evict_batch_decides_as_select_then_evict(tmp_path, policy, lines, capacity):
    """A policy's evict_batch fast path is select_victim + on_evict, num_blocks times:
    the same victims and the same decision fields, and without a recorder (when it
    builds no decisions) the same outcomes."""
    p = write_lines(tmp_path, lines)
    batched, log1, eng = replay_file(p, capacity, policy=policy, paranoid=True)
    assert eng.batch_evictions

    def one_by_one(engine, log):
        engine.batch_evictions = False

    single, log2, _ = replay_file(p, capacity, policy=policy, paranoid=True, setup=one_by_one)
    assert log1.victims == log2.victims and log1.evictions == log2.evictions
    assert log1.decisions == log2.decisions
    assert all(v.holds for v in batched.invariants.values())

    def silent(engine, log):
        engine.recorder, engine.records = NullRecorder(), False

    quiet, _, _ = replay_file(p, capacity, policy=policy, setup=silent)
    assert [(o.id, o.state, o.cached_tokens, o.release_ns) for o in quiet.requests] == \
        [(o.id, o.state, o.cached_tokens, o.release_ns) for o in single.requests]
    assert quiet.evictions == single.evictions == len(log2.victims)


def test_a_subclass_that_changes_selection_is_not_batched():
    """Overriding select_victim under a parent's evict_batch would be bypassed by it."""
    from psgate.policies.lru import LRUPolicy

    class Picky(LRUPolicy):
        def select_victim(self, req, now_ns):
            return super().select_victim(req, now_ns)

    assert LRUPolicy.batches_evictions() and not Picky.batches_evictions()


@pytest.mark.parametrize("policy", [p for p in POLICIES if policy_class(p).work_conserving])
@SETTINGS
@given(lines=traces(), capacity=st.integers(4, 16))
def test_work_conserving_policies_never_hold_back(tmp_path, policy, lines, capacity):
    """Such a policy never refuses an admission nor forces evictions over free blocks,
    so its waits are exactly the engine's capacity waits."""
    import psgate.policy.base as base
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
