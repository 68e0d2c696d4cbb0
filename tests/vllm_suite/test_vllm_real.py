"""--engine vllm: a two-tenant flood replayed on the real CPU engine (tiny Qwen2, dummy
weights), observed cached tokens against the vllm-pool prediction."""

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
