"""trace redact: keyed chained hashes bound to the scope, and nothing raw survives."""

from __future__ import annotations

import json

import pytest

from psgate.trace import validate_trace

from test_cli import assert_one_line_error, psgate

CANARY_TOKENS = [987654321, 123456789, 555000111, 424242424]
SECRET_STRINGS = ["acme-secret-tenant", "model-canary-7b", "tok-rev-canary", "lora-canary",
                  "salt-canary", "req-canary-id-1", "req-canary-id-2", "req-canary-id-3"]


def raw_log(tmp_path):
    prompt = (CANARY_TOKENS * 8)[:32] + [11, 12, 13, 14, 15]
    lines = [
        {"t": 0.0, "id": "req-canary-id-1", "group": "acme-secret-tenant", "contract": "standard",
         "model": "model-canary-7b", "tokenizer": "tok-rev-canary", "adapter": "lora-canary",
         "cache_salt": "salt-canary", "prompt_token_ids": prompt, "out": 5},
        {"t": 0.5, "id": "req-canary-id-2", "group": "acme-secret-tenant", "contract": "standard",
         "model": "model-canary-7b", "tokenizer": "tok-rev-canary", "adapter": "lora-canary",
         "cache_salt": "salt-canary", "prompt_token_ids": prompt[:32], "out": 5, "done_t": 1.0},
        {"t": 0.6, "id": "req-canary-id-3", "group": "acme-secret-tenant", "contract": "standard",
         "model": "model-canary-7b", "tokenizer": "tok-rev-canary", "adapter": "other",
         "cache_salt": "salt-canary", "prompt_token_ids": prompt, "out": 5},
        {"t": 0.7, "op": "cancel", "id": "req-canary-id-3"},
    ]
    p = tmp_path / "raw.jsonl"
    p.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return p


def test_refuses_without_a_key(tmp_path):
    proc = psgate("trace", "redact", raw_log(tmp_path), "-o", tmp_path / "t.jsonl")
    assert_one_line_error(proc, 2, "no hash key", "--key-file", "--unkeyed")
    assert not (tmp_path / "t.jsonl").exists()


def test_redacted_trace_is_valid_chained_and_scope_bound(tmp_path):
    key = tmp_path / "k"
    key.write_text(b"0123456789abcdef-redaction-key".hex() + "\n")
    proc = psgate("trace", "redact", raw_log(tmp_path), "-o", tmp_path / "t.jsonl",
                  "--key-file", key)
    assert proc.returncode == 0, proc.stderr
    header, summary = validate_trace(str(tmp_path / "t.jsonl"))
    assert header.raw["redaction"]["key_fingerprint"] == json.loads(proc.stdout)["key_fingerprint"]
    lines = [json.loads(x) for x in (tmp_path / "t.jsonl").read_text().splitlines()[1:]]
    r1, r2, r3, cancel = lines
    assert len(r1["blocks"]) == 2 and r1["tail"] == 5
    assert r2["blocks"] == r1["blocks"] and r2["tail"] == 0     # same tokens, same scope
    assert not set(r3["blocks"]) & set(r1["blocks"])            # another adapter: no sharing
    assert r1["scope"] != r3["scope"] and r1["group"] == r2["group"]
    assert cancel == {"t": 0.7, "op": "cancel", "id": "r2"}
    # another key gives other hashes and pseudonyms
    key.write_text(b"fedcba9876543210-another-key".hex())
    psgate("trace", "redact", raw_log(tmp_path), "-o", tmp_path / "t2.jsonl", "--key-file", key)
    other = json.loads((tmp_path / "t2.jsonl").read_text().splitlines()[1])
    assert other["blocks"] != r1["blocks"] and other["group"] != r1["group"]


def test_canary_nothing_raw_in_any_output(tmp_path):
    """No token id, raw string or key byte appears in the trace, nor in a receipt,
    ledger, report or stdout/stderr produced from it."""
    key_bytes = b"KEYCANARY-0123456789abcdef"
    key = tmp_path / "k"
    key.write_text(key_bytes.hex())
    outputs = []
    proc = psgate("trace", "redact", raw_log(tmp_path), "-o", tmp_path / "t.jsonl",
                  "--key-file", key)
    outputs += [proc.stdout, proc.stderr]
    proc = psgate("replay", "--baseline", "lru", "--candidate", "lru",
                  "--trace", tmp_path / "t.jsonl", "--capacity", 4, "--out",
                  tmp_path / "o", "--allow-unexercised")
    assert proc.returncode in (0, 1), proc.stderr
    outputs += [proc.stdout, proc.stderr]
    proc = psgate("report", tmp_path / "o", "-o", tmp_path / "o" / "report.html")
    assert proc.returncode == 0, proc.stderr
    proc = psgate("explain", tmp_path / "o", "--request", "r0")
    outputs += [proc.stdout, proc.stderr]
    blob = "\n".join(outputs).encode()
    for f in [tmp_path / "t.jsonl", *sorted((tmp_path / "o").iterdir())]:
        blob += f.read_bytes()
    for s in SECRET_STRINGS:
        assert s.encode() not in blob, s
    for tok in CANARY_TOKENS:
        assert str(tok).encode() not in blob, tok
    assert key_bytes not in blob and key_bytes.hex().encode() not in blob


@pytest.mark.parametrize("line, field", [
    ({"t": 0, "group": "a", "contract": "standard", "prompt_token_ids": []}, "prompt_token_ids"),
    ({"t": 0, "group": "a", "contract": "standard", "prompt_token_ids": ["x"]},
     "prompt_token_ids"),
    ({"t": -1, "group": "a", "contract": "standard", "prompt_token_ids": [1]}, "t"),
    ({"t": 0, "contract": "standard", "prompt_token_ids": [1]}, "group"),
    ({"t": 0, "op": "cancel", "id": "nope"}, "id"),
    ({"t": 0, "group": "a", "contract": "standard", "prompt_token_ids": [1, 2],
      "retention": [{"start": 0, "end": 3, "priority": 50}]}, "retention[0].end"),
    ({"t": 0, "group": "a", "contract": "standard", "prompt_token_ids": [1],
      "retention_s": 0}, "retention_s"),
    ({"t": 0, "group": "a", "contract": "standard", "prompt_token_ids": [1], "out": 4,
      "output_token_ids": [1, "2"]}, "output_token_ids"),
    ({"t": 0, "group": "a", "contract": "standard", "prompt_token_ids": [1], "out": 1,
      "output_token_ids": [1, 2]}, "output_token_ids"),
])
def test_bad_raw_input(tmp_path, line, field):
    p = tmp_path / "raw.jsonl"
    p.write_text(json.dumps(line) + "\n")
    proc = psgate("trace", "redact", p, "-o", tmp_path / "t.jsonl", "--unkeyed")
    assert_one_line_error(proc, 2, f"raw.jsonl:1: field '{field}'")
    assert not (tmp_path / "t.jsonl").exists()


def test_redaction_and_the_writer_keep_retention_hints(tmp_path):
    """Hints say how long to keep tokens, not which: redaction keeps them as given, and the
    trace writer's round trip (read, write, read) gives the same events."""
    from psgate.trace import TraceReader, TraceSource
    from psgate.trace.writer import write_trace
    hints = {"retention": [{"start": 0, "end": 16, "priority": 90, "duration_s": 30.5},
                           {"start": 16, "end": None, "priority": 20, "duration_s": None}],
             "retention_s": 120, "priority": 70, "priority_until": 9.5}
    p = tmp_path / "raw.jsonl"
    p.write_text(json.dumps({"t": 0.0, "id": "x", "group": "acme", "contract": "standard",
                             "prompt_token_ids": list(range(40)), "out": 3, **hints}) + "\n")
    proc = psgate("trace", "redact", p, "-o", tmp_path / "t.jsonl", "--unkeyed")
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(x) for x in (tmp_path / "t.jsonl").read_text().splitlines()]
    assert {k: lines[1][k] for k in hints} == hints
    write_trace(tmp_path / "w.jsonl", lines)
    evs = []
    for path in (tmp_path / "t.jsonl", tmp_path / "w.jsonl"):
        with TraceReader(TraceSource.resolve(str(path))) as r:
            evs.append(next(iter(r.events())))
    assert evs[0].retention == evs[1].retention and len(evs[0].retention) == 2
    assert evs[0].retention_ns == evs[1].retention_ns == 120_000_000_000
    assert (validate_trace(str(tmp_path / "t.jsonl"))[1].canonical_sha256
            == validate_trace(str(tmp_path / "w.jsonl"))[1].canonical_sha256)


def test_output_token_ids_become_the_answer_a_later_turn_re_sends(tmp_path):
    """Turn 2's prompt is turn 1's prompt and output plus a question: the output's full
    blocks hash on from the prompt's, so turn 2's prompt blocks begin with turn 1's
    blocks and answer; no output token reaches the file."""
    prompt = (CANARY_TOKENS * 10)[:37]                  # 2 blocks and a tail of 5
    output = [900000 + i for i in range(40)]            # completes blocks 2 and 3 (77 tokens)
    common = {"group": "acme-secret-tenant", "contract": "standard", "model": "m"}
    lines = [{"t": 0, "id": "a", **common, "prompt_token_ids": prompt, "out": 40,
              "output_token_ids": output},
             {"t": 5, "id": "b", **common, "prompt_token_ids": prompt + output + [7] * 20,
              "out": 3, "output_token_ids": [1, 2]}]
    raw = tmp_path / "raw.jsonl"
    raw.write_text("".join(json.dumps(x) + "\n" for x in lines))
    proc = psgate("trace", "redact", raw, "-o", tmp_path / "t.jsonl", "--unkeyed")
    assert proc.returncode == 0, proc.stderr
    validate_trace(str(tmp_path / "t.jsonl"))
    text = (tmp_path / "t.jsonl").read_text()
    a, b = [json.loads(x) for x in text.splitlines()[1:]]
    assert len(a["blocks"]) == 2 and len(a["answer"]) == 2
    assert b["blocks"][:4] == a["blocks"] + a["answer"] and "answer" not in b
    assert "900000" not in text
