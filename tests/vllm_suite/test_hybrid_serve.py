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

import csv
import json
from functools import partial
from pathlib import Path

import pytest

from psgate import api
from psgate.engines.step_cost import SchedulerParams
from psgate.errors import InputError
from psgate.trace.redact import load_key, pseudonym

from test_multi_turn_serve import BLOCKS, chat
from test_vllm_serve import ROOT, serve

GEMMA2 = ROOT / "psgate" / "data" / "models" / "tiny-gemma2"
GROUPS = "sliding:80,full"


@pytest.fixture(scope="module", params=["lru", "prefixshield"])
def served(request, tmp_path_factory):
    policy = request.param
    d = tmp_path_factory.mktemp(f"hybrid-{policy}")
    (d / "key.hex").write_text("3d" * 16 + "\n")
    seen = serve(d, {"PSGATE_POLICY": policy, "PSGATE_CAPTURE": str(d / "cap"),
                     "PSGATE_CAPTURE_KEY_FILE": str(d / "key.hex")},
                 partial(chat, model=GEMMA2), max_model_len=768, model=GEMMA2)[0]
    key = load_key(str(d / "key.hex"), unkeyed=False)
    files = json.loads((d / "cap" / "capture-summary.json").read_text())["files"]
    assert len(files) == 1
    log = (d / "server.log").read_text()
    return {"policy": policy, "trace": d / "cap" / files[0], "log": log,
            "live": {pseudonym("r", xid, key): cached for xid, cached in seen.items()}}


def replayed(served, groups: str, out: Path, trace: Path | None = None) -> dict[str, int]:
    policy = served["policy"]
    api.replay(api.ReplayConfig(trace=str(trace or served["trace"]), baseline=policy,
                                candidate=policy, capacity=BLOCKS, out=out,
                                sched=SchedulerParams(kv_groups=groups),
                                allow_unexercised=True))
    receipt = json.loads((out / "receipt.json").read_text())
    assert receipt["runs"]["baseline"]["metrics"]["totals"]["evictions"] > 0
    with open(out / "requests.csv") as f:
        return {r["id"]: int(r["cached_tokens"]) for r in csv.DictReader(f)
                if r["run"] == "baseline"}


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
