"""leaf-lru: scenario tests (engine and policy level) and a property test against lru.

Block size 4; ``cap`` configured blocks give cap-1 usable ones.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import random_traces, replay_checked, replay_file, run_events, write_lines
from psgate.policies import make_policy
from psgate.policy.base import PolicyRequest, PoolInfo


def run(tmp_path, events, cap, policy="leaf-lru"):
    return run_events(tmp_path, events, cap, policy)


REQ = PolicyRequest(id="r", group="g", contract="standard", scope="m", namespace=0,
                    prefix=None, t_ns=0, prompt_tokens=16, num_prompt_blocks=4,
                    num_new_full_blocks=4)


def bare(n=10):
    pol = make_policy("leaf-lru")
    pol.bind(PoolInfo(num_blocks=n, num_usable=n - 1, block_size=4))
    return pol


def evict_all(pol):
    out = []
    while pol.num_candidates:
        d = pol.select_victim(REQ, 0)
        assert pol.candidates()[0] == d.victim or d.queue == "ancestry-fallback"
        out.append((d.victim, d.queue, d.rank))
        pol.on_evict(d.victim)
    return out


def test_children_before_parents_parent_back_at_its_own_position():
    # chain 1 <- 2 <- 3 (3 deepest) and two unrelated blocks 4, 5. The parent is freed
    # before its children (an order sim never produces, see the module docstring;
    # another engine may): freed 1, 4, 3, 2, 5 -> freed_seq 1..5.
    pol = bare()
    pol.on_cached(1, REQ, 0, -1)
    pol.on_cached(2, REQ, 1, 1)
    pol.on_cached(3, REQ, 2, 2)
    pol.on_cached(4, REQ, 0, -1)
    pol.on_cached(5, REQ, 0, -1)
    for blocks in ([1], [4], [3, 2], [5]):
        pol.on_free(blocks, 0)
    assert pol.candidates() == [4, 3, 5, 1, 2]      # leaves, then non-leaves
    got = evict_all(pol)
    # lru would go 1 4 3 2 5 and orphan 2 and 3 at once. leaf-lru: 4 then 3 (leaves by
    # age); 2 becomes a leaf at seq 4, then 1 at seq 1, ahead of the younger leaf 5.
    assert [v for v, _, _ in got] == [4, 3, 2, 1, 5]
    assert all(q == "leaf" for _, q, _ in got)
    assert [r["freed_seq"] for _, _, r in got] == [2, 3, 4, 1, 5]
    assert got[0][2] == {"freed_seq": 2, "leaf": True}
    lru = make_policy("lru")
    lru.bind(PoolInfo(num_blocks=10, num_usable=9, block_size=4))
    for blocks in ([1], [4], [3, 2], [5]):
        lru.on_free(blocks, 0)
    assert lru.select_victim(REQ, 0).victim == 1


def test_touch_and_refree_and_recompute_duplicates():
    pol = bare()
    pol.on_cached(1, REQ, 0, -1)
    pol.on_cached(2, REQ, 1, 1)
    pol.on_cached(3, REQ, 1, 1)       # a recomputed copy of block 2's content: 2 children
    pol.on_free([3], 0)
    pol.on_free([2, 1], 0)
    pol.on_touch(3)                   # hit again: pinned
    assert pol.num_candidates == 2 and pol.candidates() == [2, 1]
    d = pol.select_victim(REQ, 0)
    pol.on_evict(d.victim)
    assert d.victim == 2
    # 1 still has child 3 (pinned): not a leaf, and 1 is the only candidate
    d = pol.select_victim(REQ, 0)
    assert d.victim == 1 and d.queue == "ancestry-fallback"
    assert d.rank == {"freed_seq": 3, "leaf": False, "ancestry_fallback": True}
    pol.on_evict(1)
    # block 1 is reused for other content; its old child 3 must not count against it
    pol.on_cached(1, REQ, 0, -1)
    pol.on_free([3], 0)
    pol.on_free([1], 0)
    assert pol.candidates() == [3, 1]
    pol.on_evict(pol.select_victim(REQ, 0).victim)
    assert pol.tree.children[1] == 0 and pol.candidates() == [1]


def test_engine_shared_prefix_tree_leaves_first_no_orphans(tmp_path):
    # 7 usable. B hits A's a1 a2 and adds b3: a1 has child a2, a2 has children a3, b3.
    # A frees a3 (its tail block goes to the truly free front), B frees b3, a2, a1.
    events = [
        {"t": 0, "id": "A", "blocks": ["a1", "a2", "a3"], "tail": 1, "done_t": 1},
        {"t": 0.5, "id": "B", "blocks": ["a1", "a2", "b3"], "tail": 1, "done_t": 2},
        {"t": 3, "id": "C", "blocks": ["c1", "c2", "c3", "c4"], "tail": 3, "done_t": 4},
        {"t": 5, "id": "D", "blocks": ["d1", "d2", "d3", "d4", "d5"], "tail": 3,
         "done_t": 6},
    ]
    result, log, engine = run(tmp_path, events, cap=8)
    # C (5 blocks): truly free 6 4 7, then the two leaves a3 (3) and b3 (5).
    # D (6 blocks): C's tail block 5, then a2 (a leaf now), a1, and C's chain deepest
    # first: c4 c3 c2.
    assert log.block_ids == {"A": [1, 2, 3, 4], "B": [1, 2, 5, 6], "C": [6, 4, 7, 3, 5],
                             "D": [5, 2, 1, 3, 7, 4]}
    assert log.evictions == ["g:a3", "g:b3", "g:a2", "g:a1", "g:c4", "g:c3", "g:c2"]
    assert [d.rank["freed_seq"] for d in log.decisions] == [1, 2, 3, 4, 5, 6, 7]
    assert all(d.queue == "leaf" and d.rank["leaf"] for d in log.decisions)
    assert result.orphans["orphans_created"] == 0
    _, lru_log, _ = run(tmp_path, events, cap=8, policy="lru")
    assert lru_log.evictions == log.evictions and lru_log.victims == log.victims


def test_bundled_example_gate_passes(tmp_path):
    from typer.testing import CliRunner

    from psgate.cli import app
    res = CliRunner().invoke(app, ["replay", "--baseline", "lru", "--candidate", "leaf-lru",
                                   "--out", str(tmp_path / "out"), "--force", "--paranoid"])
    assert res.exit_code == 0, res.output


CHAINS = [["a1", "a2", "a3", "a4"], ["a1", "a2", "b3"], ["a1", "c2"], ["d1", "d2"]]


def traces():
    return random_traces(CHAINS)


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(lines=traces(), capacity=st.integers(2, 14))
def test_same_order_as_lru_in_sim_and_never_orphans(tmp_path, lines, capacity):
    # In sim the lru head is always a leaf (a request pins a block's whole prefix and
    # frees last block first), so leaf-lru must evict exactly as lru does.
    p = write_lines(tmp_path, lines)
    result, log, _ = replay_checked(p, capacity, policy="leaf-lru")
    assert result.orphans["orphans_created"] == 0
    assert not any(d.rank.get("ancestry_fallback") for d in log.decisions)
    _, lru_log, _ = replay_file(p, capacity=capacity, policy="lru")
    assert log.victims == lru_log.victims
