"""A replay's memory follows what is in flight, not the trace's length: per-request results
stream to requests.csv's scratch part and to running aggregates, and the bytes written are
those the in-memory path wrote."""

from __future__ import annotations

import csv
import io
import json
import math
import random
import subprocess
import sys
from array import array
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from psgate import api
from psgate.bench.memory import child_env
from psgate.bench.suite import GROUP_BYTES_TARGET
from psgate.bench.traces import INSTANT, write_tenants_trace, write_tiny_trace
from psgate.engines.results import (CANCELLED, COMPLETED, DROPPED, REJECTED, UNFINISHED,
                                    RequestOutcome, Tee)
from psgate.engines import engine_class
from psgate.engines.sim import SimEngine
from psgate.engines.step_cost import StepCostModel
from psgate.errors import InputError
from psgate.policies import make_policy
from psgate.receipt.ledger import RequestSpool, write_requests
from psgate.receipt.row_text import fmt_f, fmt_t
from psgate.stats import metrics
from psgate.stats.metrics import MetricsAccumulator, kth_smallest, nearest_rank, summarize
from psgate.trace.importers import import_trace
from psgate.trace.reader import HashTable, TraceReader, TraceSource, validate_trace

from helpers import traced_peak

CONTRACTS = ("critical", "standard", "best-effort")
INSTANT_STEPS = StepCostModel(0.0, 0.0, 0.0, 0.0, 0.0)     # each step one nanosecond
MOONCAKE_HEAD = Path(__file__).resolve().parents[2] / "examples/traces/" \
    "mooncake_conversation_head.jsonl"


# -- memory per request -------------------------------------------------------------------
@pytest.mark.parametrize("scheduler", ["step", "service"])
def test_replay_memory_per_request_does_not_grow_with_the_trace(tmp_path, scheduler):
    """Peak traced memory of a whole replay (validation, two runs, ledger, requests.csv,
    receipt) on 8,000 tiny requests over 2,000: under 300 bytes per extra request (keeping
    every request's results took over 1,000). Steps take no modeled time here, as the
    service model's prefills take none: under the default step costs this trace saturates
    the instance, and the waiting queue, hence memory, grows with the trace (about 1,000
    requests in flight at 8,000 against 350 at 2,000: 346 bytes per extra request)."""
    def replay(trace: Path):
        return lambda: api.replay(api.ReplayConfig(
            trace=str(trace), baseline="lru", candidate="prefixshield", capacity=256,
            out=tmp_path / "out", force=True, cost=INSTANT, step_cost=INSTANT_STEPS,
            contracts=CONTRACTS, scheduler=scheduler))

    small, large = tmp_path / "small.jsonl", tmp_path / "large.jsonl"
    write_tiny_trace(small, 2_000)
    write_tiny_trace(large, 8_000)
    replay(small)()                   # imports and caches, outside the measurement
    peaks = [traced_peak(replay(small)), traced_peak(replay(large))]
    per_request = (peaks[1] - peaks[0]) / 6_000
    assert per_request < 300, per_request


def test_prefixshield_debt_heap_stays_bounded_while_tenants_stay_in_debt(tmp_path):
    """Every charge of a bucket in debt pushes its new clearing time; the entry it replaces
    stays in the heap until time reaches it, which for a tenant charged by every request
    is never. The heap is compacted: at most two entries per bucket and a fixed slack,
    however long the trace (uncompacted, 6,000 tiny requests left 592 entries for 4 buckets)."""
    from psgate.policy.buckets import ZHEAP_SLACK
    path = tmp_path / "tiny.jsonl"
    write_tiny_trace(path, 6_000)
    header, summary, hashes, events = _loaded(path)
    pol = make_policy("prefixshield")
    most = {"len": 0, "charges": 0}
    end = pol.end_admit          # charges the bucket (in Python, or in the compiled view)

    def counted(req, now_ns):
        note = end(req, now_ns)
        most["len"] = max(most["len"], len(pol.buckets.zheap))
        most["charges"] += note["charged"] > 0
        return note

    pol.end_admit = counted
    # the step scheduler caches each request's full output block: a new block, charged
    engine_class("sim", "step")(
        header=header, hashes=hashes, capacity=256, policy=pol, contracts=CONTRACTS,
        done_ids=summary.done_ids, cost=INSTANT, step_cost=INSTANT_STEPS,
        groups=summary.groups).run(events)
    assert most["charges"] > 1_000
    assert 0 < most["len"] <= 2 * len(pol.buckets.B) + ZHEAP_SLACK + 1, most


def _loaded(path: Path):
    hashes = HashTable()
    header, summary = validate_trace(str(path), hashes)
    with TraceReader(TraceSource(str(path), path), hashes, validated=summary) as r:
        events = list(r.events())
    return header, summary, hashes, events


def test_streaming_engine_keeps_a_few_bytes_per_finished_request(tmp_path):
    """The sim replay pass alone, outcomes streamed: under 64 bytes per extra request (the
    row's place in the scratch file and its latency), and no finished request's id kept."""
    sizes = (4_000, 16_000)      # both past the row buffer's first flush
    loaded = []
    for n in sizes:
        path = tmp_path / f"t{n}.jsonl"
        write_tiny_trace(path, n)
        loaded.append(_loaded(path))
    peaks, engines = [], []
    for i, (header, summary, hashes, events) in enumerate(loaded):
        def run():
            engine = SimEngine(header=header, hashes=hashes, capacity=256,
                               policy=make_policy("lru"), contracts=CONTRACTS,
                               done_ids=summary.done_ids, cost=INSTANT, groups=summary.groups,
                               sink=Tee(MetricsAccumulator(),
                                        RequestSpool(tmp_path / f"spool{i}", "run", "lru")))
            result = engine.run(events)
            assert result.requests == []
            engines.append(engine)
        peaks.append(traced_peak(run))
    per_request = (peaks[1] - peaks[0]) / (sizes[1] - sizes[0])
    assert per_request < 64, per_request
    assert not engines[-1].reqs        # ids of finished requests are forgotten


def test_finished_ids_are_forgotten_and_late_events_still_counted(tmp_path):
    path = tmp_path / "late.jsonl"
    req = ('{{"t":{t},"op":"request","id":"{id}","group":"g","contract":"standard",'
           '"scope":"m","blocks":[],"tail":2,"out":1}}\n')
    path.write_text('{"psgate_trace":1,"block_size":4}\n'
                    + req.format(t=0, id="a")
                    + '{"t":5,"op":"cancel","id":"a"}\n'          # a completed long before
                    + req.format(t=6, id="b")
                    + '{"t":6.5,"op":"cancel","id":"b"}\n'        # b cancelled while running
                    + '{"t":7,"op":"done","id":"b"}\n')           # so its done comes late
    header, summary, hashes, events = _loaded(path)
    engine = SimEngine(header=header, hashes=hashes, capacity=16, policy=make_policy("lru"),
                       contracts=CONTRACTS, done_ids=summary.done_ids, groups=summary.groups)
    result = engine.run(events)
    assert result.counts["late_cancels"] == 1 and result.counts["late_dones"] == 1
    assert {o.id: o.state for o in result.requests} == {"a": COMPLETED, "b": CANCELLED}
    assert engine.reqs == {}


# -- requests.csv: streamed bytes are the in-memory bytes -------------------------------
def _reference_requests_csv(runs) -> bytes:
    """requests.csv as csv.writer writes it from outcomes held in memory, row by row with
    its "\r\n" terminator (so that a lone carriage return is quoted too) turned into
    "\n"."""
    lines = []

    def writerow(row) -> None:
        buf = io.StringIO(newline="")
        csv.writer(buf, lineterminator="\r\n").writerow(row)
        lines.append(buf.getvalue()[:-2] + "\n")

    writerow(["run", "policy", "id", "group", "contract", "role", "measure", "state", "t",
              "prompt_tokens", "cached_tokens", "new_blocks", "recompute_tokens", "waited",
              "wait_ms", "queue_ms", "prefill_ms", "ttft_ms", "done_t", "preemptions",
              "preempt_recompute_tokens"])
    for label, policy, outcomes in runs:
        for o in sorted(outcomes, key=lambda o: (o.t_ns, o.id)):
            writerow([label, policy, o.id, o.group, o.contract, o.role or "",
                      int(o.measure), o.state, fmt_t(o.t_ns), o.prompt_tokens,
                      o.cached_tokens, o.new_blocks, o.recompute_tokens, int(o.waited),
                      fmt_f(o.wait_ms, 3), fmt_f(o.queue_ms, 3), fmt_f(o.prefill_ms, 3),
                      fmt_f(o.ttft_ms, 3), fmt_t(o.release_ns), o.preemptions,
                      o.preempt_recompute_tokens])
    return "".join(lines).encode()


_TEXT = st.text(alphabet=st.sampled_from(list('ab,"\n\r xé\u2603')), min_size=1, max_size=6)
_STATES = (COMPLETED, CANCELLED, DROPPED, REJECTED, UNFINISHED)


@st.composite
def _outcomes(draw):
    n = draw(st.integers(0, 30))
    ids = draw(st.lists(_TEXT, min_size=n, max_size=n, unique=True))
    t, out = 0, []
    for i, rid in enumerate(ids):
        t += draw(st.sampled_from([0, 0, 1, 1_500_000_001]))
        ttft = draw(st.one_of(st.none(), st.floats(0, 1e4)))
        out.append(RequestOutcome(
            id=rid, group=draw(_TEXT), contract="standard",
            role=draw(st.one_of(st.none(), _TEXT)), measure=draw(st.booleans()),
            state=draw(st.sampled_from(_STATES)), t_ns=t, prompt_tokens=draw(st.integers(1, 99)),
            cached_tokens=draw(st.integers(0, 50)), new_blocks=draw(st.integers(0, 9)),
            ttft_ms=ttft, prefill_ms=draw(st.one_of(st.none(), st.floats(0, 1e3))),
            queue_ms=ttft, release_ns=draw(st.one_of(st.none(), st.integers(t, t + 10**10))),
            waited=draw(st.booleans()), wait_ms=draw(st.floats(0, 1e3)),
            preemptions=draw(st.integers(0, 3)),
            preempt_recompute_tokens=draw(st.integers(0, 2**40))))
    # finish order differs from arrival order; some never finish (an aborted run)
    finished = draw(st.permutations(list(range(n))))
    finished = finished[:draw(st.integers(0, n))] if draw(st.booleans()) else finished
    return out, finished


@settings(max_examples=60, deadline=None)
@given(_outcomes(), _outcomes())
def test_streamed_requests_csv_is_byte_identical(tmp_path_factory, run_a, run_b):
    tmp = tmp_path_factory.mktemp("spool")
    spools, kept = [], []
    for (outcomes, finished), label in ((run_a, "baseline"), (run_b, "candidate,x")):
        spool = RequestSpool(tmp / f"{len(spools)}.part", label, "lru")
        for i in finished:
            spool.add(outcomes[i], i)
        spools.append(spool)
        kept.append((label, "lru", [outcomes[i] for i in finished]))
    write_requests(tmp / "requests.csv", spools)
    assert (tmp / "requests.csv").read_bytes() == _reference_requests_csv(kept)
    write_requests(tmp / "again.csv", kept)          # the in-memory form writes the same
    assert (tmp / "again.csv").read_bytes() == _reference_requests_csv(kept)
    assert sorted(p.name for p in tmp.iterdir()) == ["again.csv", "requests.csv"]


# -- metrics: streamed aggregates are the list's -------------------------------------------
def _reference_percentiles(outcomes):
    ttft = sorted(o.ttft_ms for o in outcomes if o.measure and o.counts_for_hits
                  and o.ttft_ms is not None)
    return nearest_rank(ttft, 50), nearest_rank(ttft, 95)


@settings(max_examples=100, deadline=None)
@given(_outcomes())
def test_streamed_metrics_match_the_list(run):
    outcomes, finished = run
    in_order = [outcomes[i] for i in finished]
    acc = MetricsAccumulator()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(metrics._Values, "CHUNK", 3)      # many sorted chunks per scope
        for i in finished:
            acc.add(outcomes[i], i)
    totals = acc.totals_summary(None)
    assert totals == summarize(in_order, None)
    measured = [o for o in in_order if o.measure and o.counts_for_hits]
    frac = 0.0
    for o in measured:
        frac += o.cached_tokens / o.prompt_tokens
    wait = 0.0
    for o in in_order:
        if o.waited:
            wait += o.wait_ms
    assert totals["requests"] == len(in_order)
    assert totals["measured_requests"] == len(measured)
    assert totals["hit_fraction"] == (round(frac / len(measured), 6) if measured else None)
    assert totals["wait_ms_total"] == round(wait, 3)
    assert totals["hit_requests"] == sum(1 for o in measured if o.cached_tokens > 0)
    p50, p95 = _reference_percentiles(in_order)
    assert totals["ttft_p50_ms"] == (None if p50 is None else round(p50, 3))
    assert totals["ttft_p95_ms"] == (None if p95 is None else round(p95, 3))
    for g in {o.group for o in in_order}:
        members = [o for o in in_order if o.group == g]
        p50, p95 = _reference_percentiles(members)
        got = acc.group_summary(g, None)
        assert got["requests"] == len(members)
        assert got["ttft_p50_ms"] == (None if p50 is None else round(p50, 3))
        assert got["ttft_p95_ms"] == (None if p95 is None else round(p95, 3))


def test_kth_smallest_is_the_merged_sort():
    rng = random.Random(7)
    for _ in range(300):
        runs = [array("d", sorted(rng.choice([0.5, 1.0, 2.0, rng.random()])
                                  for _ in range(rng.randrange(0, 9))))
                for _ in range(rng.randrange(1, 6))]
        merged = sorted(x for r in runs for x in r)
        for k in range(1, len(merged) + 1):
            assert kth_smallest(runs, k) == merged[k - 1]
        if merged:
            rank = max(1, math.ceil(0.95 * len(merged)))
            assert kth_smallest(runs, rank) == nearest_rank(merged, 95)


# -- memory per tenant ---------------------------------------------------------------------
def test_replay_memory_per_tenant_is_linear(tmp_path):
    """Peak traced memory of a replay (lru against prefixshield, capacity 256, so tenants
    evict each other) at 500 and at 3,000 tenants of two requests each: under
    GROUP_BYTES_TARGET per extra tenant. A requester-by-owner table of evictions, dense, was
    8 bytes x tenants for each tenant in each run: about 100 KB per tenant here."""
    def replay(trace: Path):
        return lambda: api.replay(api.ReplayConfig(
            trace=str(trace), baseline="lru", candidate="prefixshield", capacity=256,
            out=tmp_path / "out", force=True, cost=INSTANT, step_cost=INSTANT_STEPS,
            contracts=CONTRACTS))

    few, many = tmp_path / "few.jsonl", tmp_path / "many.jsonl"
    write_tenants_trace(few, 500)
    write_tenants_trace(many, 3_000)
    replay(few)()
    peaks = [traced_peak(replay(few)), traced_peak(replay(many))]
    per_tenant = (peaks[1] - peaks[0]) / 2_500
    assert per_tenant < GROUP_BYTES_TARGET, per_tenant


def test_fifty_thousand_tenants_replay_within_the_stated_bound(tmp_path):
    """The scale limit (docs/reference/limits.md), measured: a replay of 50,000 tenants (100,000 two-block
    requests; lru against prefixshield) peaks under 150 MB + GROUP_BYTES_TARGET per tenant
    of resident memory, in a fresh process. Quadratic, 50,000 tenants passed 23 GB."""
    many = tmp_path / "many.jsonl"
    write_tenants_trace(many, 50_000)
    proc = subprocess.run([sys.executable, "-m", "psgate.bench", "--requests-memory-child",
                           str(many), str(tmp_path / "out")], capture_output=True, text=True,
                          env=child_env(), timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    peak = json.loads(proc.stdout)["peak_rss"]
    if peak is None:
        pytest.skip("no peak RSS on this platform (/proc/self/status)")
    assert peak < 150e6 + GROUP_BYTES_TARGET * 50_000, peak


# -- importer output cap -------------------------------------------------------------------
def test_import_stops_at_the_output_cap_naming_it():
    with pytest.raises(InputError) as exc:
        import_trace("mooncake", MOONCAKE_HEAD, block_size=1, max_output_bytes=10_000_000)
    assert "max_output_bytes" in str(exc.value)
    # a cap shapes no content: an import under it is the import without it
    capped = import_trace("mooncake", MOONCAKE_HEAD, block_size=256,
                          max_output_bytes=100_000_000)
    assert capped == import_trace("mooncake", MOONCAKE_HEAD, block_size=256)
    assert "max_output_bytes" not in capped[0]["import"]["options"]


def test_import_limit_counts_only_the_kept_requests_against_the_cap():
    """The cap's message offers --option limit=N: the limit must bring an import under it.
    Only the kept requests are hashed, and they get the hashes of a whole-file import."""
    cap = 2_000_000          # the head's first 20 requests fit (0.6 MB), the whole head not (9.3 MB)
    with pytest.raises(InputError):
        import_trace("mooncake", MOONCAKE_HEAD, block_size=16, max_output_bytes=cap)
    head = import_trace("mooncake", MOONCAKE_HEAD, block_size=16, limit=20,
                        max_output_bytes=cap)
    whole = import_trace("mooncake", MOONCAKE_HEAD, block_size=16)
    assert len(head) == 21 and head[1:] == whole[1:21]
    assert sum(len(x["blocks"]) for x in head[1:]) * 35 <= cap


def test_import_cli_exit_2_at_the_cap(tmp_path):
    out = tmp_path / "mc.jsonl"
    proc = subprocess.run([sys.executable, "-m", "psgate", "trace", "import",
                           str(MOONCAKE_HEAD), "--format", "mooncake", "--block-size", "1",
                           "--option", "max_output_bytes=1000000", "-o", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert "max_output_bytes" in proc.stderr and "Traceback" not in proc.stderr
    assert not out.exists()
