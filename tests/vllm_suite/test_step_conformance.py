"""Conformance: sim's step scheduler against vllm-sched (vLLM's own Scheduler) per request
and per eviction, for every policy that can run live.

Both engines replay the same trace on the same modeled step clock; sim reimplements
``Scheduler.schedule`` over its own block pool, vllm-sched runs vLLM's. Agreement is
exact: each request's state, cached tokens, preemptions and the tokens it computed again
after them, modeled TTFT and release time,
every eviction (time, requesting request, victim block, its trace hash, its owner) and every
allocation batch's ledger row. A corpus must contain preemptions, evictions of output
blocks, cancellations and queueing (asserted by count), or agreement on it would prove
little.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from psgate.contracts import CONTRACT_NAMES
from psgate.engines import engine_class
from psgate.engines.sched import StepSimEngine
from psgate.engines.base import NullRecorder
from psgate.engines.step_cost import SchedulerParams, StepCostModel
from psgate.policies import make_policy, policy_names
from psgate.trace.importers import import_trace
from psgate.trace.reader import HashTable, TraceReader, TraceSource, validate_trace
from psgate.trace.writer import write_trace

from helpers import chat_traces, random_traces, shared_traces, write_lines
from test_vllm_pool import REAL, _window

LIVE = [n for n in policy_names() if not n.startswith("test-")
        and make_policy(n).work_conserving and not make_policy(n).needs_future]
NUM_TRACES = int(os.environ.get("PSGATE_STEP_TRACES", "60"))
# Steps cost 2 ms plus what they compute, so queueing, batching and context all move the
# clock and a wrong classification of a scheduled request shows in every later time.
COST = StepCostModel(fixed_ms=2.0, per_prefill_token_ms=0.05, per_context_token_ms=0.01,
                     per_decode_ms=0.3, per_decode_context_token_ms=0.001)
SCHED = SchedulerParams(max_num_batched_tokens=24, max_num_seqs=4)


class Rows(NullRecorder):
    """The ledger calls both engines make, as comparable tuples."""

    def __init__(self) -> None:
        self.evictions: list[tuple] = []
        self.admissions: list[tuple] = []

    def eviction(self, now_ns, req, decision, block, hash_name, owner) -> None:
        self.evictions.append((now_ns, req.id if req else None, block, hash_name, owner))

    def admission(self, now_ns, req, hits, allocated, new_blocks, note) -> None:
        # with whether the row marks a resumed request's new lookup (explain relies on it)
        self.admissions.append((now_ns, req.id, hits, allocated, new_blocks,
                                bool((note or {}).get("resumed"))))


def run(engine: str, path: Path, capacity: int, policy: str, sched: SchedulerParams):
    hashes = HashTable()
    header, summary = validate_trace(str(path), hashes)
    rows = Rows()
    cls = StepSimEngine if engine == "sim" else engine_class(engine)
    eng = cls(header=header, hashes=hashes, capacity=capacity, policy=make_policy(policy),
              contracts=CONTRACT_NAMES, done_ids=summary.done_ids, recorder=rows,
              paranoid=engine == "sim", trace_path=str(path), groups=summary.groups,
              step_cost=COST, sched=sched)
    with TraceReader(TraceSource(str(path), Path(path)), hashes) as reader:
        result = eng.run(reader.events())
    assert result.aborted is None, result.aborted
    assert all(v.holds for v in result.invariants.values()), result.invariants
    requests = {o.id: (o.state, o.cached_tokens, o.preemptions, o.ttft_ms, o.release_ns,
                       o.preempt_recompute_tokens) for o in result.requests}
    return result, requests, rows


def compare(path: Path, capacity: int, policy: str, counts: Counter,
            sched: SchedulerParams = SCHED) -> None:
    sim, sim_req, sim_rows = run("sim", path, capacity, policy, sched)
    ref, ref_req, ref_rows = run("vllm-sched", path, capacity, policy, sched)
    where = f"{path.name} capacity {capacity} {policy}"
    assert set(sim_req) == set(ref_req), where
    for rid in ref_req:
        assert sim_req[rid] == ref_req[rid], (where, rid, sim_req[rid], ref_req[rid])
    assert sim_rows.evictions == ref_rows.evictions, f"{where}: evictions differ"
    assert sim_rows.admissions == ref_rows.admissions, f"{where}: admission rows differ"
    shared = set(sim.counts) & set(ref.counts)
    assert {k: sim.counts[k] for k in shared} == {k: ref.counts[k] for k in shared}, where
    counts["traces"] += 1
    counts["evictions"] += sim.evictions
    counts["output_block_evictions"] += sum(1 for e in sim_rows.evictions if e[3] == "")
    counts["preemptions"] += sim.counts["preemptions"]
    counts["preempt_recompute_tokens"] += sum(v[5] for v in sim_req.values())
    counts["cancellations"] += sim.counts["cancelled"] + sim.counts["dropped"]
    counts["queued"] += sim.counts["waits"]
    counts["hit_tokens"] += sum(v[1] for v in sim_req.values())


def traces():
    """Random traces with long outputs (decode blocks, preemption) and cancellations."""
    chains = [["c1", "c2", "c3", "c4", "c5"], ["d1", "d2", "d3"], ["f1", "f2"]]
    return random_traces(chains, groups=("g", "g", "h"), max_requests=20,
                         gaps=(0, 0, 0.001, 0.004, 0.01, 0.05), cancel_one_in=8,
                         extra_name="e{i}{j}", extras_on_partial=False, max_out=14,
                         block_size=4)


@pytest.mark.parametrize("policy", LIVE)
def test_sim_and_vllm_sched_agree_on_generated_traces(tmp_path, policy):
    counts: Counter = Counter()

    @settings(max_examples=NUM_TRACES, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow,
                                     HealthCheck.function_scoped_fixture])
    @given(lines=traces(), capacity=st.integers(6, 20))
    def check(lines, capacity):
        compare(write_lines(tmp_path, lines), capacity, policy, counts)

    check()
    print(f"\n{policy}: {dict(counts)}")
    assert counts["traces"] >= NUM_TRACES
    for what in ("evictions", "output_block_evictions", "preemptions", "cancellations",
                 "queued"):
        assert counts[what] > 0, f"the generated corpus has no {what}: {dict(counts)}"


@pytest.mark.parametrize("policy", LIVE)
def test_sim_and_vllm_sched_agree_on_chat_with_answers(tmp_path, policy):
    """Multi-turn chat whose requests carry their answers: vLLM's scheduler decodes tokens
    whose blocks hash as the answer's (the tokens a later turn re-sends), so a follow-up
    turn hits the blocks cached while decoding; sim must hit exactly the same."""
    counts: Counter = Counter()

    @settings(max_examples=max(10, NUM_TRACES // 2), deadline=None, derandomize=True,
              database=None, suppress_health_check=[HealthCheck.too_slow,
                                                    HealthCheck.function_scoped_fixture])
    @given(lines=chat_traces(cancel_one_in=9), capacity=st.integers(8, 24))
    def check(lines, capacity):
        path = write_lines(tmp_path, lines)
        compare(path, capacity, policy, counts)
        # what the answers gave: the same trace without them, on sim
        bare = write_lines(tmp_path, [{k: v for k, v in x.items() if k != "answer"}
                                      for x in lines], "bare.jsonl")
        with_answers = run("sim", path, capacity, policy, SCHED)[1]
        without = run("sim", bare, capacity, policy, SCHED)[1]
        counts["answer_hit_tokens"] += (sum(v[1] for v in with_answers.values())
                                        - sum(v[1] for v in without.values()))

    check()
    print(f"\n{policy}: {dict(counts)}")
    assert counts["answer_hit_tokens"] > 0, dict(counts)
    for what in ("evictions", "preemptions", "cancellations", "queued"):
        assert counts[what] > 0, f"the chat corpus has no {what}: {dict(counts)}"


VARIANTS = {
    "no-chunking": SchedulerParams(max_num_batched_tokens=40, max_num_seqs=4,
                                   enable_chunked_prefill=False),
    "tight": SchedulerParams(max_num_batched_tokens=16, max_num_seqs=2,
                             long_prefill_token_threshold=8, watermark=0.15),
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("policy", ["lru", "prefixshield"])
def test_sim_and_vllm_sched_agree_under_other_scheduler_settings(tmp_path, policy, variant):
    counts: Counter = Counter()

    @settings(max_examples=max(10, NUM_TRACES // 3), deadline=None, derandomize=True,
              database=None, suppress_health_check=[HealthCheck.too_slow,
                                                    HealthCheck.function_scoped_fixture])
    @given(lines=traces(), capacity=st.integers(6, 20))
    def check(lines, capacity):
        compare(write_lines(tmp_path, lines), capacity, policy, counts,
                sched=VARIANTS[variant])

    check()
    print(f"\n{policy} {variant}: {dict(counts)}")
    assert counts["evictions"] > 0 and counts["queued"] > 0, dict(counts)


@pytest.mark.shared
@pytest.mark.parametrize("policy", LIVE)
def test_sim_and_vllm_sched_agree_on_real_trace_windows(tmp_path_factory, policy):
    d = tmp_path_factory.mktemp("real")
    counts: Counter = Counter()
    for name, (fmt, src, opts, n, caps) in REAL.items():
        src_path = shared_traces() / src
        if fmt == "weka":
            files = sorted(src_path.glob("*.json"))[::40]
            src_path = d / "weka-src"
            src_path.mkdir(exist_ok=True)
            for f in files:
                (src_path / f.name).write_bytes(f.read_bytes())
        p = d / f"{name}.jsonl"
        write_trace(p, _window(import_trace(fmt, src_path, **opts), min(n, 120)))
        for cap in caps:
            compare(p, cap, policy, counts,
                    sched=SchedulerParams(max_num_batched_tokens=2048, max_num_seqs=16))
    print(f"\n{policy}: {dict(counts)}")
    for what in ("evictions", "preemptions", "cancellations", "queued"):
        assert counts[what] > 0, f"the real-trace windows have no {what}: {dict(counts)}"


# Hybrid-attention models: a sliding window shorter than most prompts (4-token blocks: a
# hit needs a run of 2 or 3 cached blocks, and blocks leave the window while a prompt is
# still being computed), in both group orders, with vLLM's default sparse caching of
# sliding-window blocks (retention 0), periodic retention and dense caching; on the random
# traces and on multi-turn chat with answers (each turn re-sends the conversation).
HYBRID = {
    "full+sliding:6": ("full,sliding:6", 0),
    "sliding:9+full": ("sliding:9,full", 0),
    "full+sliding:6+sliding:10": ("full,sliding:6,sliding:10", 0),
    "full+sliding:6 retention 12": ("full,sliding:6", 12),
    "full+sliding:6 dense": ("full,sliding:6", None),
    "sliding:9+full dense": ("sliding:9,full", None),
}


@pytest.mark.parametrize("groups", sorted(HYBRID))
@pytest.mark.parametrize("policy", LIVE)
def test_sim_and_vllm_sched_agree_on_hybrid_models(tmp_path, policy, groups):
    counts: Counter = Counter()
    kv_groups, retention = HYBRID[groups]
    sched = SchedulerParams(max_num_batched_tokens=24, max_num_seqs=4, kv_groups=kv_groups,
                            prefix_cache_retention_interval=retention)

    @settings(max_examples=max(10, NUM_TRACES // 3), deadline=None, derandomize=True,
              database=None, suppress_health_check=[HealthCheck.too_slow,
                                                    HealthCheck.function_scoped_fixture])
    @given(lines=st.one_of(traces(), chat_traces(cancel_one_in=9)),
           capacity=st.integers(12, 40))
    def check(lines, capacity):
        compare(write_lines(tmp_path, lines), capacity, policy, counts, sched=sched)

    check()
    print(f"\n{policy} {groups}: {dict(counts)}")
    for what in ("evictions", "preemptions", "queued", "hit_tokens"):
        assert counts[what] > 0, f"the hybrid corpus has no {what}: {dict(counts)}"
