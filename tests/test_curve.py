"""psgate curve: lru's one pass equals api.replay at every capacity, per group; other
policies by replay; bad input is one line, exit 2."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from psgate import curve
from psgate.bench.traces import write_reuse_trace
from psgate.errors import InputError
from psgate.trace.importers import import_trace

ROOT = Path(__file__).resolve().parents[1]
MOONCAKE = ROOT / "examples" / "traces" / "mooncake_conversation_head.jsonl"


@pytest.fixture(scope="module")
def reuse_trace(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("curve") / "reuse.jsonl"
    write_reuse_trace(path, 1500, 16, 200, groups=6, prefixes=4)
    return str(path)


@pytest.fixture(scope="module")
def mooncake_trace(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("curve") / "mooncake.jsonl"
    lines = import_trace("mooncake", MOONCAKE, block_size=16)
    path.write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in lines))
    return str(path)


def _same_as_replay(trace: str, caps: list[int], policy: str = "lru") -> None:
    doc = curve.capacity_curve(trace, [policy], caps)
    points = doc["policies"][policy]["points"]
    assert [p["capacity"] for p in points] == caps
    for p in points:
        if policy == "lru":
            assert p["method"] == "one-pass", p
        r = curve.replay_point(trace, policy, p["capacity"])
        assert p["totals"] == r["totals"], p["capacity"]
        assert p["groups"] == r["groups"], p["capacity"]
        assert p["roles"] == r["roles"], p["capacity"]


def test_lru_one_pass_equals_replay_generated(reuse_trace):
    caps = [200, 256, 300, 384, 512, 640, 800, 1024, 1500, 2048, 4096, 16384]
    one = curve.lru_one_pass(reuse_trace, caps)
    assert one["inexact"] == {}
    assert len({p["totals"]["saved_prefill_tokens"] for p in one["points"]}) > 3
    assert len(one["points"][0]["groups"]) == 6
    _same_as_replay(reuse_trace, caps)


def test_lru_one_pass_equals_replay_mooncake(mooncake_trace):
    caps = curve.parse_capacities("7600:65536:12")
    assert len(caps) == 12
    _same_as_replay(mooncake_trace, caps)


def test_below_peak_is_reported_and_replayed(mooncake_trace):
    caps = [1024, 8192]
    one = curve.lru_one_pass(mooncake_trace, caps)
    assert one["peak_pinned_blocks"] >= 1024
    assert one["inexact"] == {1024: curve.BELOW_PEAK}
    doc = curve.capacity_curve(mooncake_trace, ["lru"], caps)
    entry = doc["policies"]["lru"]
    low, high = entry["points"]
    assert low["method"] == "replay" and low["reason"] == curve.BELOW_PEAK
    assert high["method"] == "one-pass"
    assert entry["min_one_pass_capacity"] == one["peak_pinned_blocks"] + 1
    r = curve.replay_point(mooncake_trace, "lru", 1024)
    assert low["totals"] == r["totals"] and low["groups"] == r["groups"]


def test_arc_by_replay_equals_replay(reuse_trace):
    _same_as_replay(reuse_trace, [256, 512, 2048], policy="arc")


def test_target_capacity(reuse_trace):
    doc = curve.capacity_curve(reuse_trace, ["lru"], [256, 1024, 16384], target=0.3)
    entry = doc["policies"]["lru"]
    tc = entry["target_capacity"]
    for g, c in tc["groups"].items():
        fr = [p["groups"][g]["hit_fraction"] for p in entry["points"]]
        caps = [p["capacity"] for p in entry["points"]]
        want = next((cap for cap, f in zip(caps, fr) if f >= 0.3), None)
        assert c == want


def test_deterministic_json(reuse_trace, tmp_path):
    def run() -> bytes:
        return subprocess.run(
            [sys.executable, "-m", "psgate", "curve", "--trace", reuse_trace, "--policy", "lru",
             "--capacities", "256:4096", "--json", "-o", str(tmp_path / "c.csv"), "--force"],
            capture_output=True, check=True).stdout
    a, b = run(), run()
    assert a == b
    doc = orjson.loads(a)
    assert doc["replay_model"]["scheduler"] == "service"
    assert [p["capacity"] for p in doc["policies"]["lru"]["points"]] == [256, 512, 1024, 2048,
                                                                         4096]
    rows = (tmp_path / "c.csv").read_text().splitlines()
    assert rows[0].startswith("policy,capacity,method,scope,name,hit_fraction")
    assert len(rows) == 1 + 5 * (1 + 6)


def _curve_json(trace: str, *extra: str, env: dict | None = None) -> bytes:
    p = subprocess.run([sys.executable, "-m", "psgate", "curve", "--trace", trace, "--policy",
                        "lru,arc", "--capacities", "64,256,1024", "--json", *extra],
                       capture_output=True, env=env)
    assert p.returncode == 0, p.stderr.decode()[-2000:]
    return p.stdout


def test_the_curve_is_the_same_on_one_worker_on_two_and_on_ray(reuse_trace):
    """The per-capacity replays (arc, and lru below its peak pinned demand) come back in
    the jobs' order whichever executor ran them: the JSON is byte-identical."""
    one = _curve_json(reuse_trace)
    methods = {p["method"] for e in orjson.loads(one)["policies"].values()
               for p in e["points"]}
    assert methods == {"one-pass", "replay"}
    assert _curve_json(reuse_trace, "--workers", "2") == one
    if importlib.util.find_spec("ray") is None:
        if os.environ.get("CI"):
            raise AssertionError("ray is in the test extra but not installed")
        pytest.skip("ray not installed (pip install 'psgate[ray]')")
    env = {**os.environ, "RAY_ADDRESS": ""}
    assert _curve_json(reuse_trace, "--executor", "ray", "--workers", "2", env=env) == one


def test_html_page_draws_every_scope_and_tables_the_targets(reuse_trace, tmp_path):
    """--html: one self-contained page (no external reference) with the all-requests and
    per group plots (per role where the trace names roles), the target capacities of the JSON, byte-identical when run
    again; an --html naming the --output file is refused before any work."""
    pytest.importorskip("matplotlib")
    page = tmp_path / "curve.html"
    doc = orjson.loads(_curve_json(reuse_trace, "--html", str(page), "--target", "0.3"))
    text = page.read_text()
    roles = any(p["roles"] for e in doc["policies"].values() for p in e["points"])
    assert not roles            # the reuse trace names groups only: no per-role plot
    assert 'id="plot-curve-roles"' not in text
    for pid in ("curve-totals", "curve-groups"):
        assert f'id="plot-{pid}"' in text, pid
    # SVG namespaces name URIs; nothing is fetched
    assert "@import" not in text and "url(http" not in text and "<script src" not in text
    assert "<link" not in text and "<img" not in text
    for name, entry in doc["policies"].items():
        for g, cap in entry["target_capacity"]["groups"].items():
            want = "-" if cap is None else str(cap)
            assert f"<tr><td>{name}</td><td>group</td><td>{g}</td><td>{want}</td></tr>" in text
    first = page.read_bytes()
    _curve_json(reuse_trace, "--html", str(page), "--target", "0.3", "--force")
    assert page.read_bytes() == first
    p = subprocess.run([sys.executable, "-m", "psgate", "curve", "--trace", reuse_trace,
                        "--capacities", "64:128", "--html", str(tmp_path / "c.csv"), "-o",
                        str(tmp_path / "c.csv")], capture_output=True, text=True)
    assert p.returncode == 2 and "--html is the --output file" in p.stderr
    assert not (tmp_path / "c.csv").exists()


@pytest.mark.parametrize("args", [
    ["--capacities", "64:128", "--executor", "slurm"],
    ["--capacities", "64:128", "--workers", "0"],
    ["--capacities", "512,256"],
    ["--capacities", "1:64"],
    ["--capacities", "64:32"],
    ["--capacities", "abc"],
    ["--capacities", "64:128", "--policy", "no-such-policy"],
    ["--capacities", "64:128", "--target", "1.5"],
    ["--capacities", "64:128", "--target", "0"],
])
def test_bad_input_is_one_line_exit_2(reuse_trace, args):
    p = subprocess.run([sys.executable, "-m", "psgate", "curve", "--trace", reuse_trace, *args],
                       capture_output=True, text=True)
    assert p.returncode == 2, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr


def test_parse_capacities():
    assert curve.parse_capacities("256:2048") == [256, 512, 1024, 2048]
    assert curve.parse_capacities("100,200,300") == [100, 200, 300]
    assert curve.parse_capacities("2:4:3") == [2, 3, 4]
    with pytest.raises(InputError):
        curve.parse_capacities("2:4:1")


def test_without_numpy_the_command_says_what_to_install(monkeypatch):
    """numpy is the curve extra's (psgate[curve]), not the base install's: without it the
    command is exit 3 with the install line, never a traceback."""
    from psgate import curve
    from psgate.errors import EngineUnavailable
    monkeypatch.setattr(curve, "np", None)
    with pytest.raises(EngineUnavailable, match=r"pip install 'psgate\[curve\]'"):
        curve.capacity_curve("bundled:example", ["lru"], [64, 256])
