"""sim against the reference model on hypothesis-generated traces."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import replay_file
from reference_model import reference_replay

BS = 4
CHAINS = [["a1", "a2", "a3", "a4"], ["b1", "b2"], ["c1", "c2", "c3"], ["d1"]]


@st.composite
def traces(draw):
    n = draw(st.integers(1, 25))
    t = 0.0
    lines = [{"psgate_trace": 1, "block_size": BS}]
    ids = []
    for i in range(n):
        t = round(t + draw(st.sampled_from([0, 0, 0.001, 0.004, 0.01, 0.05, 0.3])), 3)
        if ids and draw(st.integers(0, 9)) == 0:
            lines.append({"t": t, "op": "cancel", "id": draw(st.sampled_from(ids))})
            continue
        chain = draw(st.sampled_from(CHAINS))
        k = draw(st.integers(0, len(chain)))
        extra = [f"e{i}{j}" for j in range(draw(st.integers(0, 2)))]
        blocks = chain[:k] + extra if k == len(chain) or not extra else chain[:k]
        tail = draw(st.integers(0, BS - 1))
        if not blocks and tail == 0:
            tail = 1
        r = {"t": t, "op": "request", "id": f"r{i}",
             "group": draw(st.sampled_from(["g", "g", "h"])), "contract": "standard",
             "scope": "m", "blocks": blocks, "tail": tail, "out": draw(st.integers(0, 9))}
        if draw(st.booleans()):
            r["done_t"] = round(t + draw(st.sampled_from([0, 0.001, 0.02, 0.1, 0.5])), 3)
        lines.append(r)
        ids.append(r["id"])
    return lines


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(lines=traces(), capacity=st.integers(2, 14))
def test_sim_matches_reference_model(tmp_path, lines, capacity):
    p = tmp_path / "t.jsonl"
    p.write_text("".join(json.dumps(x) + "\n" for x in lines))
    result, log, _ = replay_file(p, capacity=capacity, paranoid=True)
    ref = reference_replay(lines, capacity)
    assert result.aborted is None
    assert all(v.holds for v in result.invariants.values()), result.invariants
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
