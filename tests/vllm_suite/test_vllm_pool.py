"""Conformance: sim against vllm-pool (vLLM's own KVCacheManager) for every policy.

The same policy object drives both engines; what differs is the block pool. Each
corpus must contain evictions, admission waits, cancellations and last-block
recomputes (asserted by count), or agreement on it would prove little.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import vllm
from psgate.policies import policy_names
from psgate.trace.importers import import_trace
from psgate.trace.writer import write_trace

from helpers import replay_file, shared_traces, write_lines
from test_differential import traces

POLICIES = [n for n in policy_names() if not n.startswith("test-")]
NUM_TRACES = int(os.environ.get("PSGATE_DIFF_TRACES", "200"))


def test_vllm_version_is_the_supported_one():
    assert vllm.__version__.startswith("0.32.")


def test_vllm_pool_receipt_names_vllm_verifies_and_equals_sim(tmp_path):
    """The bundled example through vllm-pool: the receipt names vLLM, psgate verify
    reproduces it byte for byte, and its ledgers equal sim's."""
    from psgate import api
    from psgate.report.verify import verify
    pool = api.replay(api.ReplayConfig(engine="vllm-pool", candidate="prefixshield",
                                       out=tmp_path / "pool"))
    sim = api.replay(api.ReplayConfig(candidate="prefixshield", scheduler="service",
                                      out=tmp_path / "sim"))     # the model vllm-pool runs
    assert pool.receipt["config"]["engine_info"] == {"vllm": vllm.__version__}
    assert "engine_info" not in sim.receipt["config"]
    assert verify(tmp_path / "pool").identical
    for name in ("ledger.compact.csv.gz", "requests.csv"):
        assert (tmp_path / "pool" / name).read_bytes() == (tmp_path / "sim" / name).read_bytes()


def _observed(result, log):
    requests = {o.id: (o.state, o.cached_tokens, o.recompute_tokens, o.ttft_ms, o.release_ns)
                for o in result.requests}
    return requests, log.evictions, log.victims, log.block_ids


def _count_duplicates(engine, log):
    """Wrap the admission tail to count last-block recomputes: a block cached while
    another block already holds the same content."""
    admitted = engine.admitted
    log.duplicates = 0

    def spy(r, hits, new, cached_now, *rest):
        admitted(r, hits, new, cached_now, *rest)
        log.duplicates += sum(1 for _, k in cached_now if engine.checker.copies(k) > 1)

    engine.admitted = spy


def compare(path: Path, capacity: int, policy: str, counts: Counter) -> None:
    sim, sim_log, _ = replay_file(path, capacity, policy=policy, setup=_count_duplicates)
    pool, pool_log, _ = replay_file(path, capacity, policy=policy, engine="vllm-pool",
                                    paranoid=True)
    assert sim.aborted is None and pool.aborted is None, (sim.aborted, pool.aborted)
    assert all(v.holds for v in pool.invariants.values()), pool.invariants
    want, got = _observed(sim, sim_log), _observed(pool, pool_log)
    for what, a, b in zip(("requests", "evictions", "victim blocks", "block ids"), want, got):
        assert a == b, f"{path.name} capacity {capacity} {policy}: {what} differ"
    assert sim.counts == pool.counts
    counts["traces"] += 1
    counts["evictions"] += sim.evictions
    counts["waits"] += sim.counts["waits"]
    counts["cancellations"] += sim.counts["cancelled"] + sim.counts["dropped"]
    counts["last_block_recomputes"] += sim_log.duplicates


@pytest.mark.parametrize("policy", POLICIES)
def test_sim_and_vllm_pool_agree_on_generated_traces(tmp_path, policy):
    counts: Counter = Counter()

    @settings(max_examples=NUM_TRACES, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow,
                                     HealthCheck.function_scoped_fixture])
    @given(lines=traces(), capacity=st.integers(4, 16))
    def check(lines, capacity):
        compare(write_lines(tmp_path, lines), capacity, policy, counts)

    check()
    print(f"\n{policy}: {dict(counts)}")
    assert counts["traces"] >= NUM_TRACES
    for what in ("evictions", "waits", "cancellations", "last_block_recomputes"):
        assert counts[what] > 0, f"the generated corpus has no {what}: {dict(counts)}"


def _window(lines: list[dict], num_requests: int) -> list[dict]:
    """The header and the first num_requests requests, plus what the sources lack:
    every 9th request is cancelled 20 ms after it arrives (the imported traces have no
    cancellations) and every 7th is repeated 1 ms later as its block-aligned prompt
    (tail 0), which recomputes its last block when all of it is cached."""
    header, reqs = lines[0], [ev for ev in lines[1:] if ev["op"] == "request"]
    events = []
    for i, ev in enumerate(reqs[:num_requests]):
        events.append(ev)
        if i % 9 == 4:
            events.append({"t": round(ev["t"] + 0.02, 6), "op": "cancel", "id": ev["id"]})
        if i % 7 == 3 and ev["blocks"]:
            events.append({**ev, "id": ev["id"] + "-again", "t": round(ev["t"] + 0.001, 6),
                           "tail": 0})
    events.sort(key=lambda ev: ev["t"])      # stable: same-time events keep their order
    return [header] + events


REAL = {  # name: (format, source, import options, window, capacities)
    "mooncake-conversation": ("mooncake", "mooncake/mooncake_conversation_trace.jsonl",
                              {"group_by": "hash-mod:6", "contracts_cycle": True},
                              200, (64, 256)),
    "mooncake-synthetic": ("mooncake", "mooncake/mooncake_synthetic_trace.jsonl",
                           {"group_by": "hash-mod:4"}, 150, (96,)),
    "weka": ("weka", "weka", {"group_by": "file"}, 40, (1600,)),
}


@pytest.fixture(scope="module")
def real_windows(tmp_path_factory):
    out = {}
    d = tmp_path_factory.mktemp("real")
    for name, (fmt, src, opts, n, caps) in REAL.items():
        src_path = shared_traces() / src
        if fmt == "weka":    # a few session files, sub-agent sessions included
            files = sorted(src_path.glob("*.json"))[::20] + [src_path / "trace_0277.json"]
            src_path = d / "weka-src"
            src_path.mkdir()
            for f in files:
                (src_path / f.name).write_bytes(f.read_bytes())
        p = d / f"{name}.jsonl"
        write_trace(p, _window(import_trace(fmt, src_path, **opts), n))
        out[name] = (p, caps)
    return out


@pytest.mark.parametrize("policy", POLICIES)
def test_sim_and_vllm_pool_agree_on_real_trace_windows(real_windows, policy):
    counts: Counter = Counter()
    for name, (path, caps) in real_windows.items():
        for cap in caps:
            compare(path, cap, policy, counts)
    print(f"\n{policy}: {dict(counts)}")
    for what in ("evictions", "waits", "cancellations", "last_block_recomputes"):
        assert counts[what] > 0, f"the real-trace windows have no {what}: {dict(counts)}"
