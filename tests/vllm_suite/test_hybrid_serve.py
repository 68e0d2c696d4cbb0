"""A hybrid-attention model served by `vllm serve` with the plugin: the capture, replayed
with the model's KV-cache groups, gives every request the cached tokens the server reported.

The bundled tiny Gemma2 (dummy weights: a sliding-window layer with an 80-token window, then
a full-attention layer) runs vLLM's hybrid coordinator on 64 blocks of 32 tokens, under LRU
and PrefixShield, with capture on; the client is test_multi_turn_serve's (six tenants, four
turns each, every turn's prompt the conversation so far). The capture replayed with
``--kv-groups sliding:80,full`` (the groups its header records) must equal the server on every
request, follow-ups included; modeled as one full-attention group, it must not.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from psgate.engines.step_cost import SchedulerParams
from psgate.errors import InputError

from test_multi_turn_serve import replayed as replay_as_served, serve_chat
from test_vllm_serve import ROOT

GEMMA2 = ROOT / "psgate" / "data" / "models" / "tiny-gemma2"
GROUPS = "sliding:80,full"


@pytest.fixture(scope="module", params=["lru", "prefixshield"])
def served(request, tmp_path_factory):
    # 64 blocks cannot hold a 1,024-token sequence in both groups: vLLM refuses to start
    return serve_chat(tmp_path_factory.mktemp(f"hybrid-{request.param}"), request.param,
                      model=GEMMA2, max_model_len=768)


def replayed(served, groups: str, out: Path, trace: Path | None = None) -> dict[str, int]:
    return replay_as_served(trace or served["trace"], served["policy"], out,
                            sched=SchedulerParams(kv_groups=groups))


def test_the_capture_replayed_with_the_models_groups_equals_the_server(served, tmp_path):
    live = served["live"]
    assert len(live) == 24 and sum(live.values()) > 0
    lines = served["trace"].read_text().splitlines()
    assert json.loads(lines[0])["kv_groups"] == GROUPS      # the capture says its model's
    got = replayed(served, GROUPS, tmp_path / "hybrid")
    assert {i: got[i] for i in live} == live
    # the capture refuses another model's groups; without its header field, one
    # full-attention group is a wrong prediction
    with pytest.raises(InputError, match=r"--kv-groups: the trace was captured from a model "
                                         r"whose KV-cache groups are sliding:80,full; the "
                                         r"replay's are full: pass --kv-groups "
                                         r"sliding:80,full"):
        replayed(served, "full", tmp_path / "refused")
    bare = tmp_path / "bare.jsonl"
    header = {k: v for k, v in json.loads(lines[0]).items() if k != "kv_groups"}
    bare.write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
    one = replayed(served, "full", tmp_path / "one", trace=bare)
    wrong = [i for i in live if one[i] != live[i]]
    print(f"\n{served['policy']}: {sum(live.values())} cached tokens live; one full-attention "
          f"group: {sum(one[i] for i in live)}, {len(wrong)} of {len(live)} requests differ")
    assert wrong
