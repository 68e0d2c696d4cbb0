"""belady: farthest next use first, never-used-again first of all; labelled a reference."""

from __future__ import annotations

from helpers import replay_file, write


def test_farthest_next_use_is_evicted(tmp_path):
    p = write(tmp_path, [
        {"t": 0, "id": "A", "blocks": ["a1"], "tail": 1, "done_t": 1},
        {"t": 0, "id": "B", "blocks": ["b1"], "tail": 1, "done_t": 1},
        {"t": 0, "id": "C", "blocks": ["c1"], "tail": 1, "done_t": 1},
        # 7 usable: A B C held 6 (3 cached). D needs 6: 4 truly free, then 2 evictions
        {"t": 2, "id": "D", "blocks": ["d1", "d2", "d3", "d4", "d5"], "tail": 1,
         "done_t": 3},
        {"t": 4, "id": "E", "blocks": ["a1"], "tail": 1, "done_t": 5},    # a1 next
        {"t": 6, "id": "F", "blocks": ["c1"], "tail": 1, "done_t": 7},    # then c1
    ])
    result, log, _ = replay_file(p, capacity=8, policy="belady", paranoid=True)
    # b1 is never used again, c1 later than a1: b1 goes first, then c1
    assert log.evictions[:2] == ["g:b1", "g:c1"]
    assert log.decisions[0].rank["next_use_request"] is None
    assert log.decisions[1].rank["next_use_request"] == 5
    assert "not a bound" in log.decisions[0].rank["reference"]
    lru, lru_log, _ = replay_file(p, capacity=8, policy="lru")
    assert lru_log.evictions[:2] == ["g:a1", "g:b1"]
    o = {x.id: x for x in result.requests}
    assert o["E"].cached_tokens == 4


def test_use_that_passes_without_a_hit_refreshes_next_use():
    """A candidate named by an admitted request that did not hit it (its chain broke
    earlier) gets its next use moved past that request."""
    from array import array

    from psgate.policies import make_policy
    from psgate.policy.base import PolicyRequest, PoolInfo

    pol = make_policy("belady")
    pol.set_future({7: array("q", [0, 3, 9]), 8: array("q", [0, 5])})
    pol.bind(PoolInfo(num_blocks=4, num_usable=3, block_size=4))

    def req(i, keys):
        return PolicyRequest(id=f"r{i}", group="g", contract="standard", scope="m",
                             namespace=0, prefix=None, t_ns=i, prompt_tokens=4,
                             num_prompt_blocks=len(keys), num_new_full_blocks=0, index=i,
                             block_keys=keys)

    r0 = req(0, [7, 8])
    pol.on_admit(r0, 0)
    pol.on_cached(1, r0, 0, -1, 7)
    pol.on_cached(2, r0, 1, 1, 8)
    pol.on_free([2, 1], 0)
    assert (pol.next_use[1], pol.next_use[2]) == (3, 5)
    assert pol.select_victim(r0, 0).victim == 2          # 5 is farther than 3
    pol.on_admit(req(3, [6, 7]), 0)                        # names 7 without hitting it
    assert pol.next_use[1] == 9
    assert pol.select_victim(r0, 0).victim == 1
