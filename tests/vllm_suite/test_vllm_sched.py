"""--engine vllm-sched: vLLM's own Scheduler on the modeled step clock, on tiny traces whose
every step is worked out by hand (block size 16, a few blocks), so each test pins one
behaviour of vLLM's scheduler that the service model does not have."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import vllm
from psgate.engines import engine_class
from psgate.engines.results import CANCELLED, COMPLETED, DROPPED, REJECTED
from psgate.engines.step_cost import SchedulerParams, StepCostModel, StepWork
from psgate.engines.vllm_sched import step_trace
from psgate.errors import InputError
from psgate.policies import make_policy
from psgate.trace.reader import HashTable, TraceReader, TraceSource, validate_trace

from helpers import CONTRACTS, EventLog, write

ROOT = Path(__file__).resolve().parents[2]
BS = 16
MS = 1_000_000


def h(label: str) -> str:
    return hashlib.sha256(label.encode()).hexdigest()[:16]


class Ledger(EventLog):
    """The ledger rows an engine writes, with their times and names."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[tuple] = []

    def eviction(self, now_ns, req, decision, block, hash_name, owner) -> None:
        super().eviction(now_ns, req, decision, block, hash_name, owner)
        self.rows.append(("evict", now_ns, req.id, hash_name, owner))

    def admission(self, now_ns, req, hits, allocated, new_blocks, note) -> None:
        super().admission(now_ns, req, hits, allocated, new_blocks, note)
        self.rows.append(("admit", now_ns, req.id, hits, allocated, new_blocks))


def replay(tmp_path: Path, events, capacity: int, policy: str = "lru",
           sched: SchedulerParams | None = None):
    """Replay events (block size 16) through vllm-sched, paranoid; every hard invariant
    must hold. Returns (outcomes by id, counts, ledger); the ledger's ``steps`` are the
    run's step_trace."""
    path = write(tmp_path, events, block_size=BS)
    hashes = HashTable()
    header, summary = validate_trace(str(path), hashes)
    log = Ledger()
    engine = engine_class("vllm-sched")(
        header=header, hashes=hashes, capacity=capacity, policy=make_policy(policy),
        contracts=CONTRACTS, done_ids=summary.done_ids, recorder=log, paranoid=True,
        trace_path=str(path), groups=summary.groups, step_cost=StepCostModel(),
        sched=sched or SchedulerParams())
    engine.step_log = []
    with TraceReader(TraceSource(str(path), path), hashes) as reader:
        result = engine.run(reader.events())
    log.steps = step_trace(engine)
    assert result.aborted is None, result.aborted
    assert all(v.holds for v in result.invariants.values()), result.invariants
    assert result.invariants["capacity_and_accounting"].checks > 0 or not result.counts["admitted"]
    return {o.id: o for o in result.requests}, result.counts, log


def step_ns(prefill=0, context=0, decodes=0, decode_context=0) -> int:
    return StepCostModel().step_ns(StepWork(prefill, context, decodes, decode_context))


def test_a_waiting_request_is_looked_up_when_first_scheduled_and_ttft_is_step_ends(tmp_path):
    """a's 64-token prompt takes two 32-token chunks; b (same four blocks) arrives during
    the first, when two of them are cached, and waits for budget. vLLM looks b up when it
    first schedules it (scheduler.py:955-962), by then all four are cached: 64 tokens hit,
    not the 32 a lookup at arrival would find. Each TTFT is a step end of the cost model."""
    blocks = [h(f"a{i}") for i in range(4)]
    out, counts, log = replay(tmp_path, [
        {"t": 0.0, "id": "a", "blocks": blocks, "tail": 0, "out": 2},
        {"t": 0.001, "id": "b", "blocks": blocks, "tail": 4, "out": 1}],
        capacity=16, sched=SchedulerParams(max_num_batched_tokens=32, max_num_seqs=4))
    s1 = step_ns(prefill=32)                                   # a: tokens 0-31
    s2 = step_ns(prefill=32, context=32)                       # a: tokens 32-63, 1st token
    s3 = step_ns(prefill=4, context=64, decodes=1, decode_context=64)   # b's 4 + a's decode
    assert (s1, s2, s3) == (11_920_000, 11_984_000, 10_468_000)    # by hand, default costs
    a, b = out["a"], out["b"]
    assert a.ttft_ms == (s1 + s2) / MS and a.prefill_ms == (s1 + s2) / MS
    assert b.cached_tokens == 64 and b.new_blocks == 0
    assert b.queue_ms == (s1 + s2 - 1 * MS) / MS and b.waited
    assert b.ttft_ms == (s1 + s2 + s3 - 1 * MS) / MS
    assert a.release_ns == b.release_ns == s1 + s2 + s3
    assert a.state == b.state == COMPLETED
    assert counts["steps"] == 3 and counts["waits"] == 1 and counts["preemptions"] == 0
    assert [(t0, t1, scheduled) for t0, t1, _, scheduled, _ in log.steps] == [
        (0, s1, (("a", 32),)), (s1, s1 + s2, (("a", 32),)),
        (s1 + s2, s1 + s2 + s3, (("a", 1), ("b", 4)))]
    # (request, hits, blocks allocated, full blocks newly cached) per allocation batch: a's
    # two chunks cache two blocks each, its decode takes a fifth block, b hits four.
    assert log.rows == [("admit", 0, "a", 0, 2, 2), ("admit", s1, "a", 0, 2, 2),
                        ("admit", s1 + s2, "a", 0, 1, 0), ("admit", s1 + s2, "b", 4, 1, 0)]


def test_chunked_prefill_splits_a_prompt_under_the_token_budget(tmp_path):
    """An 88-token prompt under a 32-token budget runs as chunks of 32, 32 and 24 tokens,
    each attending to the chunks before it; without chunked prefill vLLM requires
    max_model_len <= max_num_batched_tokens, so the same request is rejected."""
    blocks = [h(f"c{i}") for i in range(5)]
    ev = [{"t": 0.0, "id": "c", "blocks": blocks, "tail": 8, "out": 1}]
    out, counts, log = replay(tmp_path, ev, capacity=12,
                              sched=SchedulerParams(max_num_batched_tokens=32, max_num_seqs=4))
    steps = [step_ns(prefill=32), step_ns(prefill=32, context=32),
             step_ns(prefill=24, context=64)]
    assert out["c"].ttft_ms == sum(steps) / MS and counts["steps"] == 3
    assert [r[1:] for r in log.rows] == [(0, "c", 0, 2, 2), (steps[0], "c", 0, 2, 2),
                                         (steps[0] + steps[1], "c", 0, 2, 1)]
    out, counts, _ = replay(tmp_path, ev, capacity=12, sched=SchedulerParams(
        max_num_batched_tokens=64, max_num_seqs=4, enable_chunked_prefill=False))
    assert out["c"].state == REJECTED and counts["rejected"] == 1


def test_a_decode_without_a_free_block_preempts_the_last_running_request(tmp_path):
    """Seven usable blocks, a (3 blocks) and b (2) decoding 20 tokens each. When a needs its
    fifth block none is free and none cached is unpinned: vLLM preempts running[-1], b
    (scheduler.py:792-812), whose cached blocks become candidates; a evicts b's last one (a
    block of generated tokens, named ""). b resumes once a completes, re-hitting its own
    cached blocks, generated tokens included, and recomputes the rest."""
    a_blocks, b_blocks = [h("a0"), h("a1")], [h("b0")]
    out, counts, log = replay(tmp_path, [
        {"t": 0.0, "id": "a", "blocks": a_blocks, "tail": 15, "out": 20},
        {"t": 0.0, "id": "b", "blocks": b_blocks, "tail": 15, "out": 20}], capacity=8)
    a, b = out["a"], out["b"]
    assert (a.preemptions, b.preemptions, counts["preemptions"]) == (0, 1, 1)
    assert [s[4] for s in log.steps if s[4]] == [("b",)]
    assert a.state == b.state == COMPLETED
    assert b.cached_tokens == 0               # what its first scheduling found
    evictions = [r for r in log.rows if r[0] == "evict"]
    assert evictions[0][2:] == ("a", "", "g")
    b_batches = [r for r in log.rows if r[0] == "admit" and r[2] == "b"]
    resumed = next(r for r in b_batches if r[3] > 0)        # the first batch with hits
    assert resumed[1] == a.release_ns          # scheduled in the step after a finished
    assert resumed[3] == 2 > len(b_blocks)     # its prompt block and an output block
    assert b.release_ns > a.release_ns


def test_the_same_replay_twice_gives_the_same_outcomes_and_rows(tmp_path):
    """Two groups, shared prefixes, a preemption and a cancel: nothing in the run depends
    on the wall clock or on set order."""
    events = [{"t": 0.001 * i, "id": f"r{i}", "group": "g" if i % 2 else "h",
               "blocks": [h(f"p{i % 3}-{j}") for j in range(1 + i % 3)], "tail": 7 + i,
               "out": 12 + 3 * i} for i in range(6)]
    events.append({"t": 0.03, "op": "cancel", "id": "r4"})
    runs = []
    for i in range(2):
        d = tmp_path / str(i)
        d.mkdir()
        out, counts, log = replay(d, events, capacity=8)
        runs.append(([dataclasses.astuple(o) for o in out.values()], counts, log.rows,
                     log.steps))
    assert runs[0] == runs[1]
    counts = runs[0][1]
    assert counts["preemptions"] > 0 and counts["cancelled"] + counts["dropped"] == 1


def test_cancel_of_a_waiting_request_leaves_nothing_cached(tmp_path):
    """With one sequence slot b waits behind a; cancelled while waiting, it was never
    looked up nor allocated (dropped), so c with b's blocks finds none. A request cancelled
    while running keeps its full prompt blocks cached: e hits both of d's."""
    b_blocks, d_blocks = [h("b0"), h("b1")], [h("d0"), h("d1")]
    out, counts, log = replay(tmp_path, [
        {"t": 0.0, "id": "a", "blocks": [h("a0")], "tail": 3, "out": 10},
        {"t": 0.001, "id": "b", "blocks": b_blocks, "tail": 0, "out": 1},
        {"t": 0.005, "op": "cancel", "id": "b"},
        {"t": 1.0, "id": "c", "blocks": b_blocks, "tail": 1, "out": 1},
        {"t": 2.0, "id": "d", "blocks": d_blocks, "tail": 1, "out": 50},
        {"t": 2.05, "op": "cancel", "id": "d"},
        {"t": 3.0, "id": "e", "blocks": d_blocks, "tail": 1, "out": 1}],
        capacity=16, sched=SchedulerParams(max_num_seqs=1, max_num_batched_tokens=64))
    assert out["b"].state == DROPPED and out["b"].ttft_ms is None
    assert not [r for r in log.rows if r[2] == "b"]
    assert out["c"].cached_tokens == 0
    d = out["d"]       # the cancel is delivered at the first step boundary after it
    assert d.state == CANCELLED and 2_050_000_000 <= d.release_ns < 2_050_000_000 + 11 * MS
    assert out["e"].cached_tokens == 32
    assert (counts["dropped"], counts["cancelled"]) == (1, 1)


def test_output_blocks_are_cached_and_evicted_with_an_empty_name(tmp_path):
    """a caches full blocks of its generated tokens (kv_cache_manager.py:612-616); freed in
    reverse (its tail first), they are LRU's first victims when b needs room: two eviction
    rows named "", a's prompt block survives and c still hits it (evicting b's last block,
    named by its trace hash)."""
    a0 = h("a0")
    out, counts, log = replay(tmp_path, [
        {"t": 0.0, "id": "a", "blocks": [a0], "tail": 8, "out": 30},
        {"t": 1.0, "id": "b", "blocks": [h("b0"), h("b1"), h("b2")], "tail": 0, "out": 1},
        {"t": 2.0, "id": "c", "blocks": [a0], "tail": 1, "out": 1}], capacity=5)
    evictions = [r for r in log.rows if r[0] == "evict"]
    assert [r[2:] for r in evictions] == [("b", "", "g"), ("b", "", "g"), ("c", h("b2"), "g")]
    assert [r[1] for r in evictions] == [1_000_000_000] * 2 + [2_000_000_000]  # step starts
    assert out["c"].cached_tokens == 16


def test_a_policy_vllm_cannot_run_is_bad_input(tmp_path):
    path = write(tmp_path, [{"t": 0.0, "id": "a", "blocks": [h("a")], "tail": 1}],
                 block_size=BS)
    hashes = HashTable()
    header, summary = validate_trace(str(path), hashes)
    with pytest.raises(InputError, match="admission control"):
        engine_class("vllm-sched")(header=header, hashes=hashes, capacity=8,
                                   policy=make_policy("static-quota"), contracts=CONTRACTS,
                                   done_ids=summary.done_ids, label="candidate",
                                   groups=summary.groups)


def test_cli_replay_through_vllm_sched_writes_a_receipt_naming_the_engine(tmp_path):
    lines = [{"psgate_trace": 1, "block_size": BS}]
    for i in range(12):
        group = "victim" if i % 3 == 0 else "flood"
        blocks = ([h(f"sys{j}") for j in range(3)] if group == "victim"
                  else [h(f"f{i}-{j}") for j in range(4)])
        lines.append({"t": round(0.02 * i, 3), "op": "request", "id": f"r{i}", "group": group,
                      "contract": "standard", "scope": "m", "blocks": blocks, "tail": 5,
                      "out": 3})
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps(x) + "\n" for x in lines))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    proc = subprocess.run([sys.executable, "-m", "psgate", "replay", "--engine", "vllm-sched",
                           "--trace", str(trace), "--capacity", "12", "--baseline", "lru",
                           "--candidate", "prefixshield", "--out", str(tmp_path / "o")],
                          capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    receipt = json.loads((tmp_path / "o" / "receipt.json").read_text())
    assert receipt["config"]["engine"] == "vllm-sched"
    assert receipt["config"]["engine_info"]["vllm"] == vllm.__version__
    assert receipt["gate"]["result"] == ("pass" if proc.returncode == 0 else "fail")
    runs = receipt["runs"]
    assert runs["baseline"]["counts"]["steps"] > 0
