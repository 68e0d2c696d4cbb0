"""Scenario tests for the sim engine: exact block ids, eviction order, service model.

Block size 4 throughout; ``cap`` configured blocks give cap-1 usable ones
(block 0 is the null block). Hashes are short hex names chosen by hand.
"""

from __future__ import annotations

import pytest

from helpers import replay_file, write


def outcomes(result):
    return {o.id: o for o in result.requests}


def test_free_queue_order_and_lru_victims(tmp_path):
    # 5 configured -> 4 usable blocks: 1 2 3 4
    p = write(tmp_path, [
        {"t": 0, "id": "A", "blocks": ["a1", "a2"], "done_t": 1},
        {"t": 2, "id": "B", "blocks": ["b1", "b2"], "done_t": 3},
        # C needs 3 blocks: truly free 3, 4 first, then the LRU head: A's last block a2
        # (freed in reverse: a2 then a1 appended), then a1 for D below
        {"t": 4, "id": "C", "blocks": ["c1", "c2", "c3"], "done_t": 5},
    ], )
    result, log, _ = replay_file(p, capacity=5)
    assert log.block_ids == {"A": [1, 2], "B": [3, 4], "C": [2, 1, 4]}
    assert log.evictions == ["g:a2", "g:a1", "g:b2"]
    assert result.evictions == 3


def test_uncached_blocks_prepended_last_first(tmp_path):
    # A: 1 full block + tail + output -> 3 blocks, only the first is cached.
    p = write(tmp_path, [
        {"t": 0, "id": "A", "blocks": ["a1"], "tail": 2, "out": 4, "done_t": 1},
        {"t": 2, "id": "B", "blocks": [], "tail": 3, "out": 0, "done_t": 3},
        {"t": 4, "id": "C", "blocks": [], "tail": 3, "out": 3, "done_t": 5},
    ])
    _, log, _ = replay_file(p, capacity=5)
    # A holds 1 2 3. Freed in reverse: 3, 2 uncached -> prepended [3, 2]; 1 cached -> back.
    # Queue: 3 2 4 | 1. B takes 3. B frees 3 -> prepend: 3 2 4 | 1. C takes 3 2.
    assert log.block_ids == {"A": [1, 2, 3], "B": [3], "C": [3, 2]}
    assert log.evictions == []


def test_hit_takes_block_out_of_queue_and_pins_it(tmp_path):
    p = write(tmp_path, [
        {"t": 0, "id": "A", "blocks": ["a1", "a2"], "tail": 1, "done_t": 1},
        {"t": 2, "id": "B", "blocks": ["a1", "f2"], "tail": 1, "done_t": 10},
        # D needs 3 blocks while B still pins a1
        {"t": 3, "id": "D", "blocks": ["d1", "d2"], "tail": 1, "done_t": 4},
    ])
    result, log, _ = replay_file(p, capacity=7)   # 6 usable
    o = outcomes(result)
    assert o["B"].cached_tokens == 4
    # A: 1 2 3. Free after A: 4 5 6 | queue (uncached 3 prepended) -> 3 4 5 6 | 2 1
    # B hits block 1 (touch removes it), allocates 2 blocks: 3, 4.
    # D needs 3: truly free 5, 6, then LRU head 2 (a2); block 1 is pinned by B.
    assert log.block_ids == {"A": [1, 2, 3], "B": [1, 3, 4], "D": [5, 6, 2]}
    assert log.evictions == ["g:a2"]


def test_last_block_recompute_duplicates_and_earliest_lookup(tmp_path):
    p = write(tmp_path, [
        {"t": 0, "id": "A", "blocks": ["a1", "a2"], "done_t": 1},
        # whole prompt cached: hits stop at prompt_tokens - 1 -> only a1 hits; a2 recomputed
        {"t": 2, "id": "B", "blocks": ["a1", "a2"], "done_t": 3},
        {"t": 4, "id": "C", "blocks": ["a1", "a2"], "tail": 1, "done_t": 5},
    ])
    result, log, engine = replay_file(p, capacity=6)
    o = outcomes(result)
    assert o["B"].cached_tokens == 4 and o["B"].new_blocks == 1
    # A got 1 2; queue after A: 3 4 5 | 2 1. B hits 1, allocates 3 (a new copy of a2).
    assert log.block_ids["B"] == [1, 3]
    # C has a tail so all of a1 a2 can hit: a2 is held by blocks 2 and 3, earliest is 2.
    assert o["C"].cached_tokens == 8
    assert log.block_ids["C"][:2] == [1, 2]
    assert engine.copies_of(0, engine.hashes.ids["a2"]) == [2, 3]


def test_hit_cap_is_prompt_minus_one_rounded_down(tmp_path):
    p = write(tmp_path, [
        {"t": 0, "id": "A", "blocks": ["a1", "a2", "a3"], "done_t": 1},
        {"t": 2, "id": "B", "blocks": ["a1", "a2", "a3"], "tail": 0, "done_t": 3},
        {"t": 4, "id": "C", "blocks": ["a1", "a2", "a3"], "tail": 3, "done_t": 5},
    ])
    result, _, _ = replay_file(p, capacity=10)
    o = outcomes(result)
    assert o["B"].cached_tokens == 8      # (12 - 1) // 4 = 2 blocks
    assert o["C"].cached_tokens == 12     # (15 - 1) // 4 = 3 blocks


def test_namespaces_never_share(tmp_path):
    p = write(tmp_path, [
        {"t": 0, "id": "A", "group": "g1", "blocks": ["a1", "a2"], "tail": 1, "done_t": 1},
        {"t": 2, "id": "B", "group": "g2", "blocks": ["a1", "a2"], "tail": 1, "done_t": 3},
        {"t": 4, "id": "C", "group": "g1", "scope": "other", "blocks": ["a1"], "tail": 1,
         "done_t": 5},
        {"t": 6, "id": "D", "group": "g1", "blocks": ["a1"], "tail": 1, "done_t": 7},
    ])
    result, _, _ = replay_file(p, capacity=20)
    o = outcomes(result)
    assert (o["B"].cached_tokens, o["C"].cached_tokens, o["D"].cached_tokens) == (0, 0, 4)


def test_head_of_line_wait_and_admission_on_release(tmp_path):
    p = write(tmp_path, [
        {"t": 0, "id": "A", "blocks": ["a1", "a2", "a3"], "done_t": 1.0},
        {"t": 0.1, "id": "B", "blocks": ["b1", "b2"], "done_t": 0.2},   # 3+2 > 4: waits
        {"t": 0.2, "id": "C", "blocks": [], "tail": 1, "done_t": 0.3},  # fits, but behind B
    ])
    result, log, _ = replay_file(p, capacity=5)
    o = outcomes(result)
    assert o["B"].waited and o["C"].waited
    assert o["B"].wait_ms == pytest.approx(900.0)
    assert result.counts["waits"] == 2
    # B admitted at 1.0; done_t - t = 0.1 s held from admission -> released at 1.1
    assert o["B"].release_ns == 1_100_000_000
    assert result.counts["done_shifted"] >= 1
    assert [a[0] for a in log.admissions] == ["A", "B", "C"]


def test_release_before_arrival_at_equal_time(tmp_path):
    p = write(tmp_path, [
        {"t": 0, "id": "A", "blocks": ["a1", "a2", "a3", "a4"], "done_t": 1},
        {"t": 1, "id": "B", "blocks": ["b1", "b2", "b3", "b4"], "done_t": 2},
    ])
    result, log, _ = replay_file(p, capacity=5)
    assert not outcomes(result)["B"].waited
    assert log.evictions == ["g:a4", "g:a3", "g:a2", "g:a1"]


def test_rejects_request_larger_than_cache(tmp_path):
    p = write(tmp_path, [
        {"t": 0, "id": "big", "blocks": ["a1", "a2", "a3", "a4"], "out": 1},
        {"t": 1, "id": "ok", "blocks": ["b1"], "done_t": 2},
        {"t": 3, "op": "cancel", "id": "big"},
    ])
    result, _, _ = replay_file(p, capacity=5)
    o = outcomes(result)
    assert o["big"].state == "rejected"
    assert result.rejected_ids == ["big"]
    assert o["ok"].state == "completed"
    assert result.counts["late_cancels"] == 1


def test_cancel_waiting_and_running(tmp_path):
    p = write(tmp_path, [
        {"t": 0, "id": "A", "blocks": ["a1", "a2", "a3"], "done_t": 5},
        {"t": 0.1, "id": "W", "blocks": ["e1", "e2"], "done_t": 6},   # waits
        {"t": 0.2, "op": "cancel", "id": "W"},                          # dropped
        {"t": 0.3, "op": "cancel", "id": "A"},                          # released at 0.3
        {"t": 0.4, "id": "B", "blocks": ["b1", "b2", "b3", "b4"], "done_t": 1},
        {"t": 2, "op": "cancel", "id": "B"},                            # late
    ])
    result, log, _ = replay_file(p, capacity=5)
    o = outcomes(result)
    assert o["W"].state == "dropped" and o["A"].state == "cancelled"
    assert o["A"].release_ns == 300_000_000
    assert not o["B"].waited
    assert result.counts["dropped"] == 1 and result.counts["cancelled"] == 1
    assert result.counts["late_cancels"] == 1
    # A was cancelled long after its first token, so its TTFT stands
    assert o["A"].ttft_ms is not None


def test_done_event_holds_blocks_until_done(tmp_path):
    p = write(tmp_path, [
        {"t": 0, "id": "A", "blocks": ["a1", "a2", "a3"], "out": 1000},
        {"t": 0.5, "id": "B", "blocks": ["b1", "b2"]},       # waits for A's done
        {"t": 2.0, "op": "done", "id": "A"},
        {"t": 2.5, "op": "done", "id": "B"},
    ])
    result, _, _ = replay_file(p, capacity=5)
    o = outcomes(result)
    # A has 12 prompt + 1000 output tokens -> more blocks than the cache: rejected
    assert o["A"].state == "rejected"
    p = write(tmp_path, [
        {"t": 0, "id": "A", "blocks": ["a1", "a2", "a3"], "out": 1},
        {"t": 0.5, "id": "B", "blocks": ["b1", "b2"]},
        {"t": 2.0, "op": "done", "id": "A"},
        {"t": 2.5, "op": "done", "id": "B"},
    ], name="t2.jsonl")
    result, _, _ = replay_file(p, capacity=6)   # 5 usable: A holds 4, B needs 2
    o = outcomes(result)
    assert o["A"].release_ns == 2_000_000_000
    assert o["B"].waited and o["B"].wait_ms == pytest.approx(1500.0)
    # B holds done - t = 2.0 s from its admission at 2.0
    assert o["B"].release_ns == 4_000_000_000


def test_modeled_ttft_and_fifo_prefill_server(tmp_path):
    p = write(tmp_path, [
        {"t": 0, "id": "A", "blocks": ["a1"] , "tail": 0, "out": 2},
        {"t": 0, "id": "B", "blocks": ["b1"], "tail": 0, "out": 2},
    ])
    result, _, _ = replay_file(p, capacity=10)
    o = outcomes(result)
    # 4 uncached tokens: 5 + 0.06 * 4 = 5.24 ms each; B queues behind A
    assert o["A"].ttft_ms == pytest.approx(5.24)
    assert o["B"].ttft_ms == pytest.approx(10.48)
    assert o["B"].queue_ms == pytest.approx(5.24)
    # completion = first token + 2 * 10 ms
    assert o["A"].release_ns == round((5.24 + 20) * 1e6)


def test_unknown_contract_is_input_error(tmp_path):
    from psgate.errors import InputError
    p = write(tmp_path, [{"t": 0, "id": "A", "blocks": ["a1"], "contract": "gold"}])
    with pytest.raises(InputError, match=r"t.jsonl:2: field 'contract': unknown contract 'gold'"):
        replay_file(p, capacity=10)


def test_partial_trace_unfinished_requests_release_at_end(tmp_path):
    p = write(tmp_path, [
        {"t": 0, "id": "A", "blocks": ["a1"], "tail": 1},
        {"t": 1, "op": "done", "id": "zzz"},
        {"t": 2, "op": "done", "id": "other"},
    ], partial=True)
    # A never gets a done (it is not in the done set, so it is modeled): completes
    result, _, _ = replay_file(p, capacity=10)
    assert outcomes(result)["A"].state == "completed"
    p = write(tmp_path, [
        {"t": 0, "id": "A", "blocks": ["a1"], "tail": 1},
        {"t": 0, "id": "B", "blocks": ["b1"], "tail": 1},
        {"t": 5, "op": "done", "id": "B"},
        {"t": 6, "op": "done", "id": "nope"},
    ], name="t2.jsonl", partial=True)
    result, _, _ = replay_file(p, capacity=10)
    o = outcomes(result)
    assert o["B"].state == "completed" and o["B"].release_ns == 5_000_000_000
    assert o["A"].state == "completed"


def test_cancel_before_first_token_has_no_ttft(tmp_path):
    p = write(tmp_path, [
        {"t": 0, "id": "A", "blocks": ["a1", "a2"], "out": 5},   # prefill 5.48 ms
        {"t": 0.001, "op": "cancel", "id": "A"},
    ])
    result, _, _ = replay_file(p, capacity=10)
    o = outcomes(result)["A"]
    assert o.state == "cancelled" and o.ttft_ms is None and o.release_ns == 1_000_000
