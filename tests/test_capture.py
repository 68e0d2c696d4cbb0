"""The capture writer without vLLM: rotation, partial headers, drops, redaction."""

from __future__ import annotations

import json

import pytest

from psgate import api
from psgate.capture import CaptureWriter

KEY = bytes(range(32))
SECRET_TOKENS = [40961, 40962, 40963, 40964]


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def feed(w: CaptureWriter, clock: Clock, n: int) -> None:
    for i in range(n):
        clock.t += 0.5
        w.request(f"req-{i}", "acme-corp", "standard", ("model-x", "", "", "acme-corp"),
                  (SECRET_TOKENS * 10)[: 33 + i], 16)
        clock.t += 0.25
        if i % 5 == 4:
            w.cancel(f"req-{i}")
        else:
            w.done(f"req-{i}", 16 * (i % 3), 12.5, 16, 0)


def test_rotation_gives_valid_partial_traces_that_concatenate(tmp_path):
    clock = Clock()
    w = CaptureWriter(tmp_path, KEY, 16, max_bytes=2000, clock=clock)
    feed(w, clock, 30)
    summary = w.close()
    assert len(summary["files"]) >= 3 and summary["events_dropped"] == 0
    assert summary["requests"] == 30 and summary["events_written"] == 60
    assert not list(tmp_path.glob("*.part"))
    last_t = -1.0
    ops = {"request": 0, "done": 0, "cancel": 0}
    skipped = 0
    for name in summary["files"]:
        info = api.validate(str(tmp_path / name))       # each file is a trace on its own
        # a done or cancel whose request is in an earlier file is skipped (partial)
        skipped += info["skipped_unknown"]
        lines = [json.loads(x) for x in (tmp_path / name).read_text().splitlines()]
        assert lines[0]["partial"] is True and lines[0]["block_size"] == 16
        assert lines[1]["t"] >= last_t
        last_t = lines[-1]["t"]
        for line in lines[1:]:
            ops[line["op"]] += 1
        assert info["requests"] == sum(x["op"] == "request" for x in lines[1:])
    assert ops == {"request": 30, "done": 24, "cancel": 6}
    assert skipped <= len(summary["files"]) - 1     # at most one request split per rotation
    on_disk = json.loads((tmp_path / "capture-summary.json").read_text())
    assert on_disk == summary


def test_a_hybrid_models_groups_are_in_every_files_header(tmp_path):
    # a served hybrid-attention model's KV-cache groups (the plugin reads them from vLLM's
    # KV cache config): each rotated file says them, and only then
    clock = Clock()
    w = CaptureWriter(tmp_path / "h", KEY, 16, max_bytes=2000, clock=clock,
                      kv_groups="sliding:4096,full")
    feed(w, clock, 30)
    files = w.close()["files"]
    assert len(files) >= 3
    for name in files:
        header = json.loads((tmp_path / "h" / name).read_text().splitlines()[0])
        assert header["kv_groups"] == "sliding:4096,full"
    w = CaptureWriter(tmp_path / "one", KEY, 16, clock=clock)
    feed(w, clock, 2)
    name = w.close()["files"][0]
    assert "kv_groups" not in json.loads((tmp_path / "one" / name).read_text().splitlines()[0])


def test_rotation_by_age(tmp_path):
    clock = Clock()
    w = CaptureWriter(tmp_path, KEY, 16, max_seconds=5.0, clock=clock)
    feed(w, clock, 20)           # 0.75 s per request: 15 s of events
    assert len(w.close()["files"]) == 3


def test_a_full_queue_drops_and_counts_never_blocks(tmp_path):
    clock = Clock()
    w = CaptureWriter(tmp_path, KEY, 16, queue_size=4, clock=clock, start=False)
    feed(w, clock, 4)            # 8 events into a queue of 4: 4 dropped, none waited for
    assert w.num_dropped == 4
    summary = w.close()
    assert summary["events_dropped"] == 4
    lines = (tmp_path / summary["files"][0]).read_text().splitlines()
    assert json.loads(lines[0])["capture"]["dropped_before"] == 4
    api.validate(str(tmp_path / summary["files"][0]))


def test_no_token_or_tenant_text_in_the_files(tmp_path):
    clock = Clock()
    w = CaptureWriter(tmp_path, KEY, 16, clock=clock)
    feed(w, clock, 10)
    w.close()
    for f in tmp_path.iterdir():
        text = f.read_text()
        assert "acme" not in text and "req-" not in text and "model-x" not in text
        assert not any(str(t) in text for t in SECRET_TOKENS)


def test_capture_refuses_a_missing_or_short_key(tmp_path):
    with pytest.raises(ValueError, match="hash key"):
        CaptureWriter(tmp_path, b"short", 16, start=False)


def test_lines_reach_the_file_within_the_flush_interval(tmp_path):
    """A server killed outright keeps what the writer flushed: whole lines, at most
    flush_s seconds or flush_events events behind."""
    import time
    clock = Clock()
    w = CaptureWriter(tmp_path, KEY, 16, clock=clock, flush_s=0.2, flush_events=1000)
    feed(w, clock, 3)
    deadline = time.monotonic() + 10
    part = tmp_path / "capture-000001.jsonl.part"
    while time.monotonic() < deadline:
        text = part.read_text() if part.exists() else ""
        if text.count("\n") == 7:
            break
        time.sleep(0.05)
    assert text.count("\n") == 7 and text.endswith("\n")      # header + 6 whole lines
    w.close()
    w2 = CaptureWriter(tmp_path / "n", KEY, 16, clock=clock, flush_s=60, flush_events=4)
    feed(w2, clock, 3)                                         # 6 events, flushed at 4
    time.sleep(0.5)
    text = (tmp_path / "n" / "capture-000001.jsonl.part").read_text()
    assert text.count("\n") == 5
    w2.close()


def test_ids_are_keyed_pseudonyms_of_the_client_id_and_unique_in_a_file(tmp_path):
    from psgate.trace.redact import pseudonym
    clock = Clock()
    w = CaptureWriter(tmp_path, KEY, 16, clock=clock, t0=90.0, t0_unix=1234.5)
    for i in range(3):       # the client reused its id: the internal ids differ
        w.request(f"internal-{i}", "acme-corp", "standard", ("m", "", "", ""), [1] * 20, 4,
                  client_id="cmpl-client-7")
        w.done(f"internal-{i}", 0, 1.0, 4, 0)
    w.close()
    lines = [json.loads(x) for x in
             (tmp_path / "capture-000001.jsonl").read_text().splitlines()]
    assert lines[0]["capture"]["t0_unix"] == 1234.5
    assert lines[1]["t"] == 10.0                               # clock 100, zero at 90
    ids = [x["id"] for x in lines[1:] if x["op"] == "request"]
    base = pseudonym("r", "cmpl-client-7", KEY)
    assert ids == [base, f"{base}.2", f"{base}.3"]
    api.validate(str(tmp_path / "capture-000001.jsonl"))


def test_retention_hints_from_extra_args_are_written_and_bad_ones_left_out(tmp_path):
    clock = Clock()
    w = CaptureWriter(tmp_path, KEY, 16, clock=clock)
    ranges = [{"start": 0, "end": 16, "priority": 90, "duration_s": 60}]
    toks = list(range(40))
    w.request("a", "g", "standard", ("m", "", "", ""), toks, 4,
              extra_args={"psgate_retention": ranges, "psgate_retention_s": 300,
                          "psgate_group": "g"})
    clock.t += 1    # vllm_xargs can only carry the list as a JSON string, and numbers as text
    w.request("b", "g", "standard", ("m", "", "", ""), toks, 4,
              extra_args={"psgate_retention": json.dumps(ranges), "psgate_retention_s": "2.5"})
    clock.t += 1    # outside the prompt, and not a number: both left out, counted
    w.request("c", "g", "standard", ("m", "", "", ""), toks, 4,
              extra_args={"psgate_retention": [{"start": 99, "priority": 5}],
                          "psgate_retention_s": "soon"})
    clock.t += 1
    w.request("d", "g", "standard", ("m", "", "", ""), toks, 4)
    summary = w.close()
    assert summary["hints_dropped"] == 2
    path = tmp_path / summary["files"][0]
    api.validate(str(path))
    a, b, c, d = [json.loads(x) for x in path.read_text().splitlines()[1:]]
    assert a["retention"] == ranges and a["retention_s"] == 300
    assert b["retention"] == ranges and b["retention_s"] == 2.5
    assert "retention" not in c and "retention_s" not in c
    assert "retention" not in d and "retention_s" not in d


def _replay_cached(trace, tmp_path, name: str) -> dict[str, int]:
    """Each request's cached tokens in an LRU step replay of ``trace``, by id."""
    import csv

    out = tmp_path / name
    api.replay(api.ReplayConfig(trace=str(trace), baseline="lru", candidate="lru",
                                capacity=64, out=out))
    with open(out / "requests.csv") as fh:
        return {row["id"]: int(row["cached_tokens"]) for row in csv.DictReader(fh)
                if row["run"] == "baseline"}


def test_a_follow_up_turn_hits_the_answer_the_done_line_names(tmp_path):
    """Turn 2 re-sends turn 1's prompt and answer: the done line's answer chains on from
    the prompt as vLLM hashes the decoded blocks, so the replay hits them; without the
    answer it would recompute them."""
    from psgate.trace.hashing import chain_hashes
    from psgate.trace.redact import scope_root

    clock = Clock()
    cap = tmp_path / "cap"
    w = CaptureWriter(cap, KEY, 16, clock=clock)
    scope = ("model-x", "", "", "")
    turn1 = list(range(1000, 1037))                 # 37 tokens: 2 blocks and a tail of 5
    answer1 = list(range(2000, 2040))               # 40 tokens: full blocks 2..4 complete
    turn2 = turn1 + answer1 + list(range(3000, 3020))
    w.request("t1", "acme", "standard", scope, turn1, 40)
    clock.t += 10.0
    w.done("t1", 0, 5.0, 40, 0, answer1)
    clock.t += 1.0
    w.request("t2", "acme", "standard", scope, turn2, 8)
    clock.t += 10.0
    w.done("t2", 64, 5.0, 8, 0, list(range(4000, 4008)))
    summary = w.close()
    path = cap / summary["files"][0]
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    req1, done1, req2 = lines[1], lines[2], lines[3]
    whole = chain_hashes(turn1 + answer1, 16, KEY, parent=scope_root(scope, KEY))
    assert done1["answer"] == whole[2:] and len(whole) == 4
    assert req2["blocks"][:4] == req1["blocks"] + done1["answer"]
    # turn 2's 97 + 8 tokens complete no block past its 6 prompt blocks: no answer
    assert (len(turn2) + 8) // 16 == len(req2["blocks"]) == 6 and "answer" not in lines[4]
    cached = _replay_cached(path, tmp_path, "with")
    # turn 1 computed 76 tokens (its last sampled token is never computed): 4 full blocks
    assert cached == {req1["id"]: 0, req2["id"]: 64}
    bare = tmp_path / "bare.jsonl"
    bare.write_text("".join(json.dumps({k: v for k, v in x.items() if k != "answer"}) + "\n"
                            for x in lines))
    assert _replay_cached(bare, tmp_path, "without") == {req1["id"]: 0, req2["id"]: 32}
