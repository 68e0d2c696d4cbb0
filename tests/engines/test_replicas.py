"""A run spread over several serving instances (--replicas, --route) and the saturation
verdict that says when one modeled instance cannot carry a trace."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import subprocess
from pathlib import Path

import pytest

from helpers import SHARED, heavy_python, ledger_csv, shared_traces
from psgate import api
from psgate.engines.replicas import Replica, merge_results, replica_of, route_key
from psgate.engines.results import COMPLETED, DROPPED, REJECTED, RequestOutcome, RunResult
from psgate.invariants.checker import Verdict
from psgate.receipt.receipt import deterministic_part, dumps
from psgate.stats.saturation import BINS, SaturationMeter
from psgate.trace.importers import import_trace
from psgate.trace.model import CancelEvent, DoneEvent, RequestEvent
from psgate.trace.writer import write_trace
from psgate.workloads import generate
from test_cli import GOLDEN_ARGS, GOLDEN_DIR, assert_one_line_error, psgate

# cold at 24 requests/s: about 1.4 times what one instance's step scheduler serves (queue
# delay grows 0.43 s per trace second); two instances carry it
HEAVY = ("cold", {"rate": 24, "duration_s": 10})
LIGHT = ("cold", {})


def _trace(tmp_path: Path, kind: tuple[str, dict], name: str = "t.jsonl") -> Path:
    p = tmp_path / name
    write_trace(p, generate(kind[0], dict(kind[1])))
    return p


def _replay(tmp_path: Path, trace: Path, out: str = "o", **kw):
    cfg = api.ReplayConfig(trace=str(trace), baseline=kw.pop("baseline", "lru"),
                           candidate=kw.pop("candidate", "lru"),
                           capacity=kw.pop("capacity", 512), out=tmp_path / out, **kw)
    return api.replay(cfg).receipt


def _req(i: int, group: str = "g", prefix: str | None = None) -> RequestEvent:
    return RequestEvent(line=i + 2, t_ns=i, id=f"r{i}", group=group, contract="standard",
                        scope="m", blocks=[], tail=1, out=0, prompt_tokens=1, prefix=prefix)


# -- routing ------------------------------------------------------------------------------
def test_round_robin_is_arrival_index_mod_n():
    assert [replica_of("round-robin", 3, _req(k), k) for k in range(8)] == [0, 1, 2, 0, 1,
                                                                             2, 0, 1]
    assert {replica_of("round-robin", 1, _req(k), k) for k in range(5)} == {0}


def test_session_hashes_the_prefix_label_else_the_group():
    def blake(key: str, n: int) -> int:
        return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big") % n

    # pinned values: the rule must not drift between releases (same trace, same routing)
    assert [replica_of("session", 4, _req(0, prefix=f"c{k}"), 0) for k in range(6)] == \
        [blake(f"c{k}", 4) for k in range(6)] == [3, 2, 1, 2, 0, 0]
    assert route_key(_req(0, group="tenant-1", prefix="conv-9")) == "conv-9"
    assert route_key(_req(0, group="tenant-1")) == "tenant-1"
    # one conversation stays on one instance whatever its arrival index or group
    assert {replica_of("session", 7, _req(k, group=f"g{k}", prefix="conv-9"), k)
            for k in range(20)} == {blake("conv-9", 7)}
    assert replica_of("session", 5, _req(3, group="tenant-1"), 3) == blake("tenant-1", 5)


def test_cancel_and_done_events_follow_their_request():
    events = [_req(0), _req(1), CancelEvent(line=10, t_ns=5, id="r0"), _req(2),
              DoneEvent(line=11, t_ns=6, id="r1"), CancelEvent(line=12, t_ns=7, id="r2")]
    seen = {}
    ticked = []
    for i in range(2):
        rep = Replica("baseline", i, 2, "round-robin", None)
        seen[i] = [(type(e).__name__, e.id) for e in rep.select(iter(events), ticked.append)]
        assert rep.label == f"baseline/r{i}"
        seen[f"index{i}"] = list(rep.index_of)
    assert seen[0] == [("RequestEvent", "r0"), ("CancelEvent", "r0"), ("RequestEvent", "r2"),
                       ("CancelEvent", "r2")]
    assert seen[1] == [("RequestEvent", "r1"), ("DoneEvent", "r1")]
    assert seen["index0"] == [0, 2] and seen["index1"] == [1]
    # the filter ticks the lines an instance does not see (its engine ticks the others)
    assert ticked == [3, 11] + [2, 10, 4, 12]


def test_one_replica_is_the_trace_unchanged():
    events = [_req(0), CancelEvent(line=10, t_ns=5, id="r0")]
    rep = Replica("baseline", 0, 1, "session", None)
    assert rep.label == "baseline"
    assert list(rep.select(iter(events))) == events


# -- merging ------------------------------------------------------------------------------
def _result(evictions: int, violations: int, rejected: list[str]) -> RunResult:
    v = Verdict(name="refcount", hard=True, checks=10, violations=violations,
                first_violation="block 3" if violations else None)
    return RunResult(label="x", policy={"name": "lru", "params": {}}, usable_blocks=7,
                     requests=[], groups=["a", "b"], evictions=evictions,
                     evictions_by={"a": {"b": evictions}}, occupancy_mean={"a": 1.5},
                     occupancy_max={"a": 4}, counts={"admitted": 3, "rejected": len(rejected)},
                     invariants={"refcount": v}, orphans={"orphans_created": 1},
                     rejected_ids=rejected, start_ns=5, end_ns=9)


def test_merge_sums_and_holds_only_where_every_instance_held():
    reps = [Replica("baseline", i, 2, "round-robin", None) for i in range(2)]
    reps[0].rejected = [(4, "r4")]
    reps[1].rejected = [(1, "r1")]
    m = merge_results("baseline", reps, [_result(2, 0, ["r4"]), _result(3, 1, ["r1"])])
    assert m.evictions == 5 and m.evictions_by == {"a": {"b": 5}}
    assert m.usable_blocks == 14 and m.counts == {"admitted": 6, "rejected": 2}
    assert m.occupancy_mean == {"a": 3.0} and m.occupancy_max == {"a": 8}
    assert m.orphans == {"orphans_created": 2}
    assert m.rejected_ids == ["r1", "r4"]           # trace order, not instance order
    v = m.invariants["refcount"]
    assert (v.checks, v.violations, v.holds, v.first_violation) == (20, 1, False, "r1: block 3")


# -- saturation ---------------------------------------------------------------------------
def _outcome(t_s: float, queue_s: float | None, state: str = COMPLETED,
             ttft_s: float | None = None) -> RequestOutcome:
    return RequestOutcome(id="x", group="g", contract="standard", role=None, measure=True,
                          state=state, t_ns=round(t_s * 1e9), prompt_tokens=16,
                          queue_ms=None if queue_s is None else queue_s * 1000,
                          ttft_ms=None if ttft_s is None else ttft_s * 1000)


def _meter(points, shuffle: bool = True) -> SaturationMeter:
    m = SaturationMeter()
    order = list(range(len(points)))
    if shuffle:          # outcomes arrive as requests finish, not as they arrive
        order = order[1::2] + order[::2]
    for i in order:
        m.add(_outcome(*points[i]), i)
    return m


def test_a_growing_backlog_is_saturated_with_its_slope():
    # 100 arrivals 1 s apart; queue delay 0.5 s per second of trace from the start
    m = _meter([(k, 0.5 * k) for k in range(100)])
    s = m.verdict(ttft_p95_ms=1000.0)
    assert s["verdict"] == "saturated"
    assert s["queue_slope"] == 0.5 and s["arrival_span_s"] == 99.0
    assert s["queue_end_s"] == pytest.approx(0.5 * 94.5)       # arrivals 90..99
    assert s["suggested_replicas"] == 2                          # ceil(1.5 / 0.8)
    assert s["admitted_requests"] == 100 and len(s["reasons"]) == 1
    assert m.verdict(ttft_p95_ms=1000.0, replicas=3)["suggested_replicas"] == 6


def test_a_stable_queue_is_not_saturated():
    s = _meter([(k, 0.2 + 0.05 * (k % 3)) for k in range(100)]).verdict(ttft_p95_ms=500.0)
    assert s["verdict"] == "not_saturated" and s["reasons"] == []
    assert abs(s["queue_slope"]) < 0.01 and s["suggested_replicas"] is None


def test_a_p95_beyond_the_span_alone_is_saturated():
    s = _meter([(k, 0.0) for k in range(50)]).verdict(ttft_p95_ms=60_000.0)
    assert s["verdict"] == "saturated" and s["ttft_p95_vs_span"] == pytest.approx(60 / 49)
    assert s["reasons"] == ["TTFT p95 60 s is 1.22 times the trace's span"]
    assert _meter([(k, 0.0) for k in range(50)]).verdict(40_000.0)["verdict"] == \
        "not_saturated"


def test_too_little_evidence_is_undetermined():
    few = _meter([(k, k) for k in range(19)]).verdict(1e9)
    assert few["verdict"] == "undetermined" and "too few" in few["reasons"][0]
    burst = _meter([(0, k) for k in range(100)]).verdict(1e9)
    assert burst["verdict"] == "undetermined" and "one instant" in burst["reasons"][0]
    assert burst["suggested_replicas"] is None
    # requests never admitted carry no queue delay and do not count
    m = _meter([(k, k) for k in range(30)])
    for k in range(30, 60):
        m.add(_outcome(k, None, state=REJECTED if k % 2 else DROPPED), k)
    s = m.verdict(None)
    assert s["admitted_requests"] == 30 and s["arrival_span_s"] == 59.0
    assert s["queue_end_s"] is None


def test_bins_widen_without_changing_the_slope():
    n = BINS * 8 + 3
    s = _meter([(k * 0.1, 0.25 * k * 0.1) for k in range(n)]).verdict(0.0)
    assert s["queue_slope"] == pytest.approx(0.25) and s["verdict"] == "saturated"


def test_a_heavy_generated_trace_is_flagged_and_a_light_one_not(tmp_path):
    heavy = _replay(tmp_path, _trace(tmp_path, HEAVY), "h")
    light = _replay(tmp_path, _trace(tmp_path, LIGHT, "l.jsonl"), "l")
    for run in ("baseline", "candidate"):
        s = heavy["runs"][run]["saturation"]
        assert s["verdict"] == "saturated", s
        assert s["queue_slope"] > 0.3 and s["suggested_replicas"] == 2
        assert light["runs"][run]["saturation"]["verdict"] == "not_saturated"


def test_the_cli_warns_once_per_saturated_run_naming_the_suggestion(tmp_path):
    trace = _trace(tmp_path, HEAVY)
    proc = psgate("replay", "--trace", trace, "--baseline", "lru", "--candidate",
                  "prefixshield", "--out", tmp_path / "o", "--quiet")
    warnings = [ln for ln in proc.stderr.splitlines() if "warning" in ln]
    assert len(warnings) == 2, proc.stderr
    assert warnings[0].startswith("psgate: warning: baseline run (lru): the modeled "
                                  "instance is saturated")
    assert warnings[1].startswith("psgate: warning: candidate run (prefixshield)")
    assert all(w.endswith("--replicas 2") for w in warnings)
    proc = psgate("replay", "--trace", trace, "--baseline", "lru", "--candidate",
                  "prefixshield", "--out", tmp_path / "o2", "--quiet", "--replicas", "2")
    assert "warning" not in proc.stderr, proc.stderr


# -- replicas end to end ------------------------------------------------------------------
def test_two_replicas_lower_the_queue_of_a_saturated_trace(tmp_path):
    trace = _trace(tmp_path, HEAVY)
    one = _replay(tmp_path, trace, "one")["runs"]["baseline"]
    two = _replay(tmp_path, trace, "two", replicas=2)["runs"]["baseline"]
    assert one["saturation"]["verdict"] == "saturated"
    assert two["saturation"]["verdict"] == "not_saturated"
    assert two["saturation"]["queue_end_s"] < one["saturation"]["queue_end_s"] / 10
    assert two["metrics"]["totals"]["ttft_p95_ms"] < one["metrics"]["totals"]["ttft_p95_ms"]
    assert [r["saturation"]["verdict"] for r in two["replicas"]] == ["not_saturated"] * 2


def test_totals_are_the_sum_of_the_replicas(tmp_path):
    trace = _trace(tmp_path, ("cancellation", {}))
    receipt = _replay(tmp_path, trace, replicas=3, route="session", capacity=256,
                      candidate="prefixshield")
    assert receipt["config"]["replicas"] == 3 and receipt["config"]["route"] == "session"
    for run in ("baseline", "candidate"):
        rec = receipt["runs"][run]
        parts = rec["replicas"]
        assert [p["run"] for p in parts] == [f"{run}/r{i}" for i in range(3)]
        assert sum(p["requests"] for p in parts) == receipt["trace"]["num_requests"]
        assert all(p["requests"] > 0 for p in parts)
        for k in ("requests", "measured_requests", "hit_requests", "saved_prefill_tokens",
                  "new_blocks", "evictions", "cancelled", "dropped", "admission_waits"):
            assert rec["metrics"]["totals"][k] == sum(p["metrics"][k] for p in parts), k
        assert rec["metrics"]["totals"]["evictions"] > 0
        for k, v in rec["counts"].items():
            assert v == sum(p["counts"][k] for p in parts), k
        assert all(p["invariants_hold"] for p in parts)
        assert all(v["holds"] for v in rec["invariants"].values())
    rows = list(csv.DictReader(io.StringIO((tmp_path / "o" / "requests.csv").read_text())))
    assert sorted(r["id"] for r in rows if r["run"].startswith("baseline/")) == \
        sorted(r["id"] for r in rows if r["run"].startswith("candidate/"))
    assert len(rows) == 2 * receipt["trace"]["num_requests"]
    ledger = {r["run"] for r in csv.DictReader(io.StringIO(
        ledger_csv(tmp_path / "o").decode()))}
    assert ledger == {f"{run}/r{i}" for run in ("baseline", "candidate") for i in range(3)}


def _routed_trace(src: Path, dst: Path, replica: int, n: int) -> None:
    """The trace's lines routed round-robin to ``replica``: its requests, their events."""
    lines = [json.loads(x) for x in src.read_text().splitlines()]
    own, k, out = set(), 0, [lines[0]]
    for x in lines[1:]:
        if x["op"] == "request":
            if k % n == replica:
                own.add(x["id"])
                out.append(x)
            k += 1
        elif x["id"] in own:
            out.append(x)
    write_trace(dst, out)


@pytest.mark.parametrize("candidate", ["belady", "prefixshield"])
def test_each_replica_is_a_single_instance_replay_of_its_requests(tmp_path, candidate):
    """An instance sees exactly its requests and their cancels, numbered as a trace of
    only those would number them (the clairvoyant policy's future included)."""
    trace = _trace(tmp_path, ("cancellation", {}))
    receipt = _replay(tmp_path, trace, replicas=2, capacity=256, candidate=candidate)
    for i in range(2):
        part = tmp_path / f"r{i}.jsonl"
        _routed_trace(trace, part, i, 2)
        alone = _replay(tmp_path, part, f"alone{i}", capacity=256, candidate=candidate)
        for run in ("baseline", "candidate"):
            mine = receipt["runs"][run]["replicas"][i]
            assert mine["metrics"] == alone["runs"][run]["metrics"]["totals"], (run, i)
            assert mine["counts"] == alone["runs"][run]["counts"]
            assert mine["saturation"] == alone["runs"][run]["saturation"]


def test_one_replica_is_byte_identical_to_the_golden_receipt(tmp_path):
    out = tmp_path / "o"
    proc = psgate("replay", *GOLDEN_ARGS, "--out", out, "--replicas", "1", "--route",
                  "session", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    got = json.loads((out / "receipt.json").read_text())
    want = json.loads((GOLDEN_DIR / "receipt.json").read_text())
    assert dumps(deterministic_part(got)) == dumps(deterministic_part(want))
    assert "replicas" not in got["config"] and "route" not in got["config"]
    for name in ("ledger.compact.csv.gz", "requests.csv"):
        assert (out / name).read_bytes() == (GOLDEN_DIR / name).read_bytes(), name


def test_replicas_are_deterministic_and_verify(tmp_path):
    trace = _trace(tmp_path, HEAVY)
    args = ("replay", "--trace", trace, "--baseline", "lru", "--candidate", "belady",
            "--capacity", "256", "--replicas", "3", "--route", "session", "--quiet")
    for d in ("a", "b"):
        proc = psgate(*args, "--out", tmp_path / d)
        assert proc.returncode in (0, 1), proc.stderr
    a, b = tmp_path / "a", tmp_path / "b"
    for name in ("ledger.compact.csv.gz", "requests.csv"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    ra, rb = (json.loads((d / "receipt.json").read_text()) for d in (a, b))
    assert dumps(deterministic_part(ra)) == dumps(deterministic_part(rb))
    ver = psgate("verify", a)
    assert ver.returncode == 0, ver.stderr + ver.stdout


@pytest.mark.parametrize("args,option", [
    (("--replicas", "0"), "--replicas"),
    (("--replicas", "-2"), "--replicas"),
    (("--replicas", "2", "--route", "random"), "--route"),
    (("--route", "least-loaded"), "--route"),
    (("--replicas", "2", "--engine", "vllm"), "--replicas"),
])
def test_bad_values_are_one_line_errors_naming_the_option(tmp_path, args, option):
    proc = psgate("replay", "--baseline", "lru", "--candidate", "lru", "--out",
                  tmp_path / "o", *args)
    assert_one_line_error(proc, 2, option)
    assert not (tmp_path / "o").exists()


@pytest.mark.heavy
def test_vllm_pool_replicas_decide_as_sim_replicas(tmp_path):
    """vLLM's own block pool, one per instance, takes the same decisions as sim's service
    model (the model vllm-pool runs vLLM's pool under)."""
    python = heavy_python("VLLM", ("vllm",), "bash scripts/install-vllm.sh .venv-vllm")
    trace = _trace(tmp_path, ("cancellation", {}))
    args = ["replay", "--trace", str(trace), "--baseline", "lru", "--candidate",
            "prefixshield", "--capacity", "256", "--replicas", "2", "--route", "session",
            "--quiet"]
    for engine, model in (("sim", ["--scheduler", "service"]), ("vllm-pool", [])):
        proc = subprocess.run([python, "-m", "psgate.cli", *args, "--engine", engine, *model,
                               "--out", str(tmp_path / engine)], capture_output=True,
                              text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr
    for name in ("ledger.compact.csv.gz", "requests.csv"):
        assert (tmp_path / "sim" / name).read_bytes() == \
            (tmp_path / "vllm-pool" / name).read_bytes(), name
    a, b = (json.loads((tmp_path / e / "receipt.json").read_text())["runs"]
            for e in ("sim", "vllm-pool"))
    assert a == b


# -- the public traces --------------------------------------------------------------------
@pytest.mark.shared
def test_a_mooncake_window_saturates_one_instance_and_not_three(tmp_path):
    """Mooncake's conversation trace was served by a cluster: its first 2,000 requests
    (about 10 minutes) overload one modeled instance, and spread over three they do not."""
    shared_traces()
    src = SHARED / "mooncake" / "mooncake_conversation_trace.jsonl"
    trace = tmp_path / "mc.jsonl"
    write_trace(trace, import_trace("mooncake", src, group_by="hash-mod:8", limit=2000))
    one = _replay(tmp_path, trace, "one", capacity=2048)["runs"]["baseline"]
    three = _replay(tmp_path, trace, "three", capacity=2048, replicas=3)["runs"]["baseline"]
    assert one["saturation"]["verdict"] == "saturated", one["saturation"]
    assert one["saturation"]["suggested_replicas"] >= 3
    assert three["saturation"]["verdict"] == "not_saturated", three["saturation"]
    assert three["metrics"]["totals"]["ttft_p95_ms"] < one["metrics"]["totals"]["ttft_p95_ms"]
