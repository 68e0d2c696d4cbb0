"""sim against the reference model on hypothesis-generated traces."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import random_traces, replay_checked, write_lines
from reference_model import reference_replay

BS = 4
CHAINS = [["a1", "a2", "a3", "a4"], ["b1", "b2"], ["c1", "c2", "c3"], ["d1"]]


def traces():
    """Random traces; extra (unique) blocks only after a whole chain. Also used by
    tests/policies/test_contract.py."""
    return random_traces(CHAINS, groups=("g", "g", "h"), max_requests=25,
                         gaps=(0, 0, 0.001, 0.004, 0.01, 0.05, 0.3), cancel_one_in=10,
                         extra_name="e{i}{j}", extras_on_partial=False, max_out=9,
                         block_size=BS)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(lines=traces(), capacity=st.integers(2, 14))
def test_sim_matches_reference_model(tmp_path, lines, capacity):
    p = write_lines(tmp_path, lines)
    ref = reference_replay(lines, capacity)
    result, log, _ = replay_checked(p, capacity)
    assert log.evictions == ref["evictions"]
    got = {o.id: o for o in result.requests}
    assert set(got) == set(ref["requests"])
    for rid, want in ref["requests"].items():
        o = got[rid]
        assert o.state == want["state"], rid
        assert o.cached_tokens == want["cached_tokens"], rid
        if "blocks" in want:
            assert log.block_ids[rid] == want["blocks"], rid
        if "release" in want:
            assert o.release_ns == want["release"], rid
        if "ttft_ns" in want:
            assert (None if o.ttft_ms is None else round(o.ttft_ms * 1e6)) == want["ttft_ns"], rid
