"""static-quota: a group never holds more than its share; at its share it reuses its own
blocks, and waits in its own line when it has none to give."""

from __future__ import annotations

from helpers import replay_file, write


def outcomes(result):
    return {o.id: o for o in result.requests}


def test_at_share_evicts_own_blocks_even_with_free_blocks(tmp_path):
    # 9 usable, two groups -> share 4 each. g's second request must reuse g's own
    # cached blocks although 5 blocks are truly free.
    p = write(tmp_path, [
        {"t": 0, "id": "A", "group": "g", "blocks": ["a1", "a2", "a3", "a4"], "done_t": 1},
        {"t": 0, "id": "H", "group": "h", "blocks": ["c1"], "done_t": 1},
        {"t": 2, "id": "B", "group": "g", "blocks": ["b1", "b2"], "done_t": 3},
    ])
    result, log, _ = replay_file(p, capacity=10, policy="static-quota", paranoid=True)
    assert all(v.holds for v in result.invariants.values())
    assert log.evictions == ["g:a4", "g:a3"]
    assert all(d.rank["at_share"] and d.queue == "g/own" for d in log.decisions)
    assert result.occupancy_max["g"] == 4
    lru, lru_log, _ = replay_file(p, capacity=10, policy="lru")
    assert lru_log.evictions == [] and lru.occupancy_max["g"] == 6


def test_waits_in_own_line_without_blocking_others(tmp_path):
    p = write(tmp_path, [
        {"t": 0, "id": "A", "group": "g", "blocks": ["a1", "a2", "a3"], "tail": 1,
         "done_t": 5},                                        # g pins its whole share (4)
        {"t": 1, "id": "B", "group": "g", "blocks": ["b1"], "done_t": 6},   # must wait
        {"t": 2, "id": "C", "group": "h", "blocks": ["c1"], "done_t": 3},   # not blocked
    ])
    result, log, _ = replay_file(p, capacity=10, policy="static-quota", paranoid=True)
    o = outcomes(result)
    assert o["B"].waited and not o["C"].waited
    assert o["B"].wait_ms == 4000.0            # admitted when A released its blocks at 5 s
    assert [a[0] for a in log.admissions] == ["A", "C", "B"]
    assert result.occupancy_max["g"] == 4


def test_request_larger_than_share_is_rejected(tmp_path):
    p = write(tmp_path, [
        {"t": 0, "id": "A", "group": "g", "blocks": ["a1", "a2", "a3", "a4", "a5"]},
        {"t": 0, "id": "H", "group": "h", "blocks": ["c1"]},
    ])
    result, _, _ = replay_file(p, capacity=10, policy="static-quota")
    assert outcomes(result)["A"].state == "rejected"
    assert result.rejected_ids == ["A"]


def test_configured_shares(tmp_path):
    p = write(tmp_path, [
        {"t": 0, "id": "A", "group": "g", "blocks": ["a1", "a2", "a3", "a4", "a5", "a6"],
         "done_t": 1},
        {"t": 0, "id": "H", "group": "h", "blocks": ["c1"], "done_t": 1},
    ])
    result, _, _ = replay_file(p, capacity=10, policy="static-quota",
                               params={"shares": {"g": 7, "h": 2}})
    o = outcomes(result)
    assert o["A"].state == "completed" and result.occupancy_max["g"] == 6



def test_decode_past_the_share_with_nothing_of_its_own_to_give(tmp_path):
    """Under the step scheduler a running request's output blocks can take its group past
    its share (admission checks the prompt); with none of the group's own blocks
    evictable the extra blocks come from free ones. Before, reclaim_first asked for a
    victim that did not exist and the run aborted on block -1 (fanout at its defaults)."""
    import json

    from test_cli import psgate
    trace, out = tmp_path / "fanout.jsonl", tmp_path / "out"
    assert psgate("trace", "gen", "fanout", "-o", trace).returncode == 0
    proc = psgate("replay", "--trace", trace, "--baseline", "lru", "--candidate",
                  "static-quota", "--out", out, "--quiet", "--paranoid")
    assert proc.returncode in (0, 1), proc.stderr
    run = json.loads((out / "receipt.json").read_text())["runs"]["candidate"]
    assert run["aborted"] is None
    assert all(v["holds"] for v in run["invariants"].values())
