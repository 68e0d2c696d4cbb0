"""sim's step scheduler (``--scheduler step``): exact block ids, eviction order, step times.

Block size 4; ``capacity`` configured blocks give capacity-1 usable ones. Unless a test says
otherwise every step costs 1 ms (``ONE_MS``), so a step's end is its number in ms; the
expected values are worked out by hand from vLLM 0.32's ``Scheduler.schedule`` (see
psgate/engines/sched.py) and the same scenarios run on vLLM's own scheduler in
tests/vllm_suite/test_step_conformance.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hypothesis import HealthCheck, given, settings

from helpers import CONTRACTS, EventLog, random_traces, write, write_lines
from psgate.engines.results import CANCELLED, COMPLETED, DROPPED, REJECTED
from psgate.engines.sched import StepSimEngine
from psgate.engines.step_cost import SchedulerParams, StepCostModel
from psgate.policies import make_policy
from psgate.receipt.ledger import open_text
from psgate.trace.reader import HashTable, TraceReader, TraceSource, validate_trace

ONE_MS = StepCostModel(fixed_ms=1.0, per_prefill_token_ms=0.0, per_context_token_ms=0.0,
                       per_decode_ms=0.0)
MS = 1_000_000


class StepLog(EventLog):
    """EventLog that also keeps the time and request of every eviction."""

    def __init__(self) -> None:
        super().__init__()
        self.eviction_times: list[tuple[int, str]] = []

    def eviction(self, now_ns, req, decision, block, hash_name, owner) -> None:
        super().eviction(now_ns, req, decision, block, hash_name, owner)
        self.eviction_times.append((now_ns, req.id))


class HitLog(StepLog):
    """StepLog that asks for hit rows (``--ledger-hits``) and keeps them."""

    hits = True

    def __init__(self) -> None:
        super().__init__()
        self.hit_rows: list[tuple[float, str, int, int, str, str]] = []

    def hit(self, now_ns, req, pos, block, hash_name, owner) -> None:
        self.hit_rows.append((now_ns / MS, req.id, pos, block, hash_name, owner))


def replay_step(path: Path, capacity: int, policy: str = "lru", cost=ONE_MS,
                sched: SchedulerParams | None = None, paranoid: bool = True, log=None):
    hashes = HashTable()
    header, summary = validate_trace(str(path), hashes)
    log = log if log is not None else StepLog()
    engine = StepSimEngine(header=header, hashes=hashes, capacity=capacity,
                           policy=make_policy(policy), contracts=CONTRACTS,
                           done_ids=summary.done_ids, recorder=log, paranoid=paranoid,
                           trace_path=str(path), groups=summary.groups, step_cost=cost,
                           sched=sched)
    with TraceReader(TraceSource(str(path), Path(path)), hashes) as reader:
        result = engine.run(reader.events())
    assert result.aborted is None
    assert all(v.holds for v in result.invariants.values()), result.invariants
    return {o.id: o for o in result.requests}, result, log


def t0(ns: int) -> float:
    return ns / MS


def test_waiting_request_holds_nothing_and_is_looked_up_when_scheduled(tmp_path):
    # 4 usable blocks. A (12 prompt tokens, 4 out) needs 3 blocks to start and a 4th at its
    # first decode; B (8 tokens) cannot start while A runs: its whole prompt must fit.
    p = write(tmp_path, [
        {"t": 0, "id": "A", "blocks": ["a1", "a2", "a3"], "out": 4},
        {"t": 0, "id": "B", "blocks": ["b1", "b2"], "out": 1},
    ])
    o, result, log = replay_step(p, capacity=5)
    # A: first token at the end of step 1, decodes in steps 2-4, done at 4 ms. Its last
    # block never fills with computed tokens, so it is freed uncached (to the front), and
    # its prompt blocks go to the LRU queue last block first: a3, a2, a1.
    assert t0(o["A"].release_ns) == 4 and o["A"].ttft_ms == 1
    # B is scheduled in step 5: truly free block 4 first, then the LRU head a3.
    assert log.evictions == ["g:a3"] and log.victims == [3]
    assert log.eviction_times == [(4 * MS, "B")]
    assert o["B"].queue_ms == 4 and o["B"].ttft_ms == 5 and o["B"].waited
    assert o["B"].cached_tokens == 0 and o["B"].state == COMPLETED
    assert result.counts["steps"] == 5 and result.counts["preemptions"] == 0


def test_decode_without_a_block_preempts_the_last_running_request(tmp_path):
    # 4 usable blocks; A and B each 4 prompt tokens + 8 out: 3 blocks each at the end.
    p = write(tmp_path, [
        {"t": 0, "id": "A", "blocks": ["a1"], "out": 8},
        {"t": 0, "id": "B", "blocks": ["b1"], "out": 8},
    ])
    o, result, log = replay_step(p, capacity=5)
    # Steps 1-5: A holds 1 3, B 2 4 (the second block of each caches its first four
    # tokens of output in step 5). Step 6: A's decode needs a 3rd block, none is free:
    # B (running[-1]) is preempted, its blocks 4 (output) and 2 (b1) go to the LRU queue,
    # and A evicts the head, B's output block 4.
    assert o["B"].preemptions == 1 and o["A"].preemptions == 0
    assert result.counts["preemptions"] == 1
    # A finishes at 8 ms (8 tokens, the first at 1 ms). B resumes in step 9: b1 still
    # cached (a hit on its own block), its output block gone; it recomputes 5 tokens
    # and evicts A's output block 3 after taking the truly free block 4.
    assert t0(o["A"].release_ns) == 8
    assert log.victims == [4, 3] and log.evictions == ["g:", "g:"]
    assert log.eviction_times == [(5 * MS, "A"), (8 * MS, "B")]
    # B's first token came at 1 ms; resumed at 8 ms it samples output 6 at 9, done at 11.
    assert o["B"].ttft_ms == 1 and t0(o["B"].release_ns) == 11
    assert o["B"].cached_tokens == 0       # what its first scheduling found
    # Preempted with 8 tokens computed (its prompt and 4 outputs), it hit b1 on resuming:
    # 4 of the 5 tokens it then computed had been computed before.
    assert o["B"].preempt_recompute_tokens == 4 and o["A"].preempt_recompute_tokens == 0


def test_hit_rows_are_written_when_a_request_is_looked_up(tmp_path):
    # A caches a1 a2 and finishes (1 out token: done at 1 ms). C arrives at 5 ms and its
    # lookup, when it is scheduled, takes both: two hit rows at 5 ms, in prefix order, with
    # the trace's hash names and the owner of each block. B never hits: no rows.
    p = write(tmp_path, [
        {"t": 0, "id": "A", "blocks": ["a1", "a2"], "out": 1},
        {"t": 0, "id": "B", "blocks": ["b1"], "out": 1},
        {"t": 0.005, "id": "C", "blocks": ["a1", "a2", "c3"], "out": 1},
    ])
    log = HitLog()
    o, result, _ = replay_step(p, capacity=16, log=log)
    assert o["C"].cached_tokens == 8
    assert log.hit_rows == [(5.0, "C", 0, 1, "a1", "g"), (5.0, "C", 1, 2, "a2", "g")]
    assert len(log.hit_rows) == result.counts["hit_blocks"]


def test_chunked_prefill_under_the_token_budget(tmp_path):
    p = write(tmp_path, [{"t": 0, "id": "A", "blocks": ["a1", "a2", "a3", "a4", "a5"]}])
    cost = StepCostModel(fixed_ms=1.0, per_prefill_token_ms=0.1, per_context_token_ms=0.01,
                         per_decode_ms=0.0)
    o, result, log = replay_step(p, capacity=10, cost=cost,
                                 sched=SchedulerParams(max_num_batched_tokens=8))
    # 20 prompt tokens in chunks of 8, 8, 4; each chunk is an allocation batch that
    # caches the blocks it fills. Steps: 1 + 0.8 (context 0), 1 + 0.8 + 0.08 (context 8),
    # 1 + 0.4 + 0.16 (context 16): the first token at 5.24 ms.
    assert log.admissions == [("A", 0, 2, 2), ("A", 0, 2, 2), ("A", 0, 1, 1)]
    assert abs(o["A"].ttft_ms - 5.24) < 1e-9
    assert result.counts["steps"] == 3


def test_cancel_of_a_waiting_request_caches_nothing(tmp_path):
    p = write(tmp_path, [
        {"t": 0, "id": "A", "blocks": ["a1", "a2", "a3"], "out": 4},
        {"t": 0, "id": "B", "blocks": ["b1", "b2"], "out": 1},
        {"t": 0.0025, "op": "cancel", "id": "B"},
        {"t": 0.010, "id": "C", "blocks": ["b1", "b2"], "tail": 1},
    ])
    o, result, log = replay_step(p, capacity=5)
    assert o["B"].state == DROPPED and result.counts["dropped"] == 1
    assert [a[0] for a in log.admissions].count("B") == 0
    assert o["C"].cached_tokens == 0


def test_cancel_of_a_running_request_keeps_its_hits_and_frees_its_blocks(tmp_path):
    p = write(tmp_path, [
        {"t": 0, "id": "A", "blocks": ["a1", "a2"], "out": 20},
        {"t": 0.0035, "op": "cancel", "id": "A"},
        {"t": 0.010, "id": "C", "blocks": ["a1", "a2"], "tail": 1},
    ])
    o, result, _ = replay_step(p, capacity=8)
    assert o["A"].state == CANCELLED and t0(o["A"].release_ns) == 4
    assert o["C"].cached_tokens == 8


def test_a_request_that_can_never_fit_is_rejected(tmp_path):
    p = write(tmp_path, [{"t": 0, "id": "A", "blocks": ["a1", "a2"], "out": 9}])
    o, result, _ = replay_step(p, capacity=5)     # ceil((8 + 9) / 4) = 5 > 4 usable
    assert o["A"].state == REJECTED and result.counts["rejected"] == 1


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(lines=random_traces([["c1", "c2", "c3", "c4"], ["d1", "d2"]], groups=("g", "h"),
                           max_out=12))
def test_random_traces_end_every_request_and_keep_every_invariant(tmp_path_factory, lines):
    p = write_lines(tmp_path_factory.mktemp("t"), lines)
    for cap in (6, 12, 40):
        o, result, _ = replay_step(p, capacity=cap, sched=SchedulerParams(
            max_num_batched_tokens=12, max_num_seqs=3))
        assert all(x.state in (COMPLETED, CANCELLED, DROPPED, REJECTED) for x in o.values())
        done = [x for x in o.values() if x.state == COMPLETED]
        assert all(x.ttft_ms is not None and x.ttft_ms > 0 for x in done)
        assert result.counts["admitted"] == sum(1 for x in o.values()
                                                if x.state in (COMPLETED, CANCELLED))


def test_explain_reconstructs_every_lookup_of_a_step_replay(tmp_path):
    """explain walks the ledger's allocation batches (prompt chunks, decode blocks) and
    finds each request's lookup hits where the replay found them."""
    from psgate import api
    from psgate.engines.step_cost import SchedulerParams
    from psgate.report.explain import explain_request

    out = tmp_path / "o"
    res = api.replay(api.ReplayConfig(baseline="lru", candidate="prefixshield", capacity=160,
                                      out=out, scheduler="step",
                                      sched=SchedulerParams(max_num_batched_tokens=512)))
    assert res.receipt["runs"]["candidate"]["counts"]["preemptions"] > 0
    checked = 0
    for rid in ("a5", "a40", "a52", "a60", "b7", "b20", "x30", "x70"):
        got = explain_request(out, rid)
        for run in ("baseline", "candidate"):
            r = got["runs"][run]
            if r["admitted"]:
                assert r["ledger_consistent"], (rid, run)
                checked += 1
    assert checked >= 8


def test_explain_finds_the_new_lookup_of_every_resumed_request(tmp_path):
    """A preempted request scheduled again looks its prefix up anew (vLLM resets its
    computed tokens); its ledger row says ``resumed``, and explain's reconstruction then
    agrees with the ledger on every request, including those whose content was evicted
    while they were preempted and recomputed when they resumed."""
    import csv

    from psgate import api
    from psgate.report.explain import explain_request
    from psgate.trace.writer import write_trace
    from psgate.workloads import generate

    trace = tmp_path / "s.jsonl"
    write_trace(trace, generate("sharegpt", {"seed": 3}))
    out = tmp_path / "o"
    res = api.replay(api.ReplayConfig(trace=str(trace), baseline="lru", candidate="lru",
                                      capacity=192, out=out, scheduler="step",
                                      allow_unexercised=True))
    assert res.receipt["runs"]["baseline"]["counts"]["preemptions"] > 10
    with open_text(out / "ledger.compact.csv.gz") as f:
        resumed = {r["request"] for r in csv.DictReader(f)
                   if r["run"] == "baseline" and '"resumed"' in r["rank"]}
    assert len(resumed) > 5
    # Every resumed request, and a few after them (a reconstruction that missed a
    # recompute would disagree with the ledger on a later lookup of that content).
    with open(out / "requests.csv", newline="") as f:
        ids = sorted({r["id"] for r in csv.DictReader(f) if r["run"] == "baseline"})
    sample = sorted(resumed)[:12] + ids[-12:]
    bad = [(rid, run) for rid in sample
           for run, r in explain_request(out, rid)["runs"].items()
           if r["admitted"] and not r["ledger_consistent"]]
    assert bad == []
    # explain says when each resumed request was preempted, by whom, and what it lost; the
    # counts are requests.csv's
    with open(out / "requests.csv", newline="") as f:
        rows = {r["id"]: r for r in csv.DictReader(f) if r["run"] == "baseline"}
    for rid in sorted(resumed)[:3]:
        p = explain_request(out, rid)["runs"]["baseline"]["preempted"]
        assert p["preemptions"] == int(rows[rid]["preemptions"]) == len(p["events"]) > 0
        assert p["recompute_tokens"] == int(rows[rid]["preempt_recompute_tokens"])
        assert all(e["lost_tokens"] > 0 and e["by"] in rows for e in p["events"])


def test_output_block_keys_stay_out_of_prefixshield_hash_slots(tmp_path):
    """A block of generated tokens has a key whose low bits index no trace hash; the
    policy's per-hash arrays must not grow to that index (it would take gigabytes)."""
    from psgate.policy.history import OPAQUE_KEYS_FROM
    from psgate.trace.keys import OUTPUT_KEY_BIT

    assert OPAQUE_KEYS_FROM == OUTPUT_KEY_BIT
    p = write(tmp_path, [{"t": i * 0.01, "id": f"r{i}", "group": "g" if i % 2 else "h",
                          "blocks": ["c1", f"d{i:x}"], "tail": 1, "out": 9}
                         for i in range(60)])
    hashes = HashTable()
    header, summary = validate_trace(str(p), hashes)
    policy = make_policy("prefixshield")
    engine = StepSimEngine(header=header, hashes=hashes, capacity=12, policy=policy,
                           contracts=CONTRACTS, done_ids=summary.done_ids, trace_path=str(p),
                           groups=summary.groups, step_cost=ONE_MS)
    with TraceReader(TraceSource(str(p), p), hashes) as reader:
        result = engine.run(reader.events())
    assert result.evictions > 0 and result.aborted is None
    assert len(policy.history.slot_ns) <= 4 * len(hashes.names) + 64


@pytest.mark.parametrize("answered", [True, False])
def test_a_follow_up_hits_the_blocks_cached_while_the_answer_decoded(tmp_path, answered):
    # A: a1 and a tail of 2, 8 out. Its tail block and the next fill with output and are
    # cached as they fill: blocks 2 and 3 (1 is a1; 4 holds its last, uncomputed token).
    # With its answer they hold e1 and e2; B re-sends a1 e1 e2 and hits all three, on the
    # blocks A's decode cached. Without it they are A's alone, and B hits a1 only.
    a = {"t": 0, "id": "A", "blocks": ["a1"], "tail": 2, "out": 8}
    if answered:
        a["answer"] = ["e1", "e2"]
    p = write(tmp_path, [a, {"t": 0.05, "id": "B", "blocks": ["a1", "e1", "e2", "b1"],
                             "tail": 1, "out": 1}])
    o, result, log = replay_step(p, capacity=12, log=HitLog())
    assert t0(o["A"].release_ns) == 8
    if answered:
        assert o["B"].cached_tokens == 12
        assert [r[2:] for r in log.hit_rows] == [(0, 1, "a1", "g"), (1, 2, "e1", "g"),
                                                  (2, 3, "e2", "g")]
    else:
        assert o["B"].cached_tokens == 4 and [r[2:5] for r in log.hit_rows] == [(0, 1, "a1")]
