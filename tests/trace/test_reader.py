"""The trace reader: a bad-input matrix, valid-trace behaviour, and agreement with the schema.

Every malformed trace must end as one ``InputError`` naming ``file:line`` (and the field
where there is one), and the CLI must turn it into exit code 2 and a single stderr line.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import jsonschema
import orjson
import pytest
import rfc8785
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from psgate.errors import InputError
from psgate.trace import HashTable, RequestEvent, TraceReader, TraceSource, validate_trace

REPO = Path(__file__).resolve().parents[2]
HEADER = {"psgate_trace": 1, "block_size": 16}


def req(rid: str = "r1", t: float = 0.0, **kw) -> dict:
    ev = {"t": t, "op": "request", "id": rid, "group": "g", "contract": "c", "scope": "m1",
          "blocks": ["aa"], "tail": 1, "out": 4}
    ev.update(kw)
    return ev


def without(d: dict, *keys: str) -> dict:
    return {k: v for k, v in d.items() if k not in keys}


def jsonl(*items, final_newline: bool = True) -> bytes:
    """Lines from dicts (serialized) or bytes (taken as they are)."""
    parts = [x if isinstance(x, bytes) else
             json.dumps(x, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()
             for x in items]
    return b"\n".join(parts) + (b"\n" if final_newline else b"")


GROUPED = {**HEADER, "groups": {"g": {"contracts": ["c"]}, "h": {}}}

# (id, file bytes, offending line (None: the file as a whole), field (None: no field),
#  regex that must match the rest of the message after "path:line: [field 'x': ]")
BAD = [
    ("answer-not-array", jsonl(HEADER, req(answer="bb")), 2, "answer",
     r"^expected an array of block hashes, found a string$"),
    ("answer-bad-hash", jsonl(HEADER, req(answer=["bb", "XY"])), 2, "answer",
     r"^element 1: expected a lowercase hex string"),
    # 16 + 1 prompt tokens and 4 out fill no block past the prompt's one
    ("answer-too-long", jsonl(HEADER, req(answer=["bb"])), 2, "answer",
     r"^1 answer blocks, more than the request's prompt and out tokens fill beyond its "
     r"prompt blocks \(0\)$"),
    ("answer-other-parent", jsonl(HEADER, req(out=40, answer=["bb"]),
                                  req("r2", blocks=["cc", "bb"])), 3, "blocks",
     r"^block hash bb was seen earlier with parent aa; here its parent is cc$"),
    ("answer-parent-differs", jsonl(HEADER, req(blocks=["cc", "bb"]),
                                    req("r2", out=40, answer=["bb"])), 3, "answer",
     r"^block hash bb was seen earlier with parent cc; here its parent is aa$"),
    ("answer-twice", jsonl(HEADER, req(out=40, answer=["bb"]),
                           {"t": 1, "op": "done", "id": "r1", "answer": ["bb"]}), 3, "answer",
     r"^request 'r1' already carries its answer on its request line$"),
    ("answer-on-done-too-long", jsonl(HEADER, req(),
                                      {"t": 1, "op": "done", "id": "r1", "answer": ["bb"]}),
     3, "answer", r"^1 answer blocks, more than"),
    ("empty-file", b"", None, None, r"^empty file"),
    ("header-missing", jsonl(req()), 1, "psgate_trace", r"^missing"),
    ("header-version-2", jsonl({**HEADER, "psgate_trace": 2}), 1, "psgate_trace",
     r"newer than this psgate reads"),
    ("header-version-0", jsonl({**HEADER, "psgate_trace": 0}), 1, "psgate_trace",
     r"^expected 1, found 0$"),
    ("header-version-string", jsonl({**HEADER, "psgate_trace": "1"}), 1, "psgate_trace",
     r"found a string$"),
    ("header-version-float", jsonl({**HEADER, "psgate_trace": 1.0}), 1, "psgate_trace",
     r"found a number$"),
    ("block-size-missing", jsonl(without(HEADER, "block_size")), 1, "block_size",
     r"found nothing$"),
    ("block-size-zero", jsonl({**HEADER, "block_size": 0}), 1, "block_size", r"found 0$"),
    ("block-size-negative", jsonl({**HEADER, "block_size": -16}), 1, "block_size",
     r"found -16$"),
    ("block-size-float", jsonl({**HEADER, "block_size": 16.0}), 1, "block_size",
     r"found 16\.0$"),
    ("block-size-bool", jsonl({**HEADER, "block_size": True}), 1, "block_size",
     r"found True$"),
    ("block-size-too-big", jsonl({**HEADER, "block_size": 65537}), 1, "block_size",
     r"1\.\.65536, found 65537$"),
    ("header-hashing-not-string", jsonl({**HEADER, "hashing": 7}), 1, "hashing",
     r"expected a string"),
    ("header-groups-not-object", jsonl({**HEADER, "groups": ["g"]}), 1, "groups",
     r"expected an object, found an array$"),
    ("header-group-spec-not-object", jsonl({**HEADER, "groups": {"g": 5}}), 1, "groups.g",
     r"found an integer$"),
    ("header-contracts-not-list", jsonl({**HEADER, "groups": {"g": {"contracts": "c"}}}), 1,
     "groups.g.contracts", r"array of contract names"),
    ("header-partial-not-bool", jsonl({**HEADER, "partial": "yes"}), 1, "partial",
     r"expected a boolean"),
    ("header-is-array", jsonl(b"[1, 16]"), 1, None, r"expected a JSON object, found an array"),
    ("bad-json-middle", jsonl(HEADER, req("r1"), b'{"t": 1, "op": ', req("r2", 2.0)), 3, None,
     r"^invalid JSON"),
    ("truncated-last-line", jsonl(HEADER, req("r1"), b'{"t": 1.5, "op": "requ',
                                  final_newline=False), 3, None, r"^truncated"),
    ("non-utf8", jsonl(HEADER, b'{"t": 0, "op": "request", "id": "r\xff1"}'), 2, None,
     r"^invalid JSON.*UTF-8"),
    ("utf8-bom", b"\xef\xbb\xbf" + jsonl(HEADER), 1, None, r"^invalid JSON"),
    ("event-is-array", jsonl(HEADER, b'[0, "request"]'), 2, None,
     r"^expected a JSON object, found an array$"),
    ("event-is-number", jsonl(HEADER, b"42"), 2, None, r"found an integer$"),
    ("event-is-null", jsonl(HEADER, b"null"), 2, None, r"found null$"),
    ("empty-line", jsonl(HEADER, b"", req()), 2, None, r"^empty line"),
    ("whitespace-line", jsonl(HEADER, req(), b"  \t ", req("r2")), 3, None, r"^empty line"),
    ("trailing-blank-line", jsonl(HEADER, req(), b""), 3, None, r"^empty line"),
    ("nan-literal", jsonl(HEADER, b'{"t": NaN, "op": "request"}'), 2, None, r"^invalid JSON"),
    ("t-1e400", jsonl(HEADER, b'{"t": 1e400, "op": "cancel", "id": "x"}'), 2, None,
     r"^invalid JSON.*infinity"),
    # orjson reads an integer beyond 64 bits as a float: rejected as not an integer.
    ("out-2**70", jsonl(HEADER, req(out=2**70)), 2, None,
     r"^(field 'out': expected an integer|.*interchange range)"),
    ("out-2**53+1", jsonl(HEADER, req(out=2**53 + 1)), 2, None, r"interchange range"),
    ("t-negative", jsonl(HEADER, req(t=-0.5)), 2, "t", r"expected a time in 0\.\.4e\+09 seconds, found -0\.5$"),
    ("t-string", jsonl(HEADER, req(t="0")), 2, "t", r"found a string$"),
    ("t-bool", jsonl(HEADER, req(t=True)), 2, "t", r"found a boolean$"),
    ("t-null", jsonl(HEADER, req(t=None)), 2, "t", r"found null$"),
    ("t-missing", jsonl(HEADER, without(req(), "t")), 2, "t", r"^missing$"),
    ("time-backwards", jsonl(HEADER, req("r1", 2.0), req("r2", 1.999)), 3, "t",
     r"time goes backwards"),
    ("op-unknown", jsonl(HEADER, {**req(), "op": "evict"}), 2, "op", r"found 'evict'$"),
    ("op-missing", jsonl(HEADER, without(req(), "op")), 2, "op", r"found nothing$"),
    ("id-missing", jsonl(HEADER, without(req(), "id")), 2, "id", r"found nothing$"),
    ("id-not-string", jsonl(HEADER, req(rid=17)), 2, "id", r"found an integer$"),
    ("id-empty", jsonl(HEADER, req(rid="")), 2, "id", r"non-empty string"),
    ("duplicate-request-id", jsonl(HEADER, req("r1"), req("r2"), req("r1", 1.0)), 4, "id",
     r"duplicate request id 'r1'"),
    ("cancel-unknown-id", jsonl(HEADER, req("r1"), {"t": 1, "op": "cancel", "id": "r9"}), 3,
     "id", r"cancel of unknown request id 'r9'"),
    ("done-unknown-id", jsonl(HEADER, req("r1"), {"t": 1, "op": "done", "id": "r9"}), 3, "id",
     r"done of unknown request id 'r9'"),
    ("cancel-before-request", jsonl(HEADER, {"t": 0, "op": "cancel", "id": "r1"}, req("r1")),
     2, "id", r"cancel of unknown request id 'r1'"),
    ("cancel-id-with-newline", jsonl(HEADER, {"t": 0, "op": "cancel", "id": "x\npsgate: ok"}),
     2, "id", r"unknown request id 'x\npsgate: ok'"),
    ("cancel-id-emoji-code", jsonl(HEADER, {"t": 0, "op": "cancel", "id": ":thumbs_up:"}),
     2, "id", r"unknown request id ':thumbs_up:'"),
    ("hash-first-then-second", jsonl(HEADER, req("r1", blocks=["aa", "bb"]),
                                     req("r2", blocks=["bb"])), 3, "blocks",
     r"block hash bb was seen earlier with parent aa; here its parent is none"),
    ("hash-second-then-first", jsonl(HEADER, req("r1", blocks=["bb"]),
                                     req("r2", blocks=["aa", "bb"])), 3, "blocks",
     r"parent none \(a first block\); here its parent is aa$"),
    ("hash-two-parents", jsonl(HEADER, req("r1", blocks=["a1", "cc"]),
                               req("r2", blocks=["b2", "cc"])), 3, "blocks",
     r"block hash cc .*parent a1; here its parent is b2$"),
    ("hash-own-parent", jsonl(HEADER, req(blocks=["aa", "aa"])), 2, "blocks",
     r"block hash aa"),
    ("tail-equals-block-size", jsonl(HEADER, req(tail=16)), 2, "tail",
     r"0\.\.15 \(block_size 16\), found 16$"),
    ("tail-negative", jsonl(HEADER, req(tail=-1)), 2, "tail", r"found -1$"),
    ("tail-float", jsonl(HEADER, req(tail=1.0)), 2, "tail", r"found 1\.0$"),
    ("out-negative", jsonl(HEADER, req(out=-3)), 2, "out", r"expected an integer >= 0"),
    ("out-string", jsonl(HEADER, req(out="4")), 2, "out", r"found '4'$"),
    ("blocks-not-list", jsonl(HEADER, req(blocks="aa")), 2, "blocks",
     r"found a string$"),
    ("blocks-missing", jsonl(HEADER, without(req(), "blocks")), 2, "blocks", r"^missing$"),
    ("hash-uppercase", jsonl(HEADER, req(blocks=["aa", "9F1C"])), 2, "blocks",
     r"^element 1: .*found '9F1C'$"),
    ("hash-non-hex", jsonl(HEADER, req(blocks=["zz"])), 2, "blocks", r"^element 0: "),
    ("hash-empty-string", jsonl(HEADER, req(blocks=[""])), 2, "blocks", r"found ''$"),
    ("hash-too-long", jsonl(HEADER, req(blocks=["a" * 129])), 2, "blocks", r"1-128"),
    ("hash-integer", jsonl(HEADER, req(blocks=[12])), 2, "blocks", r"found 12$"),
    ("group-missing", jsonl(HEADER, without(req(), "group")), 2, "group", r"^missing$"),
    ("contract-missing", jsonl(HEADER, without(req(), "contract")), 2, "contract",
     r"^missing$"),
    ("scope-missing", jsonl(HEADER, without(req(), "scope")), 2, "scope", r"^missing$"),
    ("tail-missing", jsonl(HEADER, without(req(), "tail")), 2, "tail", r"^missing$"),
    ("out-missing", jsonl(HEADER, without(req(), "out")), 2, "out", r"^missing$"),
    ("group-empty", jsonl(HEADER, req(group="")), 2, "group", r"non-empty string"),
    ("scope-not-string", jsonl(HEADER, req(scope=3)), 2, "scope", r"found an integer$"),
    ("group-not-declared", jsonl(GROUPED, req(group="x")), 2, "group",
     r"group 'x' is not declared"),
    ("contract-not-declared", jsonl(GROUPED, req(contract="gold")), 2, "contract",
     r"contract 'gold' is not declared for group 'g'"),
    ("done-t-before-t", jsonl(HEADER, req(t=2.0, done_t=1.5)), 2, "done_t",
     r"expected a time >= t \(2\.0\), found 1\.5$"),
    ("done-t-string", jsonl(HEADER, req(done_t="3")), 2, "done_t", r"found '3'$"),
    ("duplicate-done", jsonl(HEADER, req("r1"), {"t": 1, "op": "done", "id": "r1"},
                             {"t": 2, "op": "done", "id": "r1"}), 4, "id",
     r"duplicate done for request 'r1'"),
    ("done-for-request-with-done-t", jsonl(HEADER, req("r1", done_t=0.5),
                                           {"t": 1, "op": "done", "id": "r1"}), 3, "id",
     r"already carries done_t"),
    ("measure-not-bool", jsonl(HEADER, req(measure=1)), 2, "measure",
     r"expected a boolean, found an integer$"),
    ("measure-string", jsonl(HEADER, req(measure="false")), 2, "measure", r"found a string$"),
    ("empty-prompt", jsonl(HEADER, req(blocks=[], tail=0)), 2, "blocks", r"^empty prompt"),
    ("priority-float", jsonl(HEADER, req(priority=1.5)), 2, "priority", r"found a number$"),
    ("priority-until-negative", jsonl(HEADER, req(priority=1, priority_until=-1)), 2,
     "priority_until", r"found -1$"),
    # retention hints (req(): one block + tail 1 = 17 prompt tokens)
    ("retention-not-array", jsonl(HEADER, req(retention={"start": 0})), 2, "retention",
     r"non-empty array of token ranges, found an object$"),
    ("retention-empty", jsonl(HEADER, req(retention=[])), 2, "retention",
     r"found an empty array$"),
    ("retention-range-not-object", jsonl(HEADER, req(retention=[3])), 2, "retention[0]",
     r"found an integer$"),
    ("retention-unknown-key", jsonl(HEADER, req(retention=[{"start": 0, "priority": 5,
                                                             "duration_ms": 9}])), 2,
     "retention[0]", r"unknown key 'duration_ms'"),
    ("retention-missing-priority", jsonl(HEADER, req(retention=[{"start": 0}])), 2,
     "retention[0].priority", r"^missing$"),
    ("retention-start-past-prompt", jsonl(HEADER, req(retention=[{"start": 17, "priority": 5}])),
     2, "retention[0].start", r"in 0\.\.16 \(the prompt has 17 tokens\), found 17$"),
    ("retention-start-negative", jsonl(HEADER, req(retention=[{"start": -1, "priority": 5}])),
     2, "retention[0].start", r"found -1$"),
    ("retention-end-past-prompt", jsonl(HEADER, req(retention=[{"start": 0, "end": 18,
                                                                 "priority": 5}])),
     2, "retention[0].end", r"in 1\.\.17 .*found 18$"),
    ("retention-start-not-before-end", jsonl(HEADER, req(retention=[
        {"start": 4, "end": 4, "priority": 5}])), 2, "retention[0].end", r"found 4$"),
    ("retention-priority-0", jsonl(HEADER, req(retention=[{"start": 0, "priority": 0}])), 2,
     "retention[0].priority", r"in 1\.\.100, found 0$"),
    ("retention-priority-101", jsonl(HEADER, req(retention=[{"start": 0, "priority": 101}])),
     2, "retention[0].priority", r"found 101$"),
    ("retention-duration-zero", jsonl(HEADER, req(retention=[
        {"start": 0, "priority": 5, "duration_s": 0}])), 2, "retention[0].duration_s",
     r"found 0$"),
    ("retention-duration-infinite", jsonl(HEADER, b'{"t":0,"op":"request","id":"r1",'
     b'"group":"g","contract":"c","scope":"m1","blocks":["aa"],"tail":1,"out":4,'
     b'"retention":[{"start":0,"priority":5,"duration_s":1e999}]}'), 2,
     None, r"."),
    ("retention-duration-string", jsonl(HEADER, req(retention=[
        {"start": 0, "priority": 5, "duration_s": "5"}])), 2, "retention[0].duration_s",
     r"found '5'$"),
    ("retention-overlap", jsonl(HEADER, req(retention=[
        {"start": 8, "end": 12, "priority": 5}, {"start": 0, "end": 9, "priority": 9}])), 2,
     "retention[0].start", r"overlaps retention\[1\] \(tokens 0\.\.9\)"),
    ("retention-overlap-open-end", jsonl(HEADER, req(retention=[
        {"start": 0, "end": None, "priority": 5}, {"start": 9, "priority": 9}])), 2,
     "retention[1].start", r"overlaps retention\[0\] \(tokens 0\.\.end\)"),
    ("retention-s-zero", jsonl(HEADER, req(retention_s=0)), 2, "retention_s", r"found 0$"),
    ("retention-s-negative", jsonl(HEADER, req(retention_s=-3)), 2, "retention_s",
     r"found -3$"),
    ("retention-s-string", jsonl(HEADER, req(retention_s="60")), 2, "retention_s",
     r"found '60'$"),
    ("retention-s-too-long", jsonl(HEADER, req(retention_s=5e9)), 2, "retention_s",
     r"found 5000000000\.0$"),
    ("prefill-ms-negative", jsonl(HEADER, req(prefill_ms=-0.1)), 2, "prefill_ms",
     r"found -0\.1$"),
    ("prefix-empty", jsonl(HEADER, req(prefix="")), 2, "prefix", r"non-empty string"),
    ("role-not-string", jsonl(HEADER, req(role=["victim"])), 2, "role", r"found an array$"),
    ("error-after-many-good-lines",
     jsonl(HEADER, *[req(f"r{i}", float(i), blocks=["aa", f"b{i}"]) for i in range(6)],
           req("r9", 9.0, tail=99)), 8, "tail", r"found 99$"),
]
BAD_IDS = [c[0] for c in BAD]
assert len(set(BAD_IDS)) == len(BAD_IDS)


def _expected_prefix(path: Path, line: int | None, field: str | None) -> str:
    where = f"{path}:{line}: " if line is not None else f"{path}: "
    return where + (f"field '{field}': " if field else "")


@pytest.mark.parametrize("case_id, content, line, field, pattern", BAD, ids=BAD_IDS)
def test_validate_trace_rejects(tmp_path, case_id, content, line, field, pattern):
    path = tmp_path / f"{case_id}.jsonl"
    path.write_bytes(content)
    with pytest.raises(InputError) as info:
        validate_trace(str(path))
    exc = info.value
    msg = str(exc)
    prefix = _expected_prefix(path, line, field)
    assert msg.startswith(prefix), msg
    assert re.search(pattern, msg[len(prefix):], re.DOTALL), msg
    assert exc.path == str(path)
    assert exc.line == line
    if field is not None:
        assert exc.field == field
    assert exc.exit_code == 2
    # the error is raised at the offending line, not later: the lines before it are fine
    if line is not None and line > 1:
        head = b"".join(content.splitlines(keepends=True)[: line - 1])
        ok = tmp_path / "head.jsonl"
        ok.write_bytes(head)
        validate_trace(str(ok))


def _check_cli_stderr(path: Path, rc, stdout: bytes | str, stderr: str) -> None:
    assert rc == 2, stderr
    assert "Traceback" not in stderr
    lines = stderr.splitlines()
    assert len(lines) == 1 and lines[0].strip(), stderr
    assert stderr.endswith("\n")
    assert not stdout
    # the same message validate_trace gives, with unprintable characters escaped
    with pytest.raises(InputError) as info:
        validate_trace(str(path))
    assert lines[0] == "psgate: error: " + str(info.value).replace("\n", "\\n")


@pytest.mark.parametrize("case_id, content, line, field, pattern", BAD, ids=BAD_IDS)
def test_cli_main_rejects(tmp_path, monkeypatch, capsys, case_id, content, line, field,
                          pattern):
    """Every class through the CLI's entry point in-process (sys.argv, typer, error handler)."""
    from psgate import cli

    path = tmp_path / f"{case_id}.jsonl"
    path.write_bytes(content)
    monkeypatch.setattr(sys, "argv", ["psgate", "validate", str(path)])
    with pytest.raises(SystemExit) as info:
        cli.main()
    out, err = capsys.readouterr()
    _check_cli_stderr(path, info.value.code, out, err)


# A start-up of the real CLI costs ~0.4 s, so the subprocess check runs on one member of each
# family of the matrix (all of them concurrently); test_cli_main_rejects covers every class.
SUBPROCESS_CASES = ["empty-file", "header-missing", "header-version-2", "block-size-float",
                    "bad-json-middle", "truncated-last-line", "non-utf8", "nan-literal",
                    "t-1e400", "out-2**70", "time-backwards", "duplicate-request-id",
                    "hash-two-parents", "cancel-id-with-newline", "cancel-id-emoji-code",
                    "group-not-declared", "empty-prompt", "error-after-many-good-lines"]
assert set(SUBPROCESS_CASES) <= set(BAD_IDS)


def _run_cli(path: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "COLUMNS")}
    env["PYTHONIOENCODING"] = "utf-8"
    return subprocess.run([sys.executable, "-m", "psgate.cli", "validate", str(path)],
                          capture_output=True, env=env, cwd=REPO, timeout=120)


@pytest.fixture(scope="module")
def cli_results(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli")
    paths = {}
    for case_id, content, *_ in BAD:
        if case_id in SUBPROCESS_CASES:
            paths[case_id] = d / f"{case_id}.jsonl"
            paths[case_id].write_bytes(content)
    with ThreadPoolExecutor(max_workers=max(2, (os.cpu_count() or 2) + 1)) as pool:
        futures = {cid: pool.submit(_run_cli, p) for cid, p in paths.items()}
        return {cid: (paths[cid], f.result()) for cid, f in futures.items()}


@pytest.mark.parametrize("case_id", SUBPROCESS_CASES)
def test_cli_subprocess_rejects(cli_results, case_id):
    path, proc = cli_results[case_id]
    _check_cli_stderr(path, proc.returncode, proc.stdout, proc.stderr.decode("utf-8"))


def test_cli_subprocess_accepts_valid_trace(tmp_path):
    path = tmp_path / "ok.jsonl"
    path.write_bytes(jsonl(HEADER, req("r1", blocks=["aa", "bb"]), req("r2", 1, blocks=["aa"])))
    proc = _run_cli(path)
    assert proc.returncode == 0, proc.stderr
    summary = orjson.loads(proc.stdout)
    assert (summary["requests"], summary["distinct_blocks"], summary["lines"]) == (2, 2, 3)
    assert summary["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()


def test_matrix_is_big_enough():
    assert len(BAD) >= 25


# -- valid traces --------------------------------------------------------------------------

def _write(tmp_path: Path, name: str, content: bytes) -> str:
    p = tmp_path / name
    p.write_bytes(content)
    return str(p)


def test_unknown_fields_accepted_and_preserved(tmp_path):
    header = {**HEADER, "hashing": "keyed-blake2b-128", "source": "unit",
              "x_vendor": {"nested": [1, 2.5, None, "s"]}, "comment": "kept"}
    path = _write(tmp_path, "t.jsonl", jsonl(
        header, req("r1", blocks=["aa", "bb"], x_trace_id="abc", weird=[{}]),
        {"t": 1, "op": "cancel", "id": "r1", "reason": "client went away"}))
    h, s = validate_trace(path)
    assert h.raw == header
    assert h.block_size == 16 and h.hashing == "keyed-blake2b-128" and h.source == "unit"
    assert h.groups is None and h.partial is False
    assert (s.num_lines, s.num_requests, s.num_cancels, s.num_dones) == (3, 1, 1, 0)
    assert s.num_distinct_blocks == 2
    assert s.num_skipped_unknown == 0


def test_partial_trace_counts_unknown_ids(tmp_path):
    content = jsonl({**HEADER, "partial": True},
                    {"t": 0, "op": "cancel", "id": "before-cut"},
                    {"t": 0.5, "op": "done", "id": "also-before"},
                    req("r1", 1.0),
                    {"t": 2, "op": "done", "id": "r1"},
                    {"t": 3, "op": "cancel", "id": "gone"})
    h, s = validate_trace(_write(tmp_path, "p.jsonl", content))
    assert h.partial is True
    assert s.num_skipped_unknown == 3
    assert (s.num_requests, s.num_cancels, s.num_dones) == (1, 0, 1)
    assert s.done_ids == frozenset({"r1"})
    # the same lines without partial: the first unknown id is an error
    with pytest.raises(InputError, match=r":2: field 'id': cancel of unknown request id"):
        validate_trace(_write(tmp_path, "np.jsonl", content.replace(b',"partial":true', b"")))


def test_partial_trace_still_rejects_other_errors(tmp_path):
    content = jsonl({**HEADER, "partial": True}, req("r1"), req("r1", 1.0))
    with pytest.raises(InputError, match=r":3: field 'id': duplicate request id"):
        validate_trace(_write(tmp_path, "p.jsonl", content))


def _canonical_sha(objs) -> str:
    return hashlib.sha256(b"".join(rfc8785.dumps(o) + b"\n" for o in objs)).hexdigest()


def test_canonical_digest_ignores_key_order_and_whitespace(tmp_path):
    objs = [{**HEADER, "source": "s", "x": {"b": 1, "a": [1, 2]}},
            req("r1", 0.25, blocks=["aa", "bb"], role="victim"),
            {"t": 1, "op": "cancel", "id": "r1"}]
    a = jsonl(*objs)
    b = (b'{ "block_size" : 16 , "x": {"a": [1,  2], "b": 1}, "source": "s",'
         b' "psgate_trace": 1 }\r\n'
         + orjson.dumps(dict(reversed(list(objs[1].items())))).replace(b",", b", ") + b"\n"
         + b'{"id":"r1",  "op":"cancel","t":1}')
    pa, pb = _write(tmp_path, "a.jsonl", a), _write(tmp_path, "b.jsonl", b)
    _, sa = validate_trace(pa)
    _, sb = validate_trace(pb)
    assert sa.canonical_sha256 == sb.canonical_sha256 == _canonical_sha(objs)
    assert sa.sha256 == hashlib.sha256(a).hexdigest()
    assert sb.sha256 == hashlib.sha256(b).hexdigest()
    assert sa.sha256 != sb.sha256


def test_canonical_digest_changes_with_a_value(tmp_path):
    base = [HEADER, req("r1", blocks=["aa"], out=4)]
    _, s1 = validate_trace(_write(tmp_path, "1.jsonl", jsonl(*base)))
    _, s2 = validate_trace(_write(tmp_path, "2.jsonl", jsonl(HEADER, req("r1", out=5))))
    _, s3 = validate_trace(_write(tmp_path, "3.jsonl", jsonl({**HEADER, "source": "x"},
                                                             base[1])))
    # an unknown field is part of the identity too
    _, s4 = validate_trace(_write(tmp_path, "4.jsonl", jsonl(HEADER, {**base[1], "z": 0})))
    digests = {s.canonical_sha256 for s in (s1, s2, s3, s4)}
    assert len(digests) == 4
    assert s1.canonical_sha256 == _canonical_sha(base)


def _block_ids(path: str, table: HashTable) -> list[list[int]]:
    with TraceReader(TraceSource.resolve(path), table) as r:
        return [ev.blocks for ev in r.events() if isinstance(ev, RequestEvent)]


def test_shared_hash_table_gives_same_ids(tmp_path):
    path = _write(tmp_path, "t.jsonl", jsonl(
        HEADER, req("r1", 0, blocks=["aa", "bb", "cc"]), req("r2", 1, blocks=["aa", "bb"]),
        req("r3", 2, blocks=["dd"]), req("r4", 3, blocks=["aa", "ee"])))
    table = HashTable()
    first = _block_ids(path, table)
    assert first == [[0, 1, 2], [0, 1], [3], [0, 4]]
    assert len(table) == 5
    second = _block_ids(path, table)
    assert second == first
    assert len(table) == 5
    assert list(table.parent) == [HashTable.ROOT, 0, 1, HashTable.ROOT, 0]
    _, s = validate_trace(path, table)
    assert s.num_distinct_blocks == 5


def test_integer_and_float_times_convert_to_ns(tmp_path):
    path = _write(tmp_path, "t.jsonl", jsonl(HEADER, req("r1", 0.1, done_t=0.3),
                                             req("r2", 2, priority=3, priority_until=2.5)))
    with TraceReader(TraceSource.resolve(path)) as r:
        evs = list(r.events())
    assert [e.t_ns for e in evs] == [100_000_000, 2_000_000_000]
    assert evs[0].done_ns == 300_000_000
    assert evs[1].priority_until_ns == 2_500_000_000
    assert evs[0].prompt_tokens == 17 and evs[0].measure is True


def test_missing_file_is_input_error(tmp_path):
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(InputError) as info:
        validate_trace(str(missing))
    assert str(info.value) == f"{missing}: no such file"


# -- the reader and the JSON Schema agree ---------------------------------------------------

SCHEMA = orjson.loads((REPO / "schemas" / "trace.schema.json").read_bytes())
REQUEST_VALIDATOR = jsonschema.Draft202012Validator(
    {"$ref": "#/$defs/request", "$defs": SCHEMA["$defs"]})
REQUIRED = SCHEMA["$defs"]["request"]["required"]
PROPERTIES = list(SCHEMA["$defs"]["request"]["properties"])

names = st.text(min_size=1, max_size=6)
hex_hash = st.text(alphabet="0123456789abcdef", min_size=1, max_size=12)
finite = st.floats(min_value=0, max_value=1e6, allow_nan=False, allow_infinity=False)
json_scalar = st.one_of(st.none(), st.booleans(), st.integers(-(2**40), 2**40),
                        st.floats(-1e6, 1e6, allow_nan=False), st.text(max_size=4))
any_json = st.one_of(json_scalar, st.lists(json_scalar, max_size=2),
                     st.dictionaries(st.text(max_size=3), json_scalar, max_size=2))
bad_hash = st.one_of(
    st.sampled_from(["", "AB", "9F1C", "xyz", "0x1f", " aa", "aa\n", "a" * 129, "ab-cd"]),
    hex_hash.map(str.upper).filter(lambda s: s != s.lower()),
    st.text(min_size=1, max_size=5).filter(lambda s: re.fullmatch(r"[0-9a-f]{1,128}", s) is None),
    st.integers(0, 255), st.none())


@st.composite
def valid_request(draw) -> dict:
    t = draw(finite)
    ev = {"t": t, "op": "request", "id": draw(names), "group": draw(names),
          "contract": draw(names), "scope": draw(st.text(max_size=4)),
          "blocks": draw(st.lists(hex_hash, max_size=4, unique=True)),
          "tail": draw(st.integers(0, 15)), "out": draw(st.integers(0, 10_000))}
    if not ev["blocks"] and ev["tail"] == 0:
        ev["tail"] = 1
    for key, strat in (("prefix", names), ("role", names), ("measure", st.booleans()),
                       ("priority", st.integers(-100, 100)), ("priority_until", finite),
                       ("done_t", finite.map(lambda d: t + d)), ("prefill_ms", finite),
                       ("retention", st.lists(st.fixed_dictionaries(
                           {"start": st.integers(0, 3), "priority": st.integers(1, 100)},
                           optional={"end": st.one_of(st.none(), st.integers(4, 8)),
                                     "duration_s": st.one_of(st.none(), st.floats(0.5, 9))}),
                           min_size=1, max_size=2)),
                       ("retention_s", st.floats(0.001, 1e6)),
                       ("answer", st.lists(hex_hash, max_size=2))):
        if draw(st.booleans()) and draw(st.booleans()):
            ev[key] = draw(strat)
    if draw(st.integers(0, 4)) == 0:
        ev[draw(st.sampled_from(["x_extra", "note", "tags"]))] = draw(any_json)
    return ev


@st.composite
def request_line(draw) -> dict:
    ev = draw(valid_request())
    kind = draw(st.sampled_from(["none", "drop", "wrong-type", "bad-hash", "negative",
                                 "empty-name", "op", "none"]))
    if kind == "drop":
        del ev[draw(st.sampled_from(REQUIRED))]
    elif kind == "wrong-type":
        ev[draw(st.sampled_from(PROPERTIES))] = draw(any_json)
    elif kind == "bad-hash":
        blocks = list(ev["blocks"])
        blocks.insert(draw(st.integers(0, len(blocks))), draw(bad_hash))
        ev["blocks"] = blocks
    elif kind == "negative":
        key = draw(st.sampled_from(["t", "tail", "out", "priority_until", "done_t",
                                    "prefill_ms"]))
        ev[key] = -draw(st.one_of(st.integers(1, 1000), st.floats(1e-6, 1e3)))
    elif kind == "empty-name":
        ev[draw(st.sampled_from(["id", "group", "contract", "prefix", "role"]))] = ""
    elif kind == "op":
        ev["op"] = draw(st.sampled_from(["cancel", "done", "Request", "", 1]))
    return ev


# Rules only the reader states (see the schema's description); a line the schema accepts may
# still fail one of these, and nothing else.
READER_ONLY_FIELDS = {"tail", "out", "priority", "blocks", "done_t", "answer"}


_BASE = req("r", 1.5, blocks=["ab"], tail=3, out=2, scope="")


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(request_line())
@example(_BASE)
@example({**_BASE, "blocks": ["ab", "CD"]})
@example({**_BASE, "blocks": ["ab\n"]})
@example({**_BASE, "group": ""})
@example({**_BASE, "id": ""})
@example({**_BASE, "role": ""})
@example(without(_BASE, "scope"))
@example({**_BASE, "tail": -1})
@example({**_BASE, "out": "2"})
@example({**_BASE, "t": -0.5})
@example({**_BASE, "op": "cancel"})
@example({**_BASE, "measure": 0})
@example({**_BASE, "priority": 1.5})
@example({**_BASE, "prefill_ms": -1})
@example({**_BASE, "tail": 16})
@example({**_BASE, "done_t": 1.0})
def test_reader_and_schema_agree_on_request_lines(ev):
    schema_errors = list(REQUEST_VALIDATOR.iter_errors(ev))
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "t.jsonl")
        with open(path, "wb") as fh:
            fh.write(jsonl(HEADER, ev))
        try:
            validate_trace(path)
            reader_error = None
        except InputError as exc:
            reader_error = exc
    if schema_errors:
        assert reader_error is not None, (ev, [e.message for e in schema_errors])
        assert reader_error.line == 2
    elif reader_error is not None:
        # schema-valid but rejected: only for a rule the schema cannot state
        assert reader_error.line == 2
        assert (reader_error.field in READER_ONLY_FIELDS
                or reader_error.field.startswith("retention[")), (ev, str(reader_error))
        if reader_error.field.startswith("retention["):
            return          # ranges inside the prompt, start < end, none overlapping
        if reader_error.field in ("out", "priority"):
            assert isinstance(ev[reader_error.field], float), (ev, str(reader_error))


def test_schema_agreement_examples():
    """Fixed points for the property test: both accept, both reject, reader-only rejects."""
    good = req(role="victim", done_t=1.0, prefill_ms=2.5, x_extra=[1])
    assert not list(REQUEST_VALIDATOR.iter_errors(good))
    assert list(REQUEST_VALIDATOR.iter_errors(without(good, "scope")))
    assert list(REQUEST_VALIDATOR.iter_errors(req(blocks=["AA"])))
    assert list(REQUEST_VALIDATOR.iter_errors(req(out=-1)))
    # reader-only rules: the schema accepts these
    assert not list(REQUEST_VALIDATOR.iter_errors(req(tail=16)))
    assert not list(REQUEST_VALIDATOR.iter_errors(req(t=2, done_t=1)))


# -- a later pass over a validated trace --------------------------------------------------
_VARIED = jsonl(
    {**HEADER, "partial": True},
    req("a", 0.0, blocks=["aa", "ab"], done_t=1.0),
    req("b", 0.5, blocks=["aa", "ac"], prefix="sys", role="victim", measure=False,
        priority=2, priority_until=3.0, prefill_ms=1.5,
        retention=[{"start": 16, "end": None, "priority": 90, "duration_s": 2.5},
                   {"start": 0, "end": 16, "priority": 60}], retention_s=30),
    req("c", 0.75, blocks=["ad"], tail=0, done_t=0.75),
    {"t": 0.8, "op": "cancel", "id": "b"},
    {"t": 0.9, "op": "done", "id": "zz"},          # unknown in a partial trace: skipped
    req("d", 1.0, blocks=["aa", "ab", "ae"], extra_field=1),
    {"t": 2.0, "op": "done", "id": "d"},
)


def _events(path: Path, validated=None):
    hashes = HashTable()
    header, summary = validate_trace(str(path), hashes)
    src = TraceSource(str(path), path)
    with TraceReader(src, hashes, validated=summary if validated else None) as r:
        events = list(r.events())
        return events, r.summary(), summary


@pytest.mark.parametrize("content", [_VARIED, jsonl(HEADER, req("x", blocks=["01"]))])
def test_a_validated_pass_reads_the_same_events(tmp_path, content):
    p = tmp_path / "t.jsonl"
    p.write_bytes(content)
    checked, s1, _ = _events(p)
    fast, s2, validated = _events(p, validated=True)
    assert fast == checked and len(fast) >= 1
    assert s2 == s1 == validated


@settings(max_examples=50, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=st.lists(st.tuples(st.integers(0, 3), st.integers(1, 4), st.booleans()),
                      min_size=1, max_size=30))
def test_a_validated_pass_agrees_on_random_traces(tmp_path, lines):
    items = [HEADER]
    for i, (g, n, done) in enumerate(lines):
        kw = {"done_t": i + 0.5} if done else {}
        items.append(req(f"r{i}", float(i), group=f"g{g}",
                         blocks=[f"{g:x}{j:x}" for j in range(n)], **kw))
        if not done and i % 3 == 0:
            items.append({"t": i + 0.25, "op": "cancel", "id": f"r{i}"})
    p = tmp_path / "t.jsonl"
    p.write_bytes(jsonl(*items))
    checked, s1, _ = _events(p)
    fast, s2, _ = _events(p, validated=True)
    assert fast == checked and s2 == s1


@pytest.mark.parametrize("change", [
    (b'"ab"', b'"ff"'),                       # a hash the validation pass never saw
    (b'"tail":1', b'"tail":"1"'),             # still JSON, no longer a valid field
    (b'{"t":0.8', b'{"t":0.8,'),             # no longer JSON
])
def test_a_trace_changed_after_validation_is_an_input_error(tmp_path, change):
    p = tmp_path / "t.jsonl"
    p.write_bytes(_VARIED)
    hashes = HashTable()
    _, summary = validate_trace(str(p), hashes)
    p.write_bytes(_VARIED.replace(*change))
    with TraceReader(TraceSource(str(p), p), hashes, validated=summary) as r:
        with pytest.raises(InputError, match="changed while it was being replayed"):
            for _ in r.events():
                pass


def test_replay_refuses_a_trace_rewritten_between_passes(tmp_path, monkeypatch):
    """Same length, same syntax, other bytes: only the file digest can tell."""
    from psgate import api
    p = tmp_path / "t.jsonl"
    trace = _VARIED.replace(b'"contract":"c"', b'"contract":"standard"')
    p.write_bytes(trace)
    real = api.validate_trace

    def validate_then_rewrite(*args, **kw):
        out = real(*args, **kw)
        p.write_bytes(trace.replace(b'"out":4', b'"out":5'))
        return out

    monkeypatch.setattr(api, "validate_trace", validate_then_rewrite)
    out = tmp_path / "out"
    with pytest.raises(InputError, match="changed while it was being replayed"):
        api.replay(api.ReplayConfig(trace=str(p), baseline="lru", candidate="lru",
                                    capacity=8, out=out))
    assert not out.exists()


def test_retention_hints_parsed_sorted_and_in_the_canonical_digest(tmp_path):
    from psgate.trace.model import RetentionRange
    ranges = [{"start": 16, "end": None, "priority": 90, "duration_s": 2.5},
              {"start": 0, "end": 16, "priority": 60}]
    path = _write(tmp_path, "h.jsonl", jsonl(HEADER, req(blocks=["aa", "ab"],
                                                          retention=ranges, retention_s=30)))
    with TraceReader(TraceSource.resolve(path)) as r:
        ev = next(iter(r.events()))
    assert ev.retention == (RetentionRange(0, 16, 60, None),
                            RetentionRange(16, None, 90, 2_500_000_000))
    assert ev.retention_ns == 30_000_000_000
    plain = _write(tmp_path, "p.jsonl", jsonl(HEADER, req(blocks=["aa", "ab"])))
    other = _write(tmp_path, "o.jsonl", jsonl(HEADER, req(blocks=["aa", "ab"],
                                                           retention=ranges, retention_s=31)))
    digests = {validate_trace(p)[1].canonical_sha256 for p in (path, plain, other)}
    assert len(digests) == 3


def test_retention_touching_ranges_are_not_overlapping(tmp_path):
    path = _write(tmp_path, "t.jsonl", jsonl(HEADER, req(retention=[
        {"start": 0, "end": 8, "priority": 5}, {"start": 8, "end": None, "priority": 9}])))
    validate_trace(path)


# -- answers ---------------------------------------------------------------------------------

def test_an_answer_chains_on_from_the_prompt_and_a_later_prompt_re_sends_it(tmp_path):
    p = tmp_path / "t.jsonl"
    p.write_bytes(jsonl(HEADER, req(out=40, answer=["bb", "cc"]),
                        req("r2", t=1, blocks=["aa", "bb", "cc", "dd"], tail=0)))
    hashes = HashTable()
    header, summary = validate_trace(str(p), hashes)
    with TraceReader(TraceSource(str(p), p), hashes) as r:
        r1, r2 = list(r.events())
    ids = hashes.ids
    assert r1.answer == [ids["bb"], ids["cc"]] and r2.blocks[:3] == [ids["aa"]] + r1.answer
    assert hashes.parent[ids["bb"]] == ids["aa"] and hashes.parent[ids["cc"]] == ids["bb"]
    assert summary.answers == {} and summary.num_distinct_blocks == 4


def test_a_done_lines_answer_reaches_its_request_on_a_validated_read(tmp_path):
    """A capture knows an answer only at the end: the done line carries it, and the replay's
    read (after the validating one) gives it to the request when it arrives."""
    p = tmp_path / "t.jsonl"
    p.write_bytes(jsonl(HEADER, req(out=40), req("r2", t=0.5),
                        {"t": 1, "op": "done", "id": "r1", "answer": ["bb", "cc"]},
                        {"t": 2, "op": "done", "id": "r2"}))
    hashes = HashTable()
    _, summary = validate_trace(str(p), hashes)
    assert summary.answers == {"r1": [hashes.ids["bb"], hashes.ids["cc"]]}
    with TraceReader(TraceSource(str(p), p), hashes, validated=summary) as r:
        evs = [e for e in r.events() if isinstance(e, RequestEvent)]
        assert r.summary().answers == summary.answers
    assert evs[0].answer == summary.answers["r1"] and evs[1].answer is None
    # an unvalidated read sees only what request lines carry
    with TraceReader(TraceSource(str(p), p), HashTable()) as r:
        assert [e.answer for e in r.events() if isinstance(e, RequestEvent)] == [None, None]


def test_a_partial_traces_done_for_an_unknown_request_drops_its_answer(tmp_path):
    p = tmp_path / "t.jsonl"
    p.write_bytes(jsonl({**HEADER, "partial": True}, req(),
                        {"t": 1, "op": "done", "id": "gone", "answer": ["ee"]}))
    hashes = HashTable()
    _, summary = validate_trace(str(p), hashes)
    assert summary.answers == {} and "ee" not in hashes.ids
