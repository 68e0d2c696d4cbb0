"""--engine vllm: a two-tenant flood replayed on the real CPU engine (tiny Qwen2, dummy
weights), observed cached tokens against the vllm-pool prediction; lockstep pacing on the
modeled step clock; cached tokens of a request cancelled after it started."""

from __future__ import annotations

import hashlib
import json

import pytest

import vllm
from psgate import api
from psgate.errors import InputError

from helpers import write_lines


def _h(label: str) -> str:
    return hashlib.sha256(label.encode()).hexdigest()[:32]


def flood_lines(n: int = 45, block_size: int = 32) -> list[dict]:
    """A victim re-reading a 4-block system prompt (every third request) against a
    flooder sending fresh 4-7 block prefixes; tail + out < block_size, so no output
    block ever fills (the replay model caches prompt blocks only)."""
    lines = [{"psgate_trace": 1, "block_size": block_size}]
    for i in range(n):
        t = round(0.25 * (i + 1), 3)
        if i % 3 == 0:
            blocks = [_h(f"sys-{j}") for j in range(4)] + [_h(f"v{i}-{j}") for j in range(i % 2)]
            lines.append({"t": t, "op": "request", "id": f"v{i}", "group": "victim",
                          "contract": "critical", "scope": "m", "role": "victim",
                          "blocks": blocks, "tail": 8, "out": 4})
        else:
            blocks = [_h(f"f{i}-{j}") for j in range(4 + i % 4)]
            lines.append({"t": t, "op": "request", "id": f"f{i}", "group": "flood",
                          "contract": "best-effort", "scope": "m", "role": "attacker",
                          "blocks": blocks, "tail": 8, "out": 4})
    return lines


@pytest.fixture(scope="module")
def receipt(tmp_path_factory):
    d = tmp_path_factory.mktemp("real")
    trace = write_lines(d, flood_lines())
    cfg = api.ReplayConfig(trace=str(trace), baseline="lru", candidate="prefixshield",
                           capacity=40, engine="vllm", time_compression=1.0, out=d / "o")
    receipt = api.replay(cfg).receipt
    receipt["_out"] = d / "o"
    return receipt


def test_receipt_names_the_real_engine(receipt):
    info = receipt["config"]["engine_info"]
    assert receipt["config"]["engine"] == "vllm"
    assert info["vllm"] == vllm.__version__ and info["device"] == "cpu"
    assert info["model"] == "tiny-qwen2" and info["times"].startswith("observed")
    for run in receipt["runs"].values():
        assert run["metrics"]["totals"]["saved_prefill_ms"] is None   # no modeled time
        assert run["metrics"]["totals"]["ttft_p50_ms"] > 0


@pytest.mark.parametrize("label", ["baseline", "candidate"])
def test_observed_cached_tokens_match_the_vllm_pool_prediction(receipt, label):
    run = receipt["runs"][label]
    obs = run["observed"]
    print(f"\n{label}: {json.dumps({k: v for k, v in obs.items() if k != 'differences'})}")
    assert run["counts"]["evictions"] > 0          # the flood does evict
    # every request the replay model covers (never preempted, no hit on a block of
    # generated tokens) equals the prediction exactly, and that set is >= 90% of them
    preempted = set(obs["preempted_ids"])
    covered_but_different = [d for d in obs["differences"]
                 if d["id"] not in preempted and d["class"] != "output_block_hit"]
    assert not covered_but_different, covered_but_different
    assert obs["num_comparable_equal"] == obs["num_comparable"]
    assert obs["num_comparable"] >= 0.9 * obs["num_requests"]
    assert all(d["class"] for d in obs["differences"])
    assert run["invariants"]["no_pinned_eviction"]["holds"]


def test_observed_receipts_are_not_verified_byte_for_byte(receipt):
    from psgate.report.verify import verify
    with pytest.raises(InputError, match="observed"):
        verify(receipt["_out"])


def test_cpu_engine_refuses_block_size_16(tmp_path):
    trace = write_lines(tmp_path, flood_lines(6, block_size=16))
    cfg = api.ReplayConfig(trace=str(trace), engine="vllm", capacity=40, out=tmp_path / "o")
    with pytest.raises(InputError, match="multiple of 32; this trace has block_size 16"):
        api.replay(cfg)
    assert not (tmp_path / "o").exists()


def test_admission_controlling_policies_are_refused_on_the_real_engine(tmp_path):
    trace = write_lines(tmp_path, flood_lines(6))
    cfg = api.ReplayConfig(trace=str(trace), engine="vllm", candidate="static-quota",
                           capacity=40, out=tmp_path / "o")
    with pytest.raises(InputError, match="static-quota.*admission control"):
        api.replay(cfg)


def test_summary_table_says_times_are_observed(receipt):
    from psgate.report.render import replay_table
    from psgate.report.summary import markdown, summarize
    caption = str(replay_table(receipt).caption)
    assert "times observed" in caption and "modeled" not in caption
    text = markdown(summarize(receipt["_out"]))
    assert "times observed" in text and "times modeled" not in text


# -- lockstep pacing: the real engine on the modeled step clock ------------------------

def lockstep_lines() -> list[dict]:
    """Nine flood requests far apart (each runs alone: its first token comes one step of
    its own prefill after arrival), then a burst of six at once that a 256-token budget
    must chunk and queue."""
    lines = flood_lines(9)
    for i in range(6):
        blocks = [_h("sys-0"), _h(f"b{i}")] + [_h(f"b{i}-{j}") for j in range(i % 3)]
        lines.append({"t": 3.0, "op": "request", "id": f"b{i}", "group": "burst",
                      "contract": "standard", "scope": "m", "blocks": blocks, "tail": 8,
                      "out": 3})
    return lines


def _lockstep(tmp_path, name: str):
    from psgate.engines.step_cost import SchedulerParams
    trace = write_lines(tmp_path, lockstep_lines(), name=f"{name}.jsonl")
    cfg = api.ReplayConfig(trace=str(trace), baseline="lru", candidate="prefixshield",
                           capacity=24, engine="vllm", pacing="lockstep",
                           sched=SchedulerParams(max_num_batched_tokens=256),
                           out=tmp_path / name)
    return api.replay(cfg).receipt, tmp_path / name / "requests.csv"


def _rows(path) -> list[dict]:
    import csv
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def lockstep(tmp_path_factory):
    return _lockstep(tmp_path_factory.mktemp("lockstep"), "a")


def test_lockstep_ttft_is_the_step_clock_time_of_the_first_token(lockstep):
    from psgate.engines.step_cost import StepCostModel, StepWork
    receipt, csv_path = lockstep
    info = receipt["config"]["engine_info"]
    assert info["pacing"] == "lockstep" and info["times"].startswith("modeled")
    assert info["scheduler"]["max_num_batched_tokens"] == 256
    cost = StepCostModel()
    for label in ("baseline", "candidate"):
        rows = [r for r in _rows(csv_path) if r["run"] == label]
        assert len(rows) == 15 and all(r["state"] == "completed" for r in rows)
        first = [float(r["t"]) * 1000 + float(r["ttft_ms"]) for r in rows]   # ms, arrival order
        assert all(float(r["ttft_ms"]) > 0 for r in rows)
        assert first == sorted(first), first      # FCFS: first tokens in arrival order
        for r in rows[:9]:      # alone on the engine: exactly one step of its own prefill
            cached, prompt = int(r["cached_tokens"]), int(r["prompt_tokens"])
            step = cost.step_ms(StepWork(prompt - cached, cached, 0, 0))
            assert float(r["ttft_ms"]) == pytest.approx(step, abs=0.01), r
        burst = rows[9:]        # 6 x 72+ tokens under a 256-token budget: queued, chunked
        assert float(burst[-1]["queue_ms"]) > 0
        assert float(burst[-1]["ttft_ms"]) > float(burst[0]["ttft_ms"])
        obs = receipt["runs"][label]["observed"]
        assert obs["pacing"] == "lockstep" and obs["wall_ttft_ms"]["p50"] > 0
        assert sorted(obs["wall_ttft_ms"]["by_request"]) == sorted(r["id"] for r in rows)
        # every step that computed something, with its work and wall time, for a fit of
        # the step model to this engine (tools/compare_real.py --fit-steps)
        steps = obs["step_wall_ms"]["rows"]
        assert 0 < len(steps) <= receipt["runs"][label]["counts"]["steps"]
        assert sum(s[0] for s in steps) >= sum(int(r["prompt_tokens"]) -
                                               int(r["cached_tokens"]) for r in rows)
        assert all(s[4] > 0 and s[0] + s[2] > 0 for s in steps)
    from psgate.report.render import replay_table
    assert "times modeled" in str(replay_table(receipt).caption)


def test_lockstep_is_deterministic(lockstep, tmp_path):
    _, first = lockstep
    _, second = _lockstep(tmp_path, "b")
    key = ("run", "id", "state", "cached_tokens", "ttft_ms", "queue_ms", "done_t")
    a = [tuple(r[k] for k in key) for r in _rows(first)]
    b = [tuple(r[k] for k in key) for r in _rows(second)]
    assert a == b


# -- a request cancelled after it started keeps the cached tokens vLLM reported --------

@pytest.mark.parametrize("pacing", ["wall", "lockstep"])
def test_cancel_after_start_keeps_its_cached_tokens(tmp_path, pacing):
    """b re-reads a's 4-block system prompt, then decodes 1,500 tokens and is cancelled a
    second in (seconds before it could finish on either clock)."""
    sys_blocks = [_h(f"sys-{j}") for j in range(4)]
    lines = [{"psgate_trace": 1, "block_size": 32},
             {"t": 0.1, "op": "request", "id": "a", "group": "g", "contract": "standard",
              "scope": "m", "blocks": sys_blocks, "tail": 8, "out": 4},
             {"t": 0.5, "op": "request", "id": "b", "group": "g", "contract": "standard",
              "scope": "m", "blocks": sys_blocks + [_h("b-0")], "tail": 8, "out": 1500},
             {"t": 1.5, "op": "cancel", "id": "b"}]
    trace = write_lines(tmp_path, lines)
    cfg = api.ReplayConfig(trace=str(trace), capacity=80, engine="vllm", pacing=pacing,
                           out=tmp_path / "o")
    receipt = api.replay(cfg).receipt
    rows = {r["id"]: r for r in _rows(tmp_path / "o" / "requests.csv") if r["run"] == "baseline"}
    assert rows["b"]["state"] == "cancelled"
    assert int(rows["b"]["cached_tokens"]) == 4 * 32
    assert receipt["runs"]["baseline"]["counts"]["cancelled"] == 1
