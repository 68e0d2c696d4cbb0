"""Importers of public traces (mooncake, weka, bailian) into psgate-trace v1."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from psgate import api
from psgate.contracts import CONTRACT_NAMES
from psgate.errors import InputError
from psgate.trace import validate_trace
from psgate.trace.importers import FORMATS, import_trace
from psgate.trace.writer import write_trace

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "examples" / "traces"
SHARED = Path(__file__).resolve().parents[3] / "shared" / "traces"
MOONCAKE_FULL = SHARED / "mooncake" / "mooncake_conversation_trace.jsonl"
WEKA_DIR = SHARED / "weka"

needs_shared = pytest.mark.shared     # skipped in a bare clone, required in CI (conftest.py)


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _validated(tmp_path: Path, lines: list[dict], name: str = "t.jsonl"):
    p = tmp_path / name
    write_trace(p, lines)
    header, summary = validate_trace(str(p))
    return p, header, summary


def _reqs(lines: list[dict]) -> dict[str, dict]:
    return {x["id"]: x for x in lines[1:]}


# ---------------------------------------------------------------------------------------
# The format table and options
# ---------------------------------------------------------------------------------------

def test_formats_table_names_formats_and_defaults():
    assert set(FORMATS) == {"mooncake", "weka", "bailian"}
    assert FORMATS["mooncake"].defaults["group_by"] == "none"
    assert FORMATS["mooncake"].defaults["native_block_size"] == 512
    assert FORMATS["weka"].defaults["group_by"] == "file"
    assert FORMATS["weka"].defaults["stagger_s"] == 0.0
    assert FORMATS["bailian"].defaults["group_by"] == "chat"
    assert FORMATS["bailian"].defaults["native_block_size"] == 16
    for f in FORMATS.values():
        for name, opt in f.options.items():
            assert opt.help, name


@pytest.mark.parametrize("fmt,opts,needle", [
    ("nope", {}, "unknown trace format 'nope'"),
    ("mooncake", {"colour": 1}, "unknown option 'colour'"),
    ("mooncake", {"block_size": 100}, "--block-size: block size 100 does not divide"),
    ("mooncake", {"block_size": "16"}, "--block-size: expected int"),
    ("mooncake", {"group_by": "tenant"}, "--group-by: expected none, root-block or hash-mod:N"),
    ("mooncake", {"group_by": "hash-mod:0"}, "--group-by: expected hash-mod:N"),
    ("mooncake", {"contract": "critical", "contracts_cycle": True}, "--contract: give either"),
    ("weka", {"group_by": "hash-mod:2"}, "--group-by: expected file, type or none"),
    ("bailian", {"group_by": "root-block"}, "--group-by: expected chat, type or none"),
    ("mooncake", {"answers": "guess"}, "--option answers: expected infer, found 'guess'"),
    ("mooncake", {"answers": "infer", "block_size": 64},
     "--option answers: answers=infer needs the source's native block size 512 (found 64)"),
])
def test_bad_options_are_input_errors(tmp_path, fmt, opts, needle):
    src = _jsonl(tmp_path / "x.jsonl", [{"timestamp": 0, "input_length": 512,
                                          "output_length": 1, "hash_ids": [0]}])
    with pytest.raises(InputError) as e:
        import_trace(fmt, src, **opts)
    assert needle in str(e.value)
    assert "\n" not in str(e.value)


def test_missing_source_is_input_error(tmp_path):
    with pytest.raises(InputError, match="no such file"):
        import_trace("mooncake", tmp_path / "absent.jsonl")
    with pytest.raises(InputError, match="no such file"):
        import_trace("weka", tmp_path / "absent")


# ---------------------------------------------------------------------------------------
# Mooncake
# ---------------------------------------------------------------------------------------

MC_ROWS = [
    {"timestamp": 0, "input_length": 1100, "output_length": 5, "hash_ids": [0, 1, 2]},
    {"timestamp": 0, "input_length": 1024, "output_length": 7, "hash_ids": [0, 1]},
    {"timestamp": 5, "input_length": 600, "output_length": 0, "hash_ids": [0, 3]},
    {"timestamp": 1250, "input_length": 300, "output_length": 2, "hash_ids": [4]},
]


def test_mooncake_hand_made_at_512(tmp_path):
    src = _jsonl(tmp_path / "mc.jsonl", MC_ROWS)
    lines = import_trace("mooncake", src)
    _, header, summary = _validated(tmp_path, lines)
    assert summary.num_requests == 4
    h = lines[0]
    assert h["block_size"] == 512 and h["source"] == "mooncake:mc.jsonl"
    assert h["hashing"].startswith("psgate-import-blake2b-128")
    assert h["import"]["format"] == "mooncake"
    assert h["import"]["options"] == {"block_size": 512, "group_by": "none",
                                      "contract": "standard", "contracts_cycle": False,
                                      "limit": None, "native_block_size": 512}
    assert h["import"]["tenant_rule"] == "one group 'all'"
    assert h["groups"] == {"all": {"contracts": ["standard"]}}
    r = _reqs(lines)
    assert [x["id"] for x in lines[1:]] == ["mc-1", "mc-2", "mc-3", "mc-4"]
    assert [x["t"] for x in lines[1:]] == [0.0, 0.0, 0.005, 1.25]
    # 1100 = 2 * 512 + 76: the third id covers a partial block -> tail, not a block
    assert len(r["mc-1"]["blocks"]) == 2 and r["mc-1"]["tail"] == 76
    assert r["mc-2"]["blocks"] == r["mc-1"]["blocks"] and r["mc-2"]["tail"] == 0
    assert r["mc-3"]["blocks"] == r["mc-1"]["blocks"][:1] and r["mc-3"]["tail"] == 88
    assert r["mc-4"]["blocks"] == [] and r["mc-4"]["tail"] == 300
    assert [x["out"] for x in lines[1:]] == [5, 7, 0, 2]
    for x in lines[1:]:
        assert x["op"] == "request" and x["group"] == "all" and x["contract"] == "standard"
        assert x["scope"] == "mooncake"
        for b in x["blocks"]:
            assert len(b) == 32 and b == b.lower() and int(b, 16) >= 0


def test_mooncake_split_into_16_token_blocks(tmp_path):
    src = _jsonl(tmp_path / "mc.jsonl", MC_ROWS)
    lines = import_trace("mooncake", src, block_size=16)
    _, header, summary = _validated(tmp_path, lines)
    assert header.block_size == 16
    r = _reqs(lines)
    # 32 sub-blocks per full id; the partial 76-token block gives 4 full sub-blocks + 12
    assert len(r["mc-2"]["blocks"]) == 64 and r["mc-2"]["tail"] == 0
    assert len(r["mc-1"]["blocks"]) == 64 + 4 and r["mc-1"]["tail"] == 12
    # identical prefixes give identical sub-block hashes
    assert r["mc-1"]["blocks"][:64] == r["mc-2"]["blocks"]
    assert r["mc-3"]["blocks"][:32] == r["mc-1"]["blocks"][:32]
    assert len(r["mc-3"]["blocks"]) == 32 + 88 // 16 and r["mc-3"]["tail"] == 88 % 16
    assert r["mc-3"]["blocks"][32] != r["mc-1"]["blocks"][32]
    assert len(set(r["mc-1"]["blocks"])) == 68
    assert len(r["mc-4"]["blocks"]) == 300 // 16 and r["mc-4"]["tail"] == 300 % 16
    # prompt tokens are preserved exactly by the split
    for row, x in zip(MC_ROWS, lines[1:]):
        assert len(x["blocks"]) * 16 + x["tail"] == row["input_length"]
    assert summary.num_distinct_blocks == 64 + 4 + 5 + 18
    assert lines[0]["import"]["options"]["block_size"] == 16


def test_mooncake_split_hashes_are_stable_and_16_vs_32_differ(tmp_path):
    src = _jsonl(tmp_path / "mc.jsonl", MC_ROWS)
    a = import_trace("mooncake", src, block_size=16)
    b = import_trace("mooncake", src, block_size=16)
    c = import_trace("mooncake", src, block_size=32)
    assert a == b
    assert len(_reqs(c)["mc-2"]["blocks"]) == 32
    assert _reqs(a)["mc-1"]["blocks"][0] != _reqs(c)["mc-1"]["blocks"][0]
    _validated(tmp_path, c)


def test_mooncake_group_by_rules_and_contract_cycle(tmp_path):
    rows = [
        {"timestamp": 0, "input_length": 1024, "output_length": 1, "hash_ids": [0, 7]},
        {"timestamp": 1, "input_length": 512, "output_length": 1, "hash_ids": [5]},
        {"timestamp": 2, "input_length": 1536, "output_length": 1, "hash_ids": [0, 7, 9]},
        {"timestamp": 3, "input_length": 1024, "output_length": 1, "hash_ids": [0, 12]},
        {"timestamp": 4, "input_length": 1024, "output_length": 1, "hash_ids": [6, 10]},
    ]
    src = _jsonl(tmp_path / "mc.jsonl", rows)
    lines = import_trace("mooncake", src, group_by="hash-mod:3")
    # k = hash_ids[1] mod 3, or hash_ids[0] mod 3 for a one-block request
    assert [x["group"] for x in lines[1:]] == ["g1", "g2", "g1", "g0", "g1"]
    assert "hash_ids[1] mod 3" in lines[0]["import"]["tenant_rule"]
    _validated(tmp_path, lines)
    lines = import_trace("mooncake", src, group_by="root-block")
    assert [x["group"] for x in lines[1:]] == ["root-0", "root-5", "root-0", "root-0", "root-6"]
    lines = import_trace("mooncake", src, group_by="none")
    assert {x["group"] for x in lines[1:]} == {"all"}
    lines = import_trace("mooncake", src, group_by="hash-mod:3", contracts_cycle=True)
    # groups in order of first appearance: g1, g2, g0 -> critical, standard, best-effort
    assert lines[0]["groups"] == {"g1": {"contracts": ["critical"]},
                                  "g2": {"contracts": ["standard"]},
                                  "g0": {"contracts": ["best-effort"]}}
    assert [x["contract"] for x in lines[1:]] == ["critical", "standard", "critical",
                                                  "best-effort", "critical"]
    assert lines[0]["import"]["options"]["contracts_cycle"] is True
    _validated(tmp_path, lines)
    lines = import_trace("mooncake", src, contract="best-effort")
    assert {x["contract"] for x in lines[1:]} == {"best-effort"}
    assert CONTRACT_NAMES == ("critical", "standard", "best-effort")


def test_mooncake_ties_keep_file_order_and_out_of_order_is_sorted(tmp_path):
    rows = [{"timestamp": ts, "input_length": 512, "output_length": 1, "hash_ids": [i]}
            for i, ts in enumerate([10, 10, 3, 10, 3])]
    lines = import_trace("mooncake", _jsonl(tmp_path / "mc.jsonl", rows))
    assert [x["id"] for x in lines[1:]] == ["mc-3", "mc-5", "mc-1", "mc-2", "mc-4"]
    _validated(tmp_path, lines)


def test_mooncake_limit_keeps_first_requests_in_time(tmp_path):
    src = _jsonl(tmp_path / "mc.jsonl", MC_ROWS)
    lines = import_trace("mooncake", src, limit=2)
    assert [x["id"] for x in lines[1:]] == ["mc-1", "mc-2"]
    assert lines[0]["import"]["source_requests"] == 4 and lines[0]["import"]["requests"] == 2
    _validated(tmp_path, lines)


def test_mooncake_prefix_inconsistent_input_is_rejected_with_file_line(tmp_path):
    rows = [
        {"timestamp": 0, "input_length": 1536, "output_length": 1, "hash_ids": [0, 1, 2]},
        {"timestamp": 1, "input_length": 512, "output_length": 1, "hash_ids": [8]},
        {"timestamp": 2, "input_length": 1536, "output_length": 1, "hash_ids": [0, 9, 2]},
    ]
    src = _jsonl(tmp_path / "bad.jsonl", rows)
    with pytest.raises(InputError) as e:
        import_trace("mooncake", src)
    msg = str(e.value)
    assert msg.startswith(f"{src}:3: field 'hash_ids': element 2: id 2 follows id 9 here "
                          f"but followed id 1 at line 1")
    assert e.value.line == 3 and e.value.field == "hash_ids"
    # a first block seen later after a parent
    rows[2]["hash_ids"] = [0, 8]
    rows[2]["input_length"] = 1024
    with pytest.raises(InputError, match=r"bad\.jsonl:3: field 'hash_ids': element 1: id 8 "
                                         r"follows id 0 here but followed nothing"):
        import_trace("mooncake", _jsonl(src, rows))


@pytest.mark.parametrize("row,field,needle", [
    ({"timestamp": 0, "input_length": 1100, "output_length": 1, "hash_ids": [0, 1]},
     "hash_ids", "expected ceil(1100/512) = 3 ids"),
    ({"timestamp": 0, "input_length": 1024, "output_length": 1, "hash_ids": [0, 1, 2]},
     "hash_ids", "expected ceil(1024/512) = 2 ids"),
    ({"timestamp": -1, "input_length": 512, "output_length": 1, "hash_ids": [0]},
     "timestamp", "expected a finite number >= 0"),
    ({"input_length": 512, "output_length": 1, "hash_ids": [0]}, "timestamp", "missing"),
    ({"timestamp": 0, "input_length": 0, "output_length": 1, "hash_ids": []},
     "input_length", "expected an integer >= 1"),
    ({"timestamp": 0, "input_length": 512, "output_length": 1.5, "hash_ids": [0]},
     "output_length", "expected an integer >= 0"),
    ({"timestamp": 0, "input_length": 512, "output_length": 1, "hash_ids": ["a"]},
     "hash_ids", "element 0: expected an integer >= 0"),
    ({"timestamp": 0, "input_length": 512, "output_length": 1, "hash_ids": 3},
     "hash_ids", "expected an array"),
])
def test_mooncake_bad_records_name_file_line_and_field(tmp_path, row, field, needle):
    good = {"timestamp": 0, "input_length": 512, "output_length": 1, "hash_ids": [0]}
    src = _jsonl(tmp_path / "mc.jsonl", [good, row])
    with pytest.raises(InputError) as e:
        import_trace("mooncake", src)
    assert str(e.value).startswith(f"{src}:2: field '{field}': ")
    assert needle in str(e.value)


def test_mooncake_bad_json_names_line(tmp_path):
    src = tmp_path / "mc.jsonl"
    src.write_text('{"timestamp": 0, "input_length": 512, "output_length": 1, "hash_ids": [0]}\n'
                   '\n{"timestamp": 1,\n')
    with pytest.raises(InputError, match=r"mc\.jsonl:3: invalid JSON"):
        import_trace("mooncake", src)
    src.write_text("[1, 2]\n")
    with pytest.raises(InputError, match=r"mc\.jsonl:1: expected a JSON object"):
        import_trace("mooncake", src)
    src.write_text("\n")
    with pytest.raises(InputError, match="no requests"):
        import_trace("mooncake", src)


def test_mooncake_sample_in_repo_imports_and_validates(tmp_path):
    src = SAMPLES / "mooncake_conversation_head.jsonl"
    assert sum(1 for _ in src.open()) == 300
    lines = import_trace("mooncake", src, group_by="hash-mod:4", contracts_cycle=True)
    _, _, summary = _validated(tmp_path, lines)
    assert summary.num_requests == 300
    assert len(lines[0]["groups"]) == 4
    _validated(tmp_path, import_trace("mooncake", src, block_size=32), "t32.jsonl")


@needs_shared
def test_mooncake_sample_is_an_unmodified_head_of_the_shared_trace():
    head = (SAMPLES / "mooncake_conversation_head.jsonl").read_bytes()
    assert MOONCAKE_FULL.read_bytes().startswith(head)
    assert (SAMPLES / "LICENSE").read_bytes() == (SHARED / "mooncake" / "LICENSE").read_bytes()
    for p in (SAMPLES / "weka").glob("*.json"):
        assert p.read_bytes() == (WEKA_DIR / p.name).read_bytes()


@needs_shared
def test_full_mooncake_conversation_trace_imports_and_validates_quickly(tmp_path):
    t0 = time.perf_counter()
    lines = import_trace("mooncake", MOONCAKE_FULL, group_by="hash-mod:8")
    p, header, summary = _validated(tmp_path, lines)
    elapsed = time.perf_counter() - t0
    assert summary.num_requests == 12031
    assert header.block_size == 512
    assert len(lines[0]["groups"]) == 8
    assert elapsed < 60, elapsed


# ---------------------------------------------------------------------------------------
# WEKA / kv-cache-tester
# ---------------------------------------------------------------------------------------

def _weka_req(t, n_in, ids, model="m-a", typ="n", out=10):
    return {"t": t, "type": typ, "model": model, "in": n_in, "out": out, "hash_ids": ids,
            "think_time": 0.0, "api_time": 1.0}


def _weka_file(path: Path, requests: list[dict], fid: str | None = None) -> Path:
    path.write_text(json.dumps({"id": fid or path.stem, "models": ["m-a"], "block_size": 64,
                                "hash_id_scope": "local", "requests": requests}))
    return path


def _weka_dir(tmp_path: Path) -> Path:
    d = tmp_path / "sessions"
    d.mkdir()
    _weka_file(d / "a.json", [
        _weka_req(0.0, 150, [1, 2]),                       # tail 150 - 128 = 22
        {"t": 10.0, "type": "subagent", "agent_id": "agent_001", "subagent_type": "Explore",
         "duration_ms": 5000, "models": ["m-b"], "requests": [
             _weka_req(0.0, 64, [3], model="m-b", typ="s"),
             _weka_req(2.5, 130, [3, 4], model="m-b", typ="s"),
         ]},
        _weka_req(20.0, 200, [1, 2, 5], typ="s"),
        _weka_req(21.0, 128, [1, 2], model="m-b"),         # same ids, another model
    ])
    _weka_file(d / "b.json", [
        _weka_req(0.0, 150, [1, 2]),                       # same local ids as a.json
        _weka_req(4.0, 64, [1]),
    ])
    (d / "LICENSE").write_text("not a session file")
    return d


def test_weka_hand_made_flattens_subagents_and_namespaces_ids(tmp_path):
    d = _weka_dir(tmp_path)
    lines = import_trace("weka", d, stagger_s=100)
    _, header, summary = _validated(tmp_path, lines)
    assert header.block_size == 64
    assert summary.num_requests == 7
    r = _reqs(lines)
    assert [(x["id"], x["t"]) for x in lines[1:]] == [
        ("a-0", 0.0), ("a-1.0", 10.0), ("a-1.1", 12.5), ("a-2", 20.0), ("a-3", 21.0),
        ("b-0", 100.0), ("b-1", 104.0)]
    # tail = in - 64 * len(hash_ids)
    assert len(r["a-0"]["blocks"]) == 2 and r["a-0"]["tail"] == 22
    assert len(r["a-1.1"]["blocks"]) == 2 and r["a-1.1"]["tail"] == 2
    assert r["a-2"]["blocks"][:2] == r["a-0"]["blocks"] and r["a-2"]["tail"] == 8
    # the same local ids in another file are other content
    assert set(r["b-0"]["blocks"]).isdisjoint(r["a-0"]["blocks"])
    assert r["b-1"]["blocks"] == r["b-0"]["blocks"][:1]
    # each model is its own scope, and its own hashes
    assert r["a-0"]["scope"] == "m-a" and r["a-1.0"]["scope"] == "m-b"
    assert r["a-3"]["scope"] == "m-b"
    assert set(r["a-3"]["blocks"]).isdisjoint(r["a-0"]["blocks"])
    assert r["a-1.1"]["blocks"][0] == r["a-1.0"]["blocks"][0]
    # groups: one per file by default
    assert {x["id"]: x["group"] for x in lines[1:]} == {
        "a-0": "a", "a-1.0": "a", "a-1.1": "a", "a-2": "a", "a-3": "a", "b-0": "b", "b-1": "b"}
    imp = lines[0]["import"]
    assert imp["nested_requests"] == 2
    assert imp["files"] == [
        {"file": "a.json", "id": "a", "offset_s": 0.0, "requests": 5, "nested_requests": 2},
        {"file": "b.json", "id": "b", "offset_s": 100.0, "requests": 2, "nested_requests": 0}]
    assert imp["options"]["stagger_s"] == 100.0 and imp["options"]["group_by"] == "file"
    assert lines[0]["source"] == "weka:sessions/ (2 session files)"


def test_weka_default_stagger_starts_every_session_at_zero(tmp_path):
    lines = import_trace("weka", _weka_dir(tmp_path))
    assert [x["id"] for x in lines[1:]] == ["a-0", "b-0", "b-1", "a-1.0", "a-1.1", "a-2", "a-3"]
    _validated(tmp_path, lines)


def test_weka_group_by_type_and_none_and_one_file(tmp_path):
    d = _weka_dir(tmp_path)
    lines = import_trace("weka", d, group_by="type", contracts_cycle=True)
    assert {x["id"]: x["group"] for x in lines[1:]}["a-1.0"] == "s"
    assert {x["group"] for x in lines[1:]} == {"n", "s"}
    assert lines[0]["groups"] == {"n": {"contracts": ["critical"]},
                                  "s": {"contracts": ["standard"]}}
    _validated(tmp_path, lines)
    lines = import_trace("weka", d, group_by="none")
    assert {x["group"] for x in lines[1:]} == {"all"}
    one = import_trace("weka", d / "b.json")
    assert [x["id"] for x in one[1:]] == ["b-0", "b-1"]
    assert one[0]["source"] == "weka:b.json"
    # the same file alone or in its directory gives the same hashes
    assert _reqs(one)["b-0"]["blocks"] == _reqs(lines)["b-0"]["blocks"]


def test_weka_split_to_16_hashes_uncovered_tokens_uniquely(tmp_path):
    lines = import_trace("weka", _weka_dir(tmp_path), block_size=16)
    _validated(tmp_path, lines)
    r = _reqs(lines)
    # 2 ids * 4 sub-blocks, then the 22 tokens no id covers: 1 unique block + tail 6
    assert len(r["a-0"]["blocks"]) == 9 and r["a-0"]["tail"] == 6
    assert r["a-2"]["blocks"][:8] == r["a-0"]["blocks"][:8]
    assert r["a-2"]["blocks"][8] != r["a-0"]["blocks"][8]
    assert lines[0]["import"]["unidentified_blocks"] == 1 + 0 + 0 + 0 + 0 + 1 + 0


def test_weka_prefix_inconsistent_file_is_rejected(tmp_path):
    d = tmp_path / "s"
    d.mkdir()
    f = _weka_file(d / "c.json", [_weka_req(0.0, 128, [1, 2]), _weka_req(1.0, 128, [3, 2])])
    with pytest.raises(InputError) as e:
        import_trace("weka", d)
    assert str(e.value).startswith(f"{f}: field 'requests[1].hash_ids': element 1: id 2 "
                                   f"follows id 3 here but followed id 1 at c.json requests[0]")


@pytest.mark.parametrize("req,field,needle", [
    ({"t": 0.0, "type": "n", "model": "m", "in": 200, "out": 1, "hash_ids": [1, 2]},
     "requests[0].hash_ids", "expected floor(200/64) = 3 ids"),
    ({"t": 0.0, "type": "n", "in": 64, "out": 1, "hash_ids": [1]},
     "requests[0].model", "expected a non-empty string"),
    ({"t": 0.0, "type": "subagent", "agent_id": "x"}, "requests[0].requests", "missing"),
    ({"t": 0.0, "type": "subagent", "requests": [{"t": 1.0, "model": "m", "in": 64,
                                                  "out": -1, "hash_ids": [1]}]},
     "requests[0].requests[0].out", "expected an integer >= 0"),
])
def test_weka_bad_requests_name_file_and_field(tmp_path, req, field, needle):
    f = _weka_file(tmp_path / "d.json", [req])
    with pytest.raises(InputError) as e:
        import_trace("weka", f)
    assert str(e.value).startswith(f"{f}: field '{field}': ")
    assert needle in str(e.value)


def test_weka_bad_files(tmp_path):
    (tmp_path / "e.json").write_text("{not json")
    with pytest.raises(InputError, match=r"e\.json: invalid JSON"):
        import_trace("weka", tmp_path / "e.json")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(InputError, match="no .json session files"):
        import_trace("weka", empty)


def test_weka_samples_in_repo_import_and_validate(tmp_path):
    lines = import_trace("weka", SAMPLES / "weka")
    _, _, summary = _validated(tmp_path, lines)
    assert len(lines[0]["groups"]) == 3
    assert summary.num_requests == sum(
        len(json.loads(p.read_text())["requests"]) for p in (SAMPLES / "weka").glob("*.json"))


@needs_shared
def test_weka_shared_sessions_with_nested_subagents(tmp_path):
    one = import_trace("weka", WEKA_DIR / "trace_0277.json")
    _validated(tmp_path, one)
    r = _reqs(one)
    raw = json.loads((WEKA_DIR / "trace_0277.json").read_text())
    sub = raw["requests"][1]
    assert sub["type"] == "subagent" and len(sub["requests"]) == 4
    assert r["trace_0277-1.3"]["t"] == round(sub["t"] + sub["requests"][3]["t"], 9)
    assert r["trace_0277-1.0"]["scope"] == "claude-haiku-4-5-20251001"
    assert one[0]["import"]["nested_requests"] == 44
    t0 = time.perf_counter()
    lines = import_trace("weka", WEKA_DIR, stagger_s=60)
    _, _, summary = _validated(tmp_path, lines, "all.jsonl")
    assert summary.num_requests == 2665 - 6 + 56
    assert lines[0]["import"]["nested_requests"] == 56
    assert len(lines[0]["groups"]) == 140
    assert time.perf_counter() - t0 < 60


# ---------------------------------------------------------------------------------------
# Alibaba Qwen / Bailian
# ---------------------------------------------------------------------------------------

def _bl(chat, parent, ts, n_in, ids, typ="text", turn=1, out=9):
    row = {"chat_id": chat, "timestamp": ts, "input_length": n_in, "output_length": out,
           "type": typ, "turn": turn, "hash_ids": ids}
    if parent is not ...:
        row["parent_chat_id"] = parent
    return row


BL_ROWS = [
    _bl(1, -1, 1000.5, 40, [10, 11]),                    # floor: 2 ids, 8 uncovered tokens
    _bl(2, 1, 1001.0, 70, [10, 11, 12, 13, 14], turn=2),  # ceil: last id covers 6 tokens
    _bl(4, ..., 1001.0, 16, [20], typ="image"),          # no parent field: a root
    _bl(3, 2, 1002.25, 80, [10, 11, 12, 13, 15], turn=3),
    _bl(5, 99, 1003.0, 32, [30, 31], typ="search"),      # parent outside the file
    _bl(6, 99, 1004.0, 48, [30, 31, 32], typ="search", turn=2),
    _bl(7, None, 1004.0, 5, [], typ="file"),             # null parent: a root; tail only
]


def test_bailian_fixture_imports_and_groups_by_root_chat(tmp_path):
    src = _jsonl(tmp_path / "qwen.jsonl", BL_ROWS)
    lines = import_trace("bailian", src)
    _, header, summary = _validated(tmp_path, lines)
    assert header.block_size == 16 and summary.num_requests == 7
    assert lines[0]["source"] == "bailian:qwen.jsonl"
    assert lines[0]["import"]["t0"] == 1000.5
    r = _reqs(lines)
    assert [(x["id"], x["t"]) for x in lines[1:]] == [
        ("bl-1", 0.0), ("bl-2", 0.5), ("bl-3", 0.5), ("bl-4", 1.75), ("bl-5", 2.5),
        ("bl-6", 3.5), ("bl-7", 3.5)]
    assert {x["id"]: x["group"] for x in lines[1:]} == {
        "bl-1": "chat-1", "bl-2": "chat-1", "bl-4": "chat-1", "bl-3": "chat-4",
        "bl-5": "chat-99", "bl-6": "chat-99", "bl-7": "chat-7"}
    assert len(r["bl-1"]["blocks"]) == 2 and r["bl-1"]["tail"] == 8
    assert len(r["bl-2"]["blocks"]) == 4 and r["bl-2"]["tail"] == 6
    assert r["bl-2"]["blocks"][:2] == r["bl-1"]["blocks"]
    assert r["bl-4"]["blocks"][:4] == r["bl-2"]["blocks"]
    assert r["bl-6"]["blocks"][:2] == r["bl-5"]["blocks"]
    assert r["bl-7"]["blocks"] == [] and r["bl-7"]["tail"] == 5
    assert {x["scope"] for x in lines[1:]} == {"bailian"}
    assert "root of the request's parent_chat_id chain" in lines[0]["import"]["tenant_rule"]


def test_bailian_group_by_type_and_split(tmp_path):
    src = _jsonl(tmp_path / "qwen.jsonl", BL_ROWS)
    lines = import_trace("bailian", src, group_by="type", contracts_cycle=True)
    assert lines[0]["groups"] == {"text": {"contracts": ["critical"]},
                                  "image": {"contracts": ["standard"]},
                                  "search": {"contracts": ["best-effort"]},
                                  "file": {"contracts": ["critical"]}}
    _validated(tmp_path, lines)
    lines = import_trace("bailian", src, block_size=8)
    _validated(tmp_path, lines, "t8.jsonl")
    r = _reqs(lines)
    assert len(r["bl-1"]["blocks"]) == 5 and r["bl-1"]["tail"] == 0   # 4 + 1 uncovered
    assert len(r["bl-2"]["blocks"]) == 8 and r["bl-2"]["tail"] == 6


def test_bailian_errors(tmp_path):
    rows = [_bl(1, -1, 0.0, 32, [1, 2]), _bl(2, 1, 1.0, 32, [1, 3]),
            _bl(3, 1, 2.0, 48, [4, 2, 5])]
    src = _jsonl(tmp_path / "q.jsonl", rows)
    with pytest.raises(InputError, match=r"q\.jsonl:3: field 'hash_ids': element 1: id 2 "
                                         r"follows id 4 here but followed id 1 at line 1"):
        import_trace("bailian", src)
    _jsonl(src, [_bl(1, -1, 0.0, 32, [1, 2]), _bl(1, -1, 1.0, 32, [1, 2])])
    with pytest.raises(InputError, match=r"q\.jsonl:2: field 'chat_id': duplicate chat_id 1"):
        import_trace("bailian", src)
    _jsonl(src, [_bl(1, 2, 0.0, 32, [1, 2]), _bl(2, 1, 1.0, 32, [1, 2])])
    with pytest.raises(InputError, match=r"q\.jsonl:1: field 'parent_chat_id': .*loops"):
        import_trace("bailian", src)
    _jsonl(src, [_bl(1, -1, 0.0, 40, [1])])
    with pytest.raises(InputError, match=r"q\.jsonl:1: field 'hash_ids': expected 2 or 3 ids"):
        import_trace("bailian", src)
    _jsonl(src, [{"timestamp": 0, "input_length": 16, "output_length": 1, "hash_ids": [1]}])
    with pytest.raises(InputError, match=r"q\.jsonl:1: field 'chat_id': missing"):
        import_trace("bailian", src)


# ---------------------------------------------------------------------------------------
# End to end: an imported trace through the replay gate
# ---------------------------------------------------------------------------------------

def test_imported_mooncake_sample_replays_through_the_gate(tmp_path):
    lines = import_trace("mooncake", SAMPLES / "mooncake_conversation_head.jsonl",
                         group_by="hash-mod:3", contracts_cycle=True)
    path = tmp_path / "mc.jsonl"
    write_trace(path, lines)
    biggest = max(-(-(len(x["blocks"]) * 512 + x["tail"] + x["out"]) // 512)
                  for x in lines[1:])
    result = api.replay(api.ReplayConfig(trace=str(path), baseline="lru",
                                         candidate="prefixshield", capacity=2 * biggest,
                                         out=tmp_path / "o"))
    assert result.passed, result.receipt["gate"]
    for run in ("baseline", "candidate"):
        assert result.receipt["runs"][run]["metrics"]["totals"]["evictions"] > 0
        assert result.receipt["runs"][run]["rejected_ids"] == []
    assert result.receipt["trace"]["source"] == "mooncake:mooncake_conversation_head.jsonl"
    assert (tmp_path / "o" / "receipt.json").is_file()


# ---------------------------------------------------------------------------------------
# answers=infer
# ---------------------------------------------------------------------------------------

def test_answers_infer_ties_a_next_turn_to_the_answer_it_re_sends(tmp_path):
    """c1 (ids 1 2, 1100 tokens, 500 out) is followed by c2, which re-sends it and its answer
    (1100 + 500 tokens fill blocks up to 3); ids 3 4 are new at c2, so block 2 (id 3) is
    c1's answer. x2 re-sends x1 but is shorter than x1's prompt and output: no answer."""
    rows = [{"timestamp": 0, "input_length": 1100, "output_length": 500, "hash_ids": [1, 2, 9]},
            {"timestamp": 1000, "input_length": 2000, "output_length": 10,
             "hash_ids": [1, 2, 3, 4]},
            {"timestamp": 2000, "input_length": 600, "output_length": 900, "hash_ids": [7, 8]},
            {"timestamp": 3000, "input_length": 1100, "output_length": 5, "hash_ids": [7, 8, 5]}]
    src = _jsonl(tmp_path / "mc.jsonl", rows)
    lines = import_trace("mooncake", src, answers="infer")
    _, header, summary = _validated(tmp_path, lines)
    r = _reqs(lines)
    assert r["mc-1"]["answer"] == [r["mc-2"]["blocks"][2]]
    assert all("answer" not in r[i] for i in ("mc-2", "mc-3", "mc-4"))
    imp = header.raw["import"]
    assert imp["answered_requests"] == 1 and imp["answer_blocks"] == 1
    assert imp["options"]["answers"] == "infer" and "answer_rule" in imp
    # without the option nothing changes, the header's options included
    plain = import_trace("mooncake", src)
    assert "answers" not in plain[0]["import"]["options"]
    assert all("answer" not in x for x in plain[1:])


@pytest.mark.parametrize("first", [
    # z extends id 1 with id 2 before a does: id 1 is a shared prefix, a branch point
    {"timestamp": 0, "input_length": 1024, "output_length": 1, "hash_ids": [1, 2]},
    # y holds id 3 after id 1 before b: b did not compute it, so it is not a's output
    {"timestamp": 0, "input_length": 1536, "output_length": 1, "hash_ids": [1, 3, 9]},
], ids=["branch-point", "seen-before"])
def test_answers_infer_skips_a_shared_prefix_and_blocks_seen_before(tmp_path, first):
    rows = [first,
            {"timestamp": 1000, "input_length": 512, "output_length": 600, "hash_ids": [1]},
            {"timestamp": 2000, "input_length": 1200, "output_length": 1, "hash_ids": [1, 3, 4]}]
    lines = import_trace("mooncake", _jsonl(tmp_path / "mc.jsonl", rows), answers="infer")
    assert all("answer" not in x for x in lines[1:])
    assert lines[0]["import"]["answered_requests"] == 0
    # b alone after a: the same blocks are a's answer
    lines = import_trace("mooncake", _jsonl(tmp_path / "mc2.jsonl", rows[1:]), answers="infer")
    assert _reqs(lines)["mc-1"]["answer"] == [_reqs(lines)["mc-2"]["blocks"][1]]
    _validated(tmp_path, lines)


def test_answers_infer_on_the_repository_samples_and_their_replay(tmp_path):
    """The WEKA sessions re-send each answer: most requests get one, the trace validates,
    and a step replay caches them (a follow-up hits more than without answers)."""
    lines = import_trace("weka", ROOT / "examples" / "traces" / "weka", answers="infer")
    p, header, summary = _validated(tmp_path, lines)
    imp = header.raw["import"]
    answered = sum(1 for x in lines[1:] if "answer" in x)
    assert answered == imp["answered_requests"] > len(lines[1:]) // 2
    cached = {}
    for name, trace in (("with", p), ("without", tmp_path / "bare.jsonl")):
        if name == "without":
            write_trace(trace, [{k: v for k, v in x.items() if k != "answer"} for x in lines])
        res = api.replay(api.ReplayConfig(trace=str(trace), baseline="lru", candidate="lru",
                                          capacity=8192, out=tmp_path / name,
                                          allow_unexercised=True))
        cached[name] = res.receipt["runs"]["baseline"]["metrics"]["totals"]["saved_prefill_tokens"]
    assert cached["with"] > cached["without"]
