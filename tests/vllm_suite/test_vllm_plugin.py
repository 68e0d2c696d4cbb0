"""The vLLM plugin, in process on the CPU engine: PSGATE_POLICY installs the policy,
without it vLLM's native queue stays. Each case runs in its own interpreter, since
vLLM loads plugins once per process."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import json, os, sys
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt
from psgate.engines.vllm_pool import tokens_for

llm = LLM(model=sys.argv[1], load_format="dummy", skip_tokenizer_init=True,
          enable_prefix_caching=True, block_size=32, num_gpu_blocks_override=24,
          max_model_len=512, enforce_eager=True, seed=0)
mgr = llm.llm_engine.engine_core.engine_core.scheduler.kv_cache_manager
greedy = dict(temperature=0.0, ignore_eos=True, max_tokens=2)
system = [t for i in range(4) for t in tokens_for(f"sys{i}", 32, 4096)]
cached = []
# the victim reads its system prompt twice (a hot prompt), then two floods per re-read
for i, who in enumerate("vv" + "ffv" * 4):
    if who == "v":      # the victim tenant, by cache_salt, re-reading its system prompt
        prompt = TokensPrompt(prompt_token_ids=system + [7] * 5, cache_salt="victim")
        params = SamplingParams(**greedy, extra_args={"psgate_contract": "critical"})
    else:               # the flooder, named in extra_args, with fresh prefixes
        toks = [t for j in range(10) for t in tokens_for(f"f{i}.{j}", 32, 4096)]
        prompt = TokensPrompt(prompt_token_ids=toks + [9] * 5)
        params = SamplingParams(**greedy, extra_args={"psgate_group": "flood",
                                                      "psgate_contract": "best-effort"})
    out = llm.generate([prompt], params, use_tqdm=False)[0]
    cached.append(out.num_cached_tokens)
print(json.dumps({"queue": type(mgr.block_pool.free_block_queue).__name__,
                  "cached": cached}))
"""


def run(tmp_path, **env) -> dict:
    e = {k: v for k, v in os.environ.items() if not k.startswith("PSGATE_")}
    e.update(VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_CPU_KVCACHE_SPACE="1",
             PYTHONPATH=str(ROOT), **env)
    proc = subprocess.run([sys.executable, "-c", SCRIPT,
                           str(ROOT / "psgate" / "data" / "models" / "tiny-qwen2")],
                          capture_output=True, text=True, cwd=tmp_path, env=e, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def native(tmp_path_factory):
    return run(tmp_path_factory.mktemp("native"))


def test_without_the_variable_vllm_keeps_its_native_queue(native):
    assert native["queue"] == "FreeKVCacheBlockQueue"


def test_plugin_installs_the_policy_and_writes_the_ledger(tmp_path, native):
    ledger = tmp_path / "ledger.csv"
    config = tmp_path / "policy.json"
    config.write_text(json.dumps({"params": {}}))
    got = run(tmp_path, PSGATE_POLICY="prefixshield", PSGATE_POLICY_CONFIG=str(config),
              PSGATE_LEDGER=str(ledger))
    assert got["queue"] == "PolicyFreeQueue"
    rows = list(csv.DictReader(ledger.open()))
    assert rows, "the flood must evict"
    assert {r["group"] for r in rows} <= {"flood", "victim"}
    assert "flood" in {r["group"] for r in rows}
    assert all(r["queue"] and int(r["num_candidates"]) >= 1 for r in rows)
    # the floods evict the victim's hot system prompt (4 blocks) under vLLM's native LRU;
    # under PrefixShield it survives every flood
    print(f"\nnative cached {native['cached']}\npsgate cached {got['cached']}")
    assert min(native["cached"][4::3]) < 128, native["cached"]
    assert got["cached"][1] == 128 and all(c == 128 for c in got["cached"][4::3]), \
        got["cached"]


def test_plugin_with_lru_matches_native_lru(tmp_path, native):
    """psgate's lru through the plugin reproduces vLLM's own queue, hit for hit."""
    got = run(tmp_path, PSGATE_POLICY="lru")
    assert got["queue"] == "PolicyFreeQueue"
    assert got["cached"] == native["cached"]


# The field's policies (issue 47's eight): each served by the plugin in a live vLLM, its
# decisions written to the ledger with its own ranking fields.
FIELD = ["fifo", "mru", "lfu", "slru", "tlru", "arc", "tinylfu", "isolated-lru"]


@pytest.mark.parametrize("policy", FIELD)
def test_plugin_serves_each_field_policy(tmp_path, policy):
    ledger = tmp_path / "ledger.csv"
    got = run(tmp_path, PSGATE_POLICY=policy, PSGATE_LEDGER=str(ledger))
    assert got["queue"] == "PolicyFreeQueue"
    assert len(got["cached"]) == 14            # every request served
    rows = list(csv.DictReader(ledger.open()))          # the live ledger: one row an eviction
    assert rows, "the flood must evict"
    assert {r["group"] for r in rows} <= {"flood", "victim"}
    assert all(r["queue"] and int(r["num_candidates"]) >= 1 for r in rows)
    assert all(json.loads(r["rank"]) for r in rows)      # why each victim was chosen
