"""Invariant checking: plant violations and see each one caught, never raised."""

from __future__ import annotations

import pytest

from psgate.invariants.checker import NO_KEY, InvariantChecker
from psgate.policies import register, unregister
from psgate.policies.lru import LRUPolicy

from helpers import replay_file, write


def _no_parent(k):
    return NO_KEY


class _PinnedVictimLRU(LRUPolicy):
    """Evicts correctly until told to pick a pinned block."""

    name = "test-pinned-victim"
    defaults = {}

    def select_victim(self, req, now_ns):
        d = super().select_victim(req, now_ns)
        d.victim = 1          # block 1 is pinned by the long-running request in the trace
        return d


class _PinnedInBatchLRU(LRUPolicy):
    """Batches its evictions, and slips a pinned block in after the first victim."""

    name = "test-pinned-in-batch"
    defaults = {}

    def evict_batch(self, req, now_ns, num_blocks, decisions):
        victims = super().evict_batch(req, now_ns, num_blocks, decisions)
        if len(victims) > 1:
            victims[1] = 1    # pinned by the long-running request in the trace
        return victims


class _LyingCountLRU(LRUPolicy):
    name = "test-lying-count"
    defaults = {}

    @property
    def num_candidates(self):
        return self._q.sizes[0] + 1


class _LostCandidateLRU(LRUPolicy):
    """Forgets one freed block in its candidate list but keeps the count right."""

    name = "test-lost-candidate"
    defaults = {}

    def candidates(self):
        return super().candidates()[1:] + [0]


@pytest.fixture(autouse=True, scope="module")
def _register_broken():
    for cls in (_PinnedVictimLRU, _PinnedInBatchLRU, _LyingCountLRU, _LostCandidateLRU):
        register(cls)
    yield
    for cls in (_PinnedVictimLRU, _PinnedInBatchLRU, _LyingCountLRU, _LostCandidateLRU):
        unregister(cls.name)


def _pressure_trace(tmp_path):
    return write(tmp_path, [
        {"t": 0, "id": "L", "blocks": ["1a"], "tail": 1, "done_t": 100},   # pins block 1, 2
        {"t": 1, "id": "A", "blocks": ["a1", "a2"], "done_t": 2},
        {"t": 3, "id": "B", "blocks": ["b1", "b2", "b3"], "done_t": 4},
    ])


def test_pinned_eviction_is_caught_and_run_aborted(tmp_path):
    result, _, _ = replay_file(_pressure_trace(tmp_path), capacity=6,
                               policy="test-pinned-victim")
    v = result.invariants["no_pinned_eviction"]
    assert v.violations == 1
    assert "evicted block 1, which was pinned by a running request" in v.first_violation
    assert "request B" in v.first_violation
    assert result.aborted and "not an eviction candidate" in result.aborted


def test_pinned_block_in_a_batch_is_caught_after_the_good_ones(tmp_path):
    result, log, engine = replay_file(_pressure_trace(tmp_path), capacity=6,
                                      policy="test-pinned-in-batch")
    assert engine.batch_evictions
    v = result.invariants["no_pinned_eviction"]
    assert v.violations == 1 and "evicted block 1, which was pinned" in v.first_violation
    assert result.aborted and "not an eviction candidate" in result.aborted
    # the victim before it was evicted, recorded and counted
    assert len(log.victims) == result.evictions == 1 and log.victims[0] != 1


def test_lying_candidate_count_breaks_accounting(tmp_path):
    result, _, _ = replay_file(_pressure_trace(tmp_path), capacity=6, policy="test-lying-count")
    v = result.invariants["capacity_and_accounting"]
    assert v.violations > 0
    assert "candidates (expected" in v.first_violation


def test_paranoid_recount_finds_wrong_candidate_list(tmp_path):
    result, _, _ = replay_file(_pressure_trace(tmp_path), capacity=6,
                               policy="test-lost-candidate", paranoid=False)
    assert result.invariants["capacity_and_accounting"].holds   # the count alone looks fine
    result, _, _ = replay_file(_pressure_trace(tmp_path), capacity=6,
                               policy="test-lost-candidate", paranoid=True)
    v = result.invariants["capacity_and_accounting"]
    assert not v.holds and "policy's candidates" in v.first_violation


def test_clean_run_checks_every_mutation(tmp_path):
    result, log, _ = replay_file(_pressure_trace(tmp_path), capacity=6, paranoid=True)
    assert all(v.holds for v in result.invariants.values())
    assert result.invariants["no_pinned_eviction"].checks == len(log.evictions) > 0
    assert result.invariants["hits_contiguous_in_namespace"].checks == 3


def test_hit_in_wrong_namespace_is_caught():
    c = InvariantChecker(8, _no_parent)
    key_ns0, key_ns1 = (0 << 32) | 5, (1 << 32) | 5
    c.admitted("first", [], [], 0, [1, 2], [(1, key_ns0)])
    c.released("first", [2, 1])
    # a request in namespace 1 "hits" block 1, which holds namespace 0's content
    c.admitted("second", [key_ns1], [1], 1, [3], [])
    v = c.verdicts["hits_contiguous_in_namespace"]
    assert v.violations == 1 and v.first_violation.startswith("second: hit position 0 is block 1")


def test_hit_beyond_cap_is_caught():
    c = InvariantChecker(8, _no_parent)
    c.admitted("first", [], [], 0, [1], [(1, 7)])
    c.released("first", [1])
    c.admitted("second", [7], [1], 0, [2], [])
    assert "at most 0 allowed" in c.verdicts["hits_contiguous_in_namespace"].first_violation


def test_allocating_a_cached_block_without_eviction_is_caught():
    c = InvariantChecker(8, _no_parent)
    c.admitted("first", [], [], 0, [1], [(1, 7)])
    c.released("first", [1])
    c.admitted("second", [], [], 0, [1], [])     # block 1 still holds content
    v = c.verdicts["capacity_and_accounting"]
    assert "was allocated while holding cached content" in v.first_violation


def test_over_capacity_is_caught():
    c = InvariantChecker(4, _no_parent)   # 3 usable
    c.admitted("a", [], [], 0, [1, 2, 3], [])
    c.check_accounting("a", 0, 0)
    assert c.verdicts["capacity_and_accounting"].holds
    c.num_resident += 1    # as if a fourth block had been handed out
    c.check_accounting("b", 0, 0)
    assert "occupancy 4 of 3 usable" in c.verdicts["capacity_and_accounting"].first_violation


def test_orphans_counted_incrementally():
    parents = {11: NO_KEY, 12: 11, 13: 12}
    c = InvariantChecker(8, lambda k: parents[k])
    c.admitted("a", [], [], 0, [1, 2, 3], [(1, 11), (2, 12), (3, 13)])
    c.released("a", [3, 2, 1])
    c.evicted("evict root", 1)
    assert c.orphan_stats() == {"orphans_created": 1, "orphan_blocks_max": 0,
                                "orphan_blocks_end": 1}
    c.evicted("evict middle", 2)     # 13 still orphaned, 12 gone
    assert c.num_orphans == 1 and c.orphans_created == 2
    c.evicted("evict leaf", 3)
    assert c.num_orphans == 0


class _MRU(LRUPolicy):
    """Evicts the most recently freed candidate: a parent before its child."""

    name = "test-mru"
    defaults = {}

    def select_victim(self, req, now_ns):
        b = self._q.prev[self._q.num_blocks]       # the queue's last block
        d = super().select_victim(req, now_ns)
        d.victim, d.position = b, self._q.sizes[0] - 1
        return d


def test_orphans_measured_on_replay(tmp_path):
    register(_MRU)
    try:
        p = write(tmp_path, [
            {"t": 0, "id": "A", "blocks": ["a1", "a2"], "tail": 1, "done_t": 1},
            # 5 usable: A held 1 2 3; queue 3 4 5 | a2(2) a1(1). B needs 4 blocks:
            # 3 4 5, then MRU evicts a1 (block 1), orphaning a2
            {"t": 2, "id": "B", "blocks": ["b1", "b2", "b3"], "tail": 1, "done_t": 3},
        ])
        result, log, _ = replay_file(p, capacity=6, policy="test-mru", paranoid=True)
        assert log.evictions == ["g:a1"]
        assert result.orphans == {"orphans_created": 1, "orphan_blocks_max": 1,
                                  "orphan_blocks_end": 1}
        assert all(v.holds for v in result.invariants.values())
        result, log, _ = replay_file(p, capacity=6, policy="lru", paranoid=True)
        assert log.evictions == ["g:a2"] and result.orphans["orphans_created"] == 0
    finally:
        unregister("test-mru")


def test_an_aborted_run_still_gives_a_receipt_whose_gate_fails(tmp_path):
    """An aborted run stops reading the trace; the replay reads the rest so that its check
    that the trace did not change covers the whole file (before, it raised RuntimeError
    and wrote nothing)."""
    from psgate import api
    cfg = api.ReplayConfig(trace=str(_pressure_trace(tmp_path)), baseline="lru",
                           candidate="test-pinned-victim", capacity=6, out=tmp_path / "out",
                           scheduler="service")
    receipt = api.replay(cfg).receipt
    assert "not an eviction candidate" in receipt["runs"]["candidate"]["aborted"]
    assert receipt["gate"]["result"] == "fail"
    assert (tmp_path / "out" / "receipt.json").exists()
