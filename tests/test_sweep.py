"""psgate sweep: cells, resumption, the process pool and Ray give the same table."""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import subprocess
import sys

import pytest

from psgate.errors import InputError
from psgate.sweep import SweepConfig, cells

from test_cli import assert_one_line_error, psgate

WL = "one-touch:attack_requests=30,warmup_s=2.0,cooldown_s=1.0"
ARGS = ["--workload", WL, "--baseline", "lru", "--axis", "capacity=512,1024", "--axis",
        "candidate=prefixshield,s3fifo", "--runs", "2", "--resamples", "300", "--quiet"]


def _table(out):
    with open(out / "table.csv") as fh:
        return list(csv.DictReader(fh))


def test_cells_are_deterministic_and_checked(tmp_path):
    cfg = SweepConfig(workload=WL, out=tmp_path, axes={"capacity": [512, 1024],
                                                       "alpha": [0.4, 0.8]})
    a = cells(cfg)
    assert [c["id"] for c in a] == [c["id"] for c in cells(cfg)]
    assert [(c["capacity"], c["params"]["alpha"]) for c in a] == [
        (512, 0.4), (512, 0.8), (1024, 0.4), (1024, 0.8)]
    assert len({c["id"] for c in a}) == 4
    for axes, needle in [({"nope": [1]}, "neither capacity"), ({"candidate": ["x"]}, "no such policy"),
                         ({"capacity": [1]}, "capacity values"), ({"seed": [1, 2]}, "seeds come")]:
        with pytest.raises(InputError, match=needle):
            cells(SweepConfig(workload=WL, out=tmp_path, axes=axes))
    with pytest.raises(InputError, match="at least 2 runs"):
        cells(SweepConfig(workload=WL, out=tmp_path, runs=1))


def test_local_sweep_table_and_resume(tmp_path):
    out = tmp_path / "s"
    proc = psgate("sweep", *ARGS, "--workers", "2", "--out", out, "--junit", tmp_path / "j.xml")
    assert proc.returncode == 0, proc.stderr
    junit = (tmp_path / "j.xml").read_text()
    assert junit.count("<testcase") == 4 and 'failures="0"' in junit
    assert "capacity=1024 candidate=s3fifo" in junit
    summary = json.loads(proc.stdout)
    assert summary == {"cells": 4, "resumed": 0, "table": str(out / "table.csv"),
                       "failed_gates": 0}
    rows = _table(out)
    assert [(r["capacity"], r["candidate"]) for r in rows] == [
        ("512", "prefixshield"), ("512", "s3fifo"), ("1024", "prefixshield"), ("1024", "s3fifo")]
    for r in rows:     # each row is read off that cell's own experiment receipt
        receipt = json.loads((out / "cells" / r["cell"] / "receipt.json").read_text())
        v = receipt["summary"]["roles"]["victim"]["hit_fraction"]
        assert float(r["role:victim.hit_fraction.diff_mean"]) == pytest.approx(v["diff_mean"])
        assert float(r["role:victim.hit_fraction.diff_ci_low"]) == pytest.approx(v["diff_ci_low"])
        assert receipt["config"]["candidate"]["name"] == r["candidate"]
        assert receipt["config"]["capacity"] == int(r["capacity"])
    before = (out / "table.csv").read_bytes()
    proc = psgate("sweep", *ARGS, "--out", out)
    assert json.loads(proc.stdout)["resumed"] == 4
    assert (out / "table.csv").read_bytes() == before
    # One cell lost (an interrupted run): only it is redone, with the same result.
    lost = rows[1]["cell"]
    (out / "cells" / lost / "receipt.json").unlink()
    proc = psgate("sweep", *ARGS, "--out", out)
    assert json.loads(proc.stdout)["resumed"] == 3
    assert (out / "table.csv").read_bytes() == before
    # A grid that grows redoes only its new cells.
    grown = [a if a != "capacity=512,1024" else "capacity=512,1024,2048" for a in ARGS]
    proc = psgate("sweep", *grown, "--out", out)
    assert json.loads(proc.stdout) ["resumed"] == 4 and len(_table(out)) == 6


def test_ray_executor_matches_the_process_pool(tmp_path):
    if importlib.util.find_spec("ray") is None:
        if os.environ.get("CI"):
            raise AssertionError("ray is in the test extra but not installed")
        pytest.skip("ray not installed (pip install 'psgate[ray]')")
    args = [a if a != "capacity=512,1024" else "capacity=512" for a in ARGS]
    local, ray = tmp_path / "local", tmp_path / "ray"
    assert psgate("sweep", *args, "--out", local).returncode == 0
    proc = psgate("sweep", *args, "--out", ray, "--executor", "ray", "--workers", "2",
                  env={"RAY_ADDRESS": ""})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (local / "table.csv").read_bytes() == (ray / "table.csv").read_bytes()


def test_sweep_errors(tmp_path):
    proc = psgate("sweep", "--workload", WL, "--baseline", "lru", "--candidate", "lru",
                  "--out", tmp_path / "o", "--executor", "slurm")
    assert_one_line_error(proc, 2, "--executor")
    proc = psgate("sweep", "--workload", WL, "--out", tmp_path / "o", "--axis", "capacity")
    assert_one_line_error(proc, 2, "--axis")
    code = ("import sys; sys.modules['ray'] = None; from psgate.cli import main; "
            "sys.argv[0] = 'psgate'; main()")
    proc = subprocess.run([sys.executable, "-c", code, "sweep", "--workload", WL, "--out",
                           str(tmp_path / "r"), "--executor", "ray", "--runs", "2",
                           "--baseline", "lru", "--candidate", "prefixshield"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3 and "pip install" in proc.stderr, proc.stderr


def test_creation_pressure_is_a_sweep_axis(tmp_path):
    cfg = SweepConfig(workload=WL, out=tmp_path, axes={"creation_pressure": [0.54, 4.23]})
    a = cells(cfg)
    assert [c["params"]["creation_pressure"] for c in a] == [0.54, 4.23]
    assert [c["axes"] for c in a] == [{"creation_pressure": 0.54}, {"creation_pressure": 4.23}]


def test_cell_ids_follow_the_code_that_computes_them(tmp_path, monkeypatch):
    import psgate.sweep as sw
    cfg = SweepConfig(workload=WL, out=tmp_path, axes={"capacity": [512]})
    (before,) = cells(cfg)
    assert before["code"] == sw.code_digest() and len(before["code"]) == 64
    monkeypatch.setattr(sw, "_CODE_DIGEST", "0" * 64)      # as if a policy had changed
    (after,) = cells(cfg)
    assert after["id"] != before["id"] and after["code"] == "0" * 64


def test_code_digest_covers_the_replay_path_only(tmp_path, monkeypatch):
    import psgate.sweep as sw
    root = tmp_path / "psgate"
    step_path = ("engines/sched.py", "engines/step_cost.py", "engines/pool.py",
                 "engines/base.py")
    for rel in ("sweep.py", "cli.py", "engines/sim.py", "engines/vllm_real.py",
                "policies/lru.py", "report/html.py", *step_path):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(f"# {rel}\n")
    monkeypatch.setattr(sw, "__file__", str(root / "sweep.py"))

    def digest():
        monkeypatch.setattr(sw, "_CODE_DIGEST", None)
        return sw.code_digest()

    base = digest()
    for rel in ("cli.py", "engines/vllm_real.py", "report/html.py"):
        (root / rel).write_text("# changed\n")
        assert digest() == base, rel
    for rel in ("engines/sim.py", "policies/lru.py", "sweep.py", *step_path):
        (root / rel).write_text(f"# changed {rel}\n")
        assert digest() != base, rel
        base = digest()


def _corpus(d, n=2):
    from psgate.trace.writer import write_trace
    from psgate.workloads import generate
    d.mkdir()
    for i in range(n):
        write_trace(d / f"t{i}.jsonl", generate("one-touch", {
            "seed": i, "attack_requests": 20, "warmup_s": 2.0, "cooldown_s": 1.0}))
    return d


def test_corpus_sweep_one_run_per_trace_and_resume(tmp_path):
    from psgate.sweep import run_cell, sweep
    corpus = _corpus(tmp_path / "corpus")
    cfg = SweepConfig(workload=None, corpus=corpus, out=tmp_path / "s",
                      axes={"candidate": ["prefixshield", "s3fifo"]}, resamples=300)
    specs = cells(cfg)
    assert [s["candidate"] for s in specs] == ["prefixshield", "s3fifo"]
    assert all(s["runs"] == 2 and sorted(s["traces"]) == ["t0.jsonl", "t1.jsonl"]
               for s in specs)
    rows = sweep(cfg)
    assert [r["resumed"] for r in rows] == [False, False]
    for r in rows:
        receipt = json.loads((tmp_path / "s" / "cells" / r["cell"] / "receipt.json").read_text())
        assert receipt["source"]["kind"] == "corpus"
        assert receipt["summary"]["num_runs"] == r["runs"] == 2
    assert [r["resumed"] for r in sweep(cfg)] == [True, True]
    # the same traces elsewhere: the same cell ids
    moved = tmp_path / "moved"
    corpus.rename(moved)
    assert [s["id"] for s in cells(SweepConfig(workload=None, corpus=moved, out=tmp_path,
                                               axes=cfg.axes, resamples=300))] == \
        [s["id"] for s in specs]
    # a trace changed after planning: refused, never replayed under the old digest
    (moved / "t1.jsonl").write_text((moved / "t0.jsonl").read_text())
    spec = dict(specs[0], corpus=str(moved))
    (tmp_path / "s" / "cells" / spec["id"] / "receipt.json").unlink()
    with pytest.raises(InputError, match="corpus changed"):
        run_cell(spec, str(tmp_path / "s"))


def test_corpus_sweep_errors(tmp_path):
    corpus = _corpus(tmp_path / "corpus")
    for kwargs, needle in [({"workload": WL}, "not both"),
                           ({"axes": {"alpha": [0.4]}}, "capacity and candidate")]:
        with pytest.raises(InputError, match=needle):
            cells(SweepConfig(**{"workload": None, "corpus": corpus, "out": tmp_path,
                                 **kwargs}))
    one = _corpus(tmp_path / "one", n=1)
    with pytest.raises(InputError, match="at least 2 traces"):
        cells(SweepConfig(workload=None, corpus=one, out=tmp_path))
    with pytest.raises(InputError, match="directory"):
        cells(SweepConfig(workload=None, corpus=tmp_path / "nope", out=tmp_path))
