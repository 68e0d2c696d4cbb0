"""A hybrid-attention model on the real CPU engine: the bundled tiny Gemma2 (dummy
weights; layer 0 sliding-window attention with an 80-token window, layer 1 full), so vLLM
runs its hybrid coordinator with a sliding-window group and a full-attention group on one
pool of 64 blocks. In lockstep pacing the real engine's cached tokens must equal sim's step
replay with ``--kv-groups sliding:80,full`` on every request, under LRU and PrefixShield;
with one full-attention group modeled instead, sim must disagree (the groups matter here).
"""

from __future__ import annotations

import csv
import hashlib
from importlib import resources

import pytest

import vllm  # noqa: F401  (the heavy suite runs only where vLLM is installed)
from psgate import api
from psgate.engines.step_cost import SchedulerParams
from psgate.errors import InputError

from helpers import write_lines

GEMMA2 = str(resources.files("psgate") / "data" / "models" / "tiny-gemma2")
GROUPS = "sliding:80,full"
SCHED = dict(max_num_batched_tokens=256, max_num_seqs=8)


def _h(label: str) -> str:
    return hashlib.sha256(label.encode()).hexdigest()[:32]


def hybrid_lines(n: int = 36, block_size: int = 32) -> list[dict]:
    """Three tenants re-reading 5-block system prompts (160 tokens: twice the window)
    with questions of their own, and a flooder with fresh 6-block prompts; answers of
    20-70 tokens, so the window moves during decode and output blocks fill."""
    lines = [{"psgate_trace": 1, "block_size": block_size}]
    for i in range(n):
        t = round(0.2 * (i + 1), 3)
        if i % 4 == 3:
            blocks = [_h(f"f{i}-{j}") for j in range(6)]
            group, contract = "flood", "best-effort"
        else:
            tenant = i % 4
            blocks = ([_h(f"sys{tenant}-{j}") for j in range(5)]
                      + [_h(f"q{i}-{j}") for j in range(i % 3)])
            group, contract = f"tenant-{tenant}", "standard"
        lines.append({"t": t, "op": "request", "id": f"r{i}", "group": group,
                      "contract": contract, "scope": "m", "blocks": blocks, "tail": 5,
                      "out": 20 + 25 * (i % 3)})
    return lines


def _cached(out) -> dict[tuple[str, str], tuple[str, int]]:
    with open(out / "requests.csv", newline="") as f:
        return {(r["run"], r["id"]): (r["state"], int(r["cached_tokens"]))
                for r in csv.DictReader(f)}


def _replay(tmp_path, name: str, engine: str, groups: str, **kw):
    trace = tmp_path / "hybrid.jsonl"
    if not trace.exists():
        write_lines(tmp_path, hybrid_lines(), name="hybrid.jsonl")
    cfg = api.ReplayConfig(trace=str(trace), baseline="lru", candidate="prefixshield",
                           capacity=64, engine=engine,
                           sched=SchedulerParams(**SCHED, kv_groups=groups),
                           out=tmp_path / name, **kw)
    return api.replay(cfg).receipt, _cached(tmp_path / name)


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    d = tmp_path_factory.mktemp("hybrid")
    receipt, rows = _replay(d, "real", "vllm", GROUPS, model_config=GEMMA2,
                            pacing="lockstep")
    return d, receipt, rows


def test_real_engine_equals_the_hybrid_step_replay_on_every_request(real):
    d, receipt, rows = real
    _, sim = _replay(d, "sim", "sim", GROUPS, scheduler="step")
    assert set(rows) == set(sim) and len(rows) == 72
    differ = {k: (rows[k], sim[k]) for k in rows if rows[k] != sim[k]}
    assert not differ, differ
    assert all(state == "completed" for state, _ in rows.values())
    assert sum(c for _, c in rows.values()) > 0
    for label in ("baseline", "candidate"):
        run = receipt["runs"][label]
        assert run["metrics"]["totals"]["evictions"] > 0, label
        obs = run["observed"]
        assert obs["predicted_by"] == "vllm-sched"
        assert obs["num_equal"] == obs["num_requests"] == 36, obs["differences"]
    assert receipt["config"]["engine_info"]["scheduler"]["kv_groups"] == GROUPS


def test_one_full_attention_group_does_not_predict_the_hybrid_model(real):
    # measured: the real engine cached 2,400 (LRU) and 3,520 (PrefixShield) tokens where
    # one full-attention group predicts 3,840 for each; 11 of the 72 requests differ
    d, _, rows = real
    _, one = _replay(d, "one", "sim", "full", scheduler="step")
    assert sum(1 for k in rows if rows[k] != one[k]) >= 8
    assert sum(c for _, c in one.values()) > sum(c for _, c in rows.values())


def test_real_engine_refuses_groups_that_are_not_its_models(tmp_path):
    with pytest.raises(InputError, match=r"the model's KV-cache groups are sliding:80,full, "
                                         r"the replay's full; pass --kv-groups "
                                         r"sliding:80,full"):
        _replay(tmp_path, "wrong", "vllm", "full", model_config=GEMMA2, pacing="lockstep")
