"""Multi-turn chat through `vllm serve` with the plugin: the capture's answers make the replay
hit what the server hit.

One OpenAI-compatible server per policy (tiny Qwen2, dummy weights, 64 blocks of 32
tokens) with PSGATE_CAPTURE. Six tenants each hold a chat session of four turns; every
turn's prompt is the conversation so far (each earlier prompt, then the answer's token ids
as the server returned them) plus a new user message, so a follow-up turn re-sends the
blocks the server cached while decoding the previous answer. The turns go round robin,
one at a time, and the conversations outgrow the cache, so blocks are evicted. The
capture replayed under the server's policy must give every request, follow-ups included,
the cached tokens the server reported; the same capture with its answers stripped must not.
"""

from __future__ import annotations

import csv
import json
import time
from functools import partial
from pathlib import Path

import pytest

from psgate import api
from psgate.engines.vllm_pool import tokens_for
from psgate.trace.redact import load_key, pseudonym

from test_vllm_serve import MODEL, serve

BS, BLOCKS = 32, 64
TENANTS = ["acme", "globex", "initech", "umbrella", "hooli", "wonka"]
TURNS = 4
USER_TOKENS = (70, 53, 81, 67)      # each turn's new message (not block aligned)
ANSWER_TOKENS = (88, 75, 96, 60)    # a last turn holds 19 blocks: 6 sessions overflow 63
PAUSE_S = 1.5


def chat(port: int, model: Path = MODEL) -> dict[str, int]:
    """Every turn of every session, round robin, against the server of ``model``; returns
    client request id -> the cached tokens the server reported for it."""
    from openai import OpenAI
    client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0,
                    timeout=300)
    said = {t: [] for t in TENANTS}           # each session's conversation so far
    seen: dict[str, int] = {}
    for turn in range(TURNS):
        for t, tenant in enumerate(TENANTS):
            prompt = said[tenant] + tokens_for(f"{tenant}.user{turn}", USER_TOKENS[turn],
                                               1000)
            xid = f"{tenant}-turn{turn}"
            r = client.completions.create(
                model=str(model), prompt=prompt, max_tokens=ANSWER_TOKENS[turn],
                temperature=0.0, extra_headers={"X-Request-Id": xid},
                extra_body={"cache_salt": tenant, "ignore_eos": True, "return_token_ids": True,
                            "vllm_xargs": {"psgate_group": tenant,
                                           "psgate_contract": "standard"}})
            answer = r.choices[0].model_extra["token_ids"]
            assert len(answer) == ANSWER_TOKENS[turn]
            said[tenant] = prompt + list(answer)
            details = r.usage.prompt_tokens_details
            seen[r.id + "-0"] = details.cached_tokens if details else 0
            # The replay's step cost model (vLLM's defaults, not fitted to this tiny model)
            # takes up to ~1 s for a turn the server ran in ~0.25 s: without a pause the
            # replayed turns would overlap (and pin blocks) where the server's did not.
            time.sleep(PAUSE_S)
    return seen


def serve_chat(d: Path, policy: str, model: Path = MODEL, max_model_len: int = 1024) -> dict:
    """The chat sessions served by ``model`` under ``policy`` with capture on: the capture
    (one file), and each request's cached tokens, session and turn by its capture id."""
    (d / "key.hex").write_text("5c" * 16 + "\n")
    seen = serve(d, {"PSGATE_POLICY": policy, "PSGATE_CAPTURE": str(d / "cap"),
                     "PSGATE_CAPTURE_KEY_FILE": str(d / "key.hex")},
                 partial(chat, model=model), max_model_len=max_model_len, model=model)[0]
    key = load_key(str(d / "key.hex"), unkeyed=False)
    files = json.loads((d / "cap" / "capture-summary.json").read_text())["files"]
    assert len(files) == 1
    return {"policy": policy, "trace": d / "cap" / files[0],
            "live": {pseudonym("r", xid, key): cached for xid, cached in seen.items()},
            "turn": {pseudonym("r", xid, key): int(xid.split("turn")[1][0])
                     for xid in seen},
            "session": {pseudonym("r", xid, key): xid.split("-turn")[0] for xid in seen}}


@pytest.fixture(scope="module", params=["lru", "prefixshield"])
def served(request, tmp_path_factory):
    return serve_chat(tmp_path_factory.mktemp(f"chat-{request.param}"), request.param)


def replayed(trace: Path, policy: str, out: Path, **kw) -> dict[str, int]:
    """The trace replayed under ``policy`` alone (``kw``: more ReplayConfig settings): each
    request's cached tokens."""
    api.replay(api.ReplayConfig(trace=str(trace), baseline=policy, candidate=policy,
                                capacity=BLOCKS, out=out, allow_unexercised=True, **kw))
    receipt = json.loads((out / "receipt.json").read_text())
    assert receipt["runs"]["baseline"]["metrics"]["totals"]["evictions"] > 0
    with open(out / "requests.csv") as f:
        return {r["id"]: int(r["cached_tokens"]) for r in csv.DictReader(f)
                if r["run"] == "baseline"}


def test_replay_with_answers_equals_the_server_on_every_turn(served, tmp_path):
    live = served["live"]
    lines = [json.loads(x) for x in served["trace"].read_text().splitlines()]
    reqs = {x["id"]: x for x in lines[1:] if x["op"] == "request"}
    dones = [x for x in lines[1:] if x["op"] == "done"]
    assert len(dones) == len(TENANTS) * TURNS
    for x in dones:     # every block the answer completed, and only those
        r = reqs[x["id"]]
        assert len(x.get("answer", [])) == (r["tail"] + x["out_observed"]) // BS
    got = replayed(served["trace"], served["policy"], tmp_path / "with")
    print(f"\n{served['policy']}: live cached tokens by turn "
          f"{[sum(v for i, v in live.items() if served['turn'][i] == k) for k in range(TURNS)]}")
    assert {i: got[i] for i in live} == live
    # the server hit answers: some follow-up turn got more than its previous prompt's blocks
    prompt_blocks = {}
    for x in lines[1:]:
        if x["op"] == "request":
            prompt_blocks[x["id"]] = len(x["blocks"])
    by_session = {}
    for i in sorted(live, key=lambda i: served["turn"][i]):
        by_session.setdefault(served["session"][i], []).append(i)
    assert any(live[b] > prompt_blocks[a] * BS for ids in by_session.values()
               for a, b in zip(ids, ids[1:]))


def test_the_same_replay_without_answers_disagrees_on_follow_ups(served, tmp_path):
    live = served["live"]
    bare = tmp_path / "bare.jsonl"
    bare.write_text("".join(
        json.dumps({k: v for k, v in json.loads(x).items() if k != "answer"}) + "\n"
        for x in served["trace"].read_text().splitlines()))
    got = replayed(bare, served["policy"], tmp_path / "without")
    wrong = [i for i in live if got[i] != live[i]]
    # first turns re-send nothing decoded, so only follow-ups can be wrong (either way:
    # with the answers recomputed, other blocks are evicted)
    assert wrong and all(served["turn"][i] > 0 for i in wrong)
    print(f"\n{served['policy']} without answers: {len(wrong)} of {len(live)} requests "
          f"disagree with the server")
