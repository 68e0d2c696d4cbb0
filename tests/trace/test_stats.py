"""trace stats, and the importers checked against counts made directly on the sources.

The direct counts below read the source files with plain json and share no code
with psgate's importers: for each request in time order, the leading full blocks
already seen in its namespace (hits stop at prompt_tokens - 1, as in vLLM) over all
prompt tokens.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from psgate.trace.importers import import_trace
from psgate.trace.stats import trace_stats
from psgate.trace.writer import write_trace

from helpers import SAMPLES, shared_traces, write
from test_cli import psgate


def test_small_trace_exact(tmp_path):
    p = write(tmp_path, [
        {"t": 0, "id": "A", "blocks": ["a1", "a2"], "tail": 1},
        {"t": 1, "id": "B", "blocks": ["b1"], "tail": 1},
        {"t": 2, "id": "C", "blocks": ["a1", "a2"], "tail": 0},   # cap: only a1 hits
        {"t": 3, "id": "D", "blocks": ["a1", "a2"], "tail": 2},
    ])
    s = trace_stats(str(p))
    assert (s["requests"], s["block_references"], s["unique_blocks"]) == (4, 7, 3)
    assert s["infinite_cache_cached_tokens"] == 4 + 8
    assert s["infinite_cache_hit_ratio"] == round(12 / (9 + 5 + 8 + 10), 6)
    # distances: C's a1 saw {a2, b1} since (2), C's a2 saw {b1, a1} (2),
    # D's a1 saw {a2} (1), D's a2 saw {a1} (1)
    prof = {r["distance_ge"]: r["references"] for r in s["reuse_distance_profile"]}
    assert prof == {2: 2, 1: 2}
    assert s["per_group"]["g"]["created_blocks"] == 3


def test_answers_are_content_a_later_prompt_hits(tmp_path):
    # A's answer (e1, on its done line) is cached as it decodes: B re-sends a1 e1 and an
    # infinite cache serves both; the answer is A's group's creation, no prompt reference
    p = write(tmp_path, [
        {"t": 0, "id": "A", "blocks": ["a1"], "tail": 1, "out": 8},
        {"t": 1, "op": "done", "id": "A", "answer": ["e1"]},
        {"t": 2, "id": "B", "blocks": ["a1", "e1", "b1"], "tail": 1},
    ])
    s = trace_stats(str(p))
    assert (s["block_references"], s["unique_blocks"], s["answer_blocks"]) == (4, 3, 1)
    assert s["infinite_cache_cached_tokens"] == 8 and s["per_group"]["g"]["created_blocks"] == 3
    proc = psgate("trace", "stats", p)
    assert proc.returncode == 0 and "answer blocks" in proc.stdout + proc.stderr, proc.stderr


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(seq=st.lists(st.lists(st.sampled_from(["a", "b", "c", "d", "e"]), min_size=1,
                             max_size=4, unique=True), min_size=1, max_size=15))
def test_reuse_distance_matches_brute_force(tmp_path_factory, seq):
    """Stack distances from the Fenwick tree equal a direct O(n^2) count."""
    events = []
    for i, names in enumerate(seq):
        # distinct roots per name so any order is a valid chain of single blocks
        for j, n in enumerate(names):
            events.append({"t": i, "id": f"r{i}-{j}", "blocks": [f"{ord(n):x}"], "tail": 1})
    p = write(tmp_path_factory.mktemp("s"), events)
    refs = [e["blocks"][0] for e in events]
    want: dict[int, int] = {}
    for i, k in enumerate(refs):
        prev = max((j for j in range(i) if refs[j] == k), default=None)
        if prev is not None:
            d = len(set(refs[prev + 1:i]))
            b = d.bit_length()
            want[b] = want.get(b, 0) + 1
    got = {(r["distance_lt"]).bit_length() - 1 if r["distance_ge"] else 0: r["references"]
           for r in trace_stats(str(p))["reuse_distance_profile"]}
    assert got == want


def _direct_ratio(requests, bs):
    """requests: (namespace, prompt_tokens, full-block ids) in time order. A block is
    its whole prefix: node ids of a trie keyed (namespace, parent node, id)."""
    nodes: dict[tuple, int] = {}
    seen: set[int] = set()
    cached = total = 0
    for ns, prompt, ids in requests:
        cap = (prompt - 1) // bs
        hit, leading, parent = 0, True, -1
        for pos, x in enumerate(ids):
            node = nodes.setdefault((ns, parent, x), len(nodes))
            if leading and pos < cap and node in seen:
                hit += 1
            else:
                leading = False
            seen.add(node)
            parent = node
        cached += hit * bs
        total += prompt
    return round(cached / total, 6)


def _mooncake_direct(src: Path) -> float:
    rows = [json.loads(x) for x in src.read_text().splitlines() if x.strip()]
    rows = sorted(enumerate(rows), key=lambda r: (r[1]["timestamp"], r[0]))
    return _direct_ratio([("all", r["input_length"], r["hash_ids"][:r["input_length"] // 512])
                          for _, r in rows], 512)


def test_mooncake_sample_import_matches_direct_count(tmp_path):
    """The repository's Mooncake sample (the trace's first 300 lines), imported and replayed."""
    src = SAMPLES / "mooncake_conversation_head.jsonl"
    _imported_matches(tmp_path, "mooncake", src, _mooncake_direct(src), 2048, src.name)


@pytest.mark.shared
@pytest.mark.parametrize("name", ["mooncake_conversation_trace.jsonl",
                                  "mooncake_synthetic_trace.jsonl"])
def test_mooncake_full_import_matches_direct_count(tmp_path, name):
    """Extra check over the whole public traces: the ratio only (the replay of an import
    is covered on the sample above)."""
    src = shared_traces() / "mooncake" / name
    _imported_matches(tmp_path, "mooncake", src, _mooncake_direct(src), None, name)


def _imported_matches(tmp_path, fmt: str, src, direct: float, capacity: int | None,
                      name: str) -> None:
    """The imported trace's infinite-cache hit ratio equals the one counted straight from
    the source, and (given a capacity) the imported trace replays."""
    out = tmp_path / "imported.jsonl"
    write_trace(out, import_trace(fmt, src))
    got = trace_stats(str(out))["infinite_cache_hit_ratio"]
    print(f"\n{name}: infinite-cache hit ratio imported {got}, direct {direct}")
    assert got == direct
    if capacity is None:
        return
    proc = psgate("replay", "--trace", out, "--baseline", "lru", "--candidate", "lru",
                  "--capacity", capacity, "--out", tmp_path / "o", "--quiet")
    assert proc.returncode == 0, proc.stderr


def _weka_requests(path: Path):
    doc = json.loads(path.read_text())
    out = []

    def walk(reqs, t0):
        for r in reqs:
            if r.get("requests") is not None and "hash_ids" not in r:
                walk(r["requests"], t0 + r["t"])
            else:
                out.append((t0 + r["t"], r["model"], r["in"], r["hash_ids"]))
    walk(doc["requests"], 0.0)
    return doc["block_size"], out


def _weka_check(tmp_path, files: list[Path], capacity: int | None, name: str) -> None:
    import shutil
    src = tmp_path / "weka"
    src.mkdir()
    for f in files:
        shutil.copy(f, src / f.name)
    per_file = []
    for f in sorted(src.glob("*.json")):
        bs, reqs = _weka_requests(f)
        per_file += [(t, i, f.stem, m, n, ids) for i, (t, m, n, ids) in enumerate(reqs)]
    per_file.sort(key=lambda r: (r[0], r[2], r[1]))
    direct = _direct_ratio([((stem, m), n, ids) for _, _, stem, m, n, ids in per_file], 64)
    _imported_matches(tmp_path, "weka", src, direct, capacity, name)


def test_weka_sample_import_matches_direct_count(tmp_path):
    """The repository's WEKA sample (the 30 smallest session files), imported and replayed."""
    _weka_check(tmp_path, sorted((SAMPLES / "weka-small").glob("*.json")), 4096, "weka-small")


@pytest.mark.shared
def test_weka_full_import_matches_direct_count(tmp_path):
    """Extra check over the public sessions: every 7th file (20 of 140) plus the two with
    sub-agents; the whole directory gives 0.910717 both ways."""
    weka = shared_traces() / "weka"
    files = sorted(weka.glob("*.json"))[::7]
    for name in ("trace_0277.json", "trace_0291.json"):      # the ones with sub-agents
        if weka / name not in files:
            files.append(weka / name)
    _weka_check(tmp_path, files, None, "weka")


def test_stats_cli_json(tmp_path):
    proc = psgate("trace", "stats", "bundled:example", "--json")
    assert proc.returncode == 0
    s = json.loads(proc.stdout)
    assert s["requests"] == 282 and s["per_group"]["tenant-x"]["creation_pressure_ratio"] > 1


def test_stats_and_validate_read_a_capture_directory_as_replay_does(tmp_path):
    """replay --trace DIR replays each *.jsonl of a directory (a capture's rotated files,
    a corpus); validate and trace stats read the same directory, trace by trace, rather
    than refusing it."""
    cap = tmp_path / "capture"
    cap.mkdir()
    write(cap, [{"t": 0, "id": "A", "blocks": ["a1", "a2"], "tail": 1}],
          name="capture-000001.jsonl")
    write(cap, [{"t": 0, "id": "B", "blocks": ["b1"], "tail": 1},
                {"t": 1, "id": "C", "blocks": ["b1"], "tail": 1}], name="capture-000002.jsonl")
    (cap / "capture-summary.json").write_text("{}")          # not a trace: not read
    proc = psgate("validate", cap)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert [Path(t["path"]).name for t in doc["traces"]] == ["capture-000001.jsonl",
                                                             "capture-000002.jsonl"]
    assert doc["requests"] == 3
    proc = psgate("trace", "stats", cap, "--json")
    assert proc.returncode == 0, proc.stderr
    stats = json.loads(proc.stdout)["traces"]
    assert [stats[k]["requests"] for k in sorted(stats)] == [1, 2]
    assert stats[str(cap / "capture-000002.jsonl")]["unique_blocks"] == 1
    empty = tmp_path / "empty"
    empty.mkdir()
    for args in (("validate", empty), ("trace", "stats", empty)):
        proc = psgate(*args)
        assert proc.returncode == 2 and "no *.jsonl traces" in proc.stderr
