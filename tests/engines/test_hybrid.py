"""Hybrid-attention models on the step scheduler (``--kv-groups``): exact block ids.

Block size 4 and every step 1 ms, as in test_sched.py. ``full,sliding:6`` is a full-attention
group then a sliding-window group whose window is 6 tokens: a sliding-window hit needs a run
of ceil(5/4) = 2 cached blocks, and a request that has computed n tokens no longer needs its
blocks wholly before token n - 5. The expected values are worked out by hand from vLLM 0.32's
hybrid coordinator (psgate/engines/kv_groups.py); tests/vllm_suite/test_step_conformance.py
runs generated traces on vLLM's own scheduler with the same groups.
"""

from __future__ import annotations

import re

import pytest

from helpers import write
from psgate.engines.kv_groups import FULL, SLIDING, KVGroup, longest_hit, parse_kv_groups
from psgate.engines.step_cost import SchedulerParams
from psgate.errors import InputError

from test_sched import replay_step

HYBRID = SchedulerParams(max_num_batched_tokens=8, max_num_seqs=4, kv_groups="full,sliding:6")
# Every full block cached in every group (vLLM's prefix_cache_retention_interval=None).
DENSE = SchedulerParams(max_num_batched_tokens=8, max_num_seqs=4, kv_groups="full,sliding:6",
                        prefix_cache_retention_interval=None)


def test_kv_groups_parse_and_print():
    assert parse_kv_groups("full") == () and parse_kv_groups("") == ()
    groups = parse_kv_groups("full, sliding:4096,sliding:128")
    assert groups == (KVGroup(FULL), KVGroup(SLIDING, 4096), KVGroup(SLIDING, 128))
    assert SchedulerParams(kv_groups=groups).to_json()["kv_groups"] == \
        "full,sliding:4096,sliding:128"
    assert "kv_groups" not in SchedulerParams().to_json()      # receipts as before
    assert SchedulerParams(**SchedulerParams(kv_groups=groups).to_json()).kv_groups == groups


@pytest.mark.parametrize("text, message", [
    ("full,sliding", "group 1 ('sliding'): expected a sliding window of at least 2 tokens"),
    ("sliding:1", "group 0 ('sliding:1'): expected a sliding window of at least 2 tokens"),
    ("full,local:8", "group 1 ('local:8'): expected 'full' or 'sliding:WINDOW'"),
    (",".join(["full"] * 33), "expected at most 32 KV-cache groups, found 33"),
])
def test_kv_groups_refuse_bad_text(text, message):
    with pytest.raises(InputError, match="^" + re.escape("--kv-groups: " + message)):
        parse_kv_groups(text)


def _table(rows: dict[int, set[int]]):
    """cached(g, pos) over {group: positions cached}; block id = 100 * group + pos + 1."""
    return lambda g, pos: 100 * g + pos + 1 if pos in rows.get(g, ()) else -1


def test_lookup_full_then_sliding_window():
    groups = parse_kv_groups("full,sliding:6")          # a window hit needs 2 blocks
    # all of 0-5 cached in both groups: the full group's 6, the sliding run ends there
    n, hits, _ = longest_hit(groups, 4, 6, _table({0: set(range(6)), 1: set(range(6))}))
    assert n == 6 and hits == [[1, 2, 3, 4, 5, 6], [0, 0, 0, 0, 105, 106]]
    # the sliding group lost 4: its last run of 2 is 2-3, so the hit is 4 blocks
    n, hits, _ = longest_hit(groups, 4, 6, _table({0: set(range(6)), 1: {0, 1, 2, 3, 5}}))
    assert n == 4 and hits == [[1, 2, 3, 4], [0, 0, 103, 104]]
    # no run of 2 anywhere, but block 0 is cached: a hit shorter than a window
    n, hits, _ = longest_hit(groups, 4, 6, _table({0: set(range(6)), 1: {0, 2, 4}}))
    assert n == 1 and hits == [[1], [101]]
    # only the window survived a flood: the full group's prefix decides
    n, hits, longest = longest_hit(groups, 4, 6, _table({0: {0, 1, 2}, 1: {1, 2, 3, 4, 5}}))
    assert n == 3 and hits == [[1, 2, 3], [0, 102, 103]] and longest == 3
    # a sliding group whose early blocks were evicted, the full group intact: no hit at all
    n, hits, longest = longest_hit(groups, 4, 6, _table({0: set(range(6)), 1: {5}}))
    assert n == 0 and hits == [[], []]
    assert longest == 6        # the full group's prefix: the junction a sliding group pins


def test_lookup_iterates_until_every_group_agrees():
    # two windows: 6 tokens (run of 2) and 10 (run of 3). The first pass ends the short
    # window at 6, the long one then finds 3-5 missing... until both accept 3 blocks.
    groups = parse_kv_groups("full,sliding:6,sliding:10")
    rows = {0: set(range(6)), 1: {1, 2, 4, 5}, 2: {0, 1, 2, 5}}
    n, hits, _ = longest_hit(groups, 4, 6, _table(rows))
    assert n == 3
    assert hits == [[1, 2, 3], [0, 102, 103], [201, 202, 203]]


def test_window_frees_blocks_as_the_request_advances_and_a_follow_up_hits_the_window(
        tmp_path):
    # Dense caching. A: 16 prompt tokens, 5 out, 8-token chunks. Steps 1-2 give each group two
    # blocks a step (full 1 2 5 6, sliding 3 4 7 8), cached as they fill. At step 3 A has
    # computed 16 tokens: its sliding blocks 0-1 (3 and 4) are before the window and are freed,
    # last first, to the LRU queue, and block 4 of each group comes from the free list (9, 10);
    # at step 4 (17 computed) sliding block 2 (7) goes. A finishes at step 6 (20 tokens: its
    # output block is cached in both groups): full 9 6 5 2 1, then sliding 10 8. LRU queue: 4 3
    # 7 9 6 5 2 1 10 8. Capacity 12: block 11 is left truly free.
    p = write(tmp_path, [
        {"t": 0, "id": "A", "blocks": ["a1", "a2", "a3", "a4"], "out": 5},
        {"t": 0.010, "id": "B", "blocks": ["a1", "a2", "a3", "a4", "b5"], "out": 1},
    ])
    o, result, log = replay_step(p, capacity=12, sched=DENSE)
    assert o["A"].ttft_ms == 2 and o["A"].release_ns == 6_000_000
    assert log.admissions[:4] == [("A", 0, 4, 4), ("A", 0, 4, 4), ("A", 0, 2, 0),
                                  ("A", 0, 0, 2)]
    # B's lookup: the full group has a1-a4 (1 2 5 6); the sliding group's last run of two
    # is a3 a4 (7 8): 16 cached tokens, six blocks taken (a1 a2 skipped in the window).
    # Its fifth full block is the free 11; its fifth sliding one evicts the LRU head, 4
    # (sliding a2; B took 7 and 8 from the queue).
    assert o["B"].cached_tokens == 16
    assert log.admissions[4] == ("B", 6, 2, 2)
    assert log.victims == [4] and log.evictions == ["g:a2"]
    assert result.counts["hit_blocks"] == 4


def test_a_flood_of_the_window_collapses_the_hit_of_an_intact_full_prefix(tmp_path):
    # Dense caching. A caches a1-a4 in both groups and finishes; its sliding blocks go to the
    # LRU queue first (freed as the window moved, or first at the end). F (8 tokens) then needs
    # 4 blocks: the free 11, then it evicts 4 3 7 (sliding a2 a1 a3). C (a1 a2 a3 c4) finds
    # a1-a3 in the full group but the sliding group's a3 is gone, and with it every run of two:
    # C hits nothing. Without the sliding group, C would hit 12 tokens.
    p = write(tmp_path, [
        {"t": 0, "id": "A", "blocks": ["a1", "a2", "a3", "a4"], "out": 5},
        {"t": 0.010, "id": "F", "blocks": ["f1", "f2"], "out": 1},
        {"t": 0.020, "id": "C", "blocks": ["a1", "a2", "a3", "c4"], "out": 1},
    ])
    o, _, log = replay_step(p, capacity=12, sched=DENSE)
    assert log.victims[:3] == [4, 3, 7]
    assert log.evictions[:3] == ["g:a2", "g:a1", "g:a3"]
    assert o["C"].cached_tokens == 0
    one = SchedulerParams(max_num_batched_tokens=8, max_num_seqs=4)
    o1, _, _ = replay_step(p, capacity=12, sched=one)
    assert o1["C"].cached_tokens == 12


def test_a_request_that_cannot_fit_both_groups_is_rejected(tmp_path):
    # 24 tokens (prompt and output): 6 full blocks + 5 sliding (the sliding group's
    # admission cap is ceil(min(5 + 8, 44) / 4) + 1 = 5): 11 blocks of a 10-block pool.
    p = write(tmp_path, [{"t": 0, "id": "A", "blocks": ["a1", "a2", "a3", "a4", "a5"],
                          "tail": 3, "out": 1}])
    o, result, _ = replay_step(p, capacity=11, sched=HYBRID)
    assert o["A"].state == "rejected" and result.counts["rejected"] == 1
    o, _, _ = replay_step(p, capacity=12, sched=HYBRID)
    assert o["A"].state == "completed"


def test_sliding_group_caches_only_where_a_later_request_can_resume(tmp_path):
    # vLLM's default retention (0). A (a1-a4, 16 tokens) can be resumed at its last whole
    # block before its final token, block 3: its sliding group caches the run of two
    # ending there, a2 a3, and leaves a1, a4 and its output block uncached (truly free
    # when released). B (a1-a4 b5-b7) finds a1-a4 in the full group, but in the sliding
    # group only a2 a3: its hit is 3 blocks, 12 tokens, and 16 is the junction it pins.
    # B's sliding group caches the runs ending at its own resume block (b5 b6) and at the
    # junction (a3 a4): C (a1-a4 c5) then hits all of a1-a4.
    p = write(tmp_path, [
        {"t": 0, "id": "A", "blocks": ["a1", "a2", "a3", "a4"], "out": 5},
        {"t": 0.010, "id": "B", "blocks": ["a1", "a2", "a3", "a4", "b5", "b6", "b7"],
         "out": 1},
        {"t": 0.030, "id": "C", "blocks": ["a1", "a2", "a3", "a4", "c5"], "out": 1},
    ])
    o, result, log = replay_step(p, capacity=32, sched=HYBRID)
    assert o["B"].cached_tokens == 12 and o["C"].cached_tokens == 16
    # The rows count the blocks each batch cached: A's sliding group one in each chunk
    # (a2, then a3) and none at its output block; B's a4 and b5, then b6; C's none
    assert log.admissions[:4] == [("A", 0, 4, 3), ("A", 0, 4, 3), ("A", 0, 2, 0),
                                  ("A", 0, 0, 1)]
    assert log.admissions[4:6] == [("B", 5, 4, 4), ("B", 0, 4, 3)]
    assert log.admissions[6] == ("C", 6, 2, 1)
    assert result.evictions == 0
    # every full block cached: B would have hit A's a4 too
    o, _, _ = replay_step(p, capacity=32, sched=DENSE)
    assert o["B"].cached_tokens == 16 and o["C"].cached_tokens == 16


def test_retention_interval_must_be_a_multiple_of_the_block_size(tmp_path):
    p = write(tmp_path, [{"t": 0, "id": "A", "blocks": ["a1"], "out": 1}])
    bad = SchedulerParams(kv_groups="full,sliding:6", prefix_cache_retention_interval=6)
    with pytest.raises(InputError, match=r"--retention-interval: expected 0, "
                                         r"'dense' or a multiple of the trace's block size 4, "
                                         r"found 6"):
        replay_step(p, capacity=8, sched=bad)


# -- the command line: --kv-groups end to end ------------------------------------------

def _chat(tmp_path):
    from psgate.workloads import generate
    from psgate.trace.writer import write_trace
    path = tmp_path / "chat.jsonl"
    write_trace(path, generate("sharegpt", {"conversations": 16}))
    return path


def _replay(tmp_path, trace, out, *extra, env=None):
    from test_cli import psgate
    return psgate("replay", "--trace", trace, "--baseline", "lru", "--candidate",
                  "prefixshield", "--capacity", 160, "--out", tmp_path / out, "--force",
                  "--quiet", *extra, env=env)


def test_a_hybrid_replay_is_recorded_verified_and_explained(tmp_path):
    import json
    from test_cli import psgate
    trace = _chat(tmp_path)
    proc = _replay(tmp_path, trace, "h", "--kv-groups", "full,sliding:64")
    assert proc.returncode in (0, 1), proc.stderr
    receipt = json.loads((tmp_path / "h" / "receipt.json").read_text())
    sched = receipt["config"]["scheduler"]
    assert sched["kv_groups"] == "full,sliding:64"
    assert sched["prefix_cache_retention_interval"] == 0
    assert all(v["holds"] for run in receipt["runs"].values()
               for v in run["invariants"].values())
    one = _replay(tmp_path, trace, "one")
    one_receipt = json.loads((tmp_path / "one" / "receipt.json").read_text())
    assert "kv_groups" not in one_receipt["config"]["scheduler"]
    hit = receipt["runs"]["baseline"]["metrics"]["totals"]["hit_fraction"]
    assert hit < one_receipt["runs"]["baseline"]["metrics"]["totals"]["hit_fraction"]
    # verify re-runs both policies with the recorded groups: the same bytes
    proc = psgate("verify", tmp_path / "h", "--trace", trace)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    # explain re-simulates a request with them too
    import csv
    with open(tmp_path / "h" / "requests.csv", newline="") as f:
        rid = next(r["id"] for r in csv.DictReader(f) if int(r["cached_tokens"]) > 0)
    proc = psgate("explain", tmp_path / "h", "--request", rid, "--trace", trace)
    assert proc.returncode == 0, proc.stderr
    # and the same trace and settings give the same bytes without the compiled core
    proc = _replay(tmp_path, trace, "h0", "--kv-groups", "full,sliding:64",
                   env={"PSGATE_CORE": "0"})
    assert proc.returncode in (0, 1), proc.stderr
    for name in ("requests.csv", "ledger.compact.csv.gz"):
        assert (tmp_path / "h" / name).read_bytes() == (tmp_path / "h0" / name).read_bytes()
    from psgate.receipt.receipt import deterministic_part, dumps
    other = json.loads((tmp_path / "h0" / "receipt.json").read_text())
    assert dumps(deterministic_part(receipt)) == dumps(deterministic_part(other))


@pytest.mark.parametrize("extra, needles", [
    (["--kv-groups", "full,window:8"], ["--kv-groups: group 1 ('window:8')"]),
    (["--kv-groups", "full,sliding:8", "--scheduler", "service"],
     ["--kv-groups", "modeled by the step scheduler only", "scheduler service"]),
    (["--kv-groups", "full,sliding:8", "--retention-interval", "soon"],
     ["--retention-interval: expected an integer >= 0 or 'dense', "
      "found 'soon'"]),
    (["--kv-groups", "full,sliding:8", "--retention-interval", "24"],
     ["--retention-interval: expected 0, 'dense' or a multiple of the "
      "trace's block size 16, found 24"]),
])
def test_bad_kv_group_settings_are_one_line_errors(tmp_path, extra, needles):
    from test_cli import assert_one_line_error
    proc = _replay(tmp_path, _chat(tmp_path), "bad", *extra)
    assert_one_line_error(proc, 2, *needles)
    assert not (tmp_path / "bad" / "receipt.json").exists()


@pytest.mark.parametrize("header, needles", [
    ({"kv_groups": 4096}, ["t.jsonl:1: field 'kv_groups': expected a string, found"]),
    ({"kv_groups": "full,local:8"},
     ["t.jsonl:1: field 'kv_groups': group 1 ('local:8'): expected 'full' or "
      "'sliding:WINDOW'"]),
    ({"kv_groups": "sliding:64,full"},
     ["--kv-groups: the trace was captured from a model whose KV-cache groups are "
      "sliding:64,full; the replay's are full: pass --kv-groups sliding:64,full"]),
])
def test_a_trace_that_records_its_models_groups_replays_only_under_them(tmp_path, header,
                                                                        needles):
    from test_cli import assert_one_line_error, psgate
    p = write(tmp_path, [{"t": 0, "id": "A", "blocks": ["a1", "a2"], "out": 1}], **header)
    proc = psgate("replay", "--trace", p, "--baseline", "lru", "--candidate", "lru",
                  "--out", tmp_path / "o", "--allow-unexercised")
    assert_one_line_error(proc, 2, *needles)
    if header["kv_groups"] == "sliding:64,full":
        proc = psgate("replay", "--trace", p, "--baseline", "lru", "--candidate", "lru",
                      "--out", tmp_path / "o", "--allow-unexercised", "--kv-groups",
                      "sliding:64,full")
        assert proc.returncode == 0, proc.stderr
