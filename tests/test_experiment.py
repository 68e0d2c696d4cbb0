"""Matched runs, bootstrap intervals, corpus replays and the gate's paired statistics."""

from __future__ import annotations

import hashlib
import json
import random
import statistics
from pathlib import Path

import pytest

from psgate.experiment import derive_seed, parse_workload
from psgate.receipt.receipt import deterministic_part, dumps
from psgate.resources import first_schema_error
from psgate.stats.bootstrap import bootstrap_ci, paired_summary
from psgate.trace.writer import write_trace
from psgate.workloads import generate

from test_cli import assert_one_line_error, psgate, small_trace

SMALL = "one-touch:attack_requests=40,warmup_s=2.0,cooldown_s=1.0"


def test_seeds_and_workload_specs():
    seeds = [derive_seed(7, i) for i in range(50)]
    assert len(set(seeds)) == 50 and all(0 <= s < 2**31 for s in seeds)
    assert seeds == [derive_seed(7, i) for i in range(50)]
    assert not set(seeds) & {derive_seed(8, i) for i in range(50)}
    assert parse_workload("sharegpt:tenant_contracts=[\"critical\",\"standard\"],load=0.4") == (
        "sharegpt", {"tenant_contracts": ["critical", "standard"], "load": 0.4})
    assert parse_workload("cold") == ("cold", {})


def test_bootstrap_interval_exact_small_case():
    # Two values: resampled means are 0, 0.5, 1 with probabilities 1/4, 1/2, 1/4, so the
    # 2.5% and 97.5% percentiles are exactly 0 and 1.
    assert bootstrap_ci([0.0, 1.0], 10_000, random.Random(0)) == (0.0, 1.0)
    assert bootstrap_ci([3.0] * 5, 1000, random.Random(0)) == (3.0, 3.0)
    assert bootstrap_ci([1.0], 1000, random.Random(0)) is None
    a = bootstrap_ci([0.1, 0.4, 0.2, 0.9], 2000, random.Random(5))
    assert a == bootstrap_ci([0.1, 0.4, 0.2, 0.9], 2000, random.Random(5))
    assert a[0] <= statistics.mean([0.1, 0.4, 0.2, 0.9]) <= a[1]


def test_paired_summary_of_one_run_has_no_interval():
    m = {"totals": {"hit_fraction": 0.5}, "groups": {}, "roles": {"victim": {"hit_fraction": 0.2}}}
    c = {"totals": {"hit_fraction": 0.6}, "groups": {}, "roles": {"victim": {"hit_fraction": 0.5}}}
    s = paired_summary([m], [c], 1000, 0)
    v = s["roles"]["victim"]["hit_fraction"]
    assert v["n"] == 1 and v["diff_mean"] == pytest.approx(0.3) and v["diff_ci_low"] is None
    assert v["rel_diff_mean"] == pytest.approx(1.5)


def _experiment(tmp_path, name, *extra):
    out = tmp_path / name
    proc = psgate("replay", "--workload", SMALL, "--runs", "3", "--seed", "7", "--baseline",
                  "lru", "--candidate", "prefixshield", "--out", out, "--resamples", "1000",
                  "--quiet", *extra)
    return proc, out


def test_matched_runs_end_to_end(tmp_path):
    proc, out = _experiment(tmp_path, "e")
    assert proc.returncode == 0, proc.stderr
    r = json.loads((out / "receipt.json").read_text())
    assert first_schema_error(r, "experiment") is None
    assert [x["seed"] for x in r["runs"]] == [derive_seed(7, i) for i in range(3)]
    assert len({x["trace"]["canonical_sha256"] for x in r["runs"]}) == 3
    diffs = []
    for x in r["runs"]:
        run = json.loads((out / x["receipt"]).read_text())
        assert hashlib.sha256(dumps(deterministic_part(run))).hexdigest() == x["receipt_sha256"]
        assert run["trace"]["canonical_sha256"] == x["trace"]["canonical_sha256"]
        kind, params = parse_workload(SMALL)
        lines = generate(kind, {**params, "seed": x["seed"]})
        assert x["trace"]["path"] == f"traces/{x['id']}.jsonl"
        assert (out / x["trace"]["path"]).read_text().count("\n") == len(lines)
        b = run["runs"]["baseline"]["metrics"]["roles"]["victim"]["hit_fraction"]
        c = run["runs"]["candidate"]["metrics"]["roles"]["victim"]["hit_fraction"]
        diffs.append(c - b)
    v = r["summary"]["roles"]["victim"]["hit_fraction"]
    assert v["n"] == 3 and v["diff_mean"] == pytest.approx(statistics.mean(diffs), abs=1e-9)
    assert v["diff_ci_low"] <= v["diff_mean"] <= v["diff_ci_high"]
    assert min(diffs) - 1e-9 <= v["diff_ci_low"] and v["diff_ci_high"] <= max(diffs) + 1e-9
    rows = (out / "runs.csv").read_text().splitlines()
    assert rows[0].startswith("run,seed,policy_role,policy,scope,hit_fraction")
    assert sum(",role:victim," in row for row in rows) == 6
    names = [c["name"] for c in r["gate"]["checks"]]
    assert names[:3] == [f"run-00{i}: every default check passed" for i in range(3)]
    assert names[3:] and all(n.startswith("non-regression ") for n in names[3:])
    # Same inputs, same bytes (outside environment), ledgers included.
    proc2, out2 = _experiment(tmp_path, "e2")
    r2 = json.loads((out2 / "receipt.json").read_text())
    strip = lambda d: {k: v for k, v in d.items() if k != "environment"}  # noqa: E731
    assert json.dumps(strip(r2)) == json.dumps(strip(r))
    assert (out / "runs.csv").read_bytes() == (out2 / "runs.csv").read_bytes()
    for x in r["runs"]:
        run_dir = Path(x["receipt"]).parent
        assert (out / run_dir / "ledger.compact.csv.gz").read_bytes() == \
            (out2 / run_dir / "ledger.compact.csv.gz").read_bytes()


def _gate(tmp_path, stat, op, ref):
    g = tmp_path / f"gate-{stat}.toml"
    g.write_text(f'[[check]]\nmetric = "hit_fraction"\nselect = "role:victim"\nstat = "{stat}"\n'
                 f'op = "{op}"\nref = {ref}\n')
    return g


def test_gate_checks_on_confidence_intervals(tmp_path):
    g = _gate(tmp_path, "diff_ci_low", ">", 0)
    proc, out = _experiment(tmp_path, "e", "--gate", g)
    r = json.loads((out / "receipt.json").read_text())
    check = r["gate"]["checks"][-1]
    v = r["summary"]["roles"]["victim"]["hit_fraction"]
    assert check["stat"] == "diff_ci_low" and check["observed"] == v["diff_ci_low"]
    assert check["verdict"] == ("pass" if v["diff_ci_low"] > 0 else "fail")
    assert proc.returncode == (0 if v["diff_ci_low"] > 0 else 1)
    # One trace file: the interval does not exist, so the check fails closed.
    trace = out / r["runs"][0]["trace"]["path"]
    proc = psgate("replay", "--trace", trace, "--baseline", "lru", "--candidate", "prefixshield",
                  "--out", tmp_path / "single", "--gate", g, "--quiet")
    assert proc.returncode == 1, proc.stderr
    single = json.loads((tmp_path / "single" / "receipt.json").read_text())
    check = single["gate"]["checks"][-1]
    assert check["verdict"] == "fail" and "at least 2 matched runs, found 1" in check["note"]
    # A mean difference exists for one run.
    g2 = _gate(tmp_path, "diff_mean", ">=", -1)
    proc = psgate("replay", "--trace", trace, "--baseline", "lru", "--candidate", "prefixshield",
                  "--out", tmp_path / "single2", "--gate", g2, "--quiet")
    assert proc.returncode == 0, proc.stderr
    bad = tmp_path / "bad.toml"
    bad.write_text('[[check]]\nmetric = "hit_fraction"\nstat = "diff_ci_low"\nop = ">"\n'
                   'ref = "baseline"\n')
    proc = psgate("replay", "--baseline", "lru", "--candidate", "lru",
                  "--out", tmp_path / "x", "--gate", bad)
    assert_one_line_error(proc, 2, str(bad), "check[0].ref", "must be a number")


def test_corpus_directory(tmp_path):
    corpus = tmp_path / "incidents"
    corpus.mkdir()
    kind, params = parse_workload(SMALL)
    for i, name in enumerate(("tuesday", "wednesday")):
        write_trace(corpus / f"{name}.jsonl", generate(kind, {**params, "seed": i}))
    (corpus / "notes.txt").write_text("not a trace")
    out = tmp_path / "o"
    proc = psgate("replay", "--trace", corpus, "--baseline", "lru", "--candidate",
                  "prefixshield", "--out", out, "--quiet", "--resamples", "500")
    assert proc.returncode == 0, proc.stderr
    r = json.loads((out / "receipt.json").read_text())
    assert [x["id"] for x in r["runs"]] == ["tuesday", "wednesday"]
    assert r["source"] == {"kind": "corpus", "directory": str(corpus),
                           "traces": ["tuesday.jsonl", "wednesday.jsonl"]}
    assert "over 2 traces" in r["summary"]["method"]
    assert (out / "runs" / "tuesday" / "receipt.json").exists()


def test_experiment_usage_errors(tmp_path):
    t = small_trace(tmp_path)
    for args, needle in [
        (["--trace", t, "--runs", "2"], "--runs"),
        (["--trace", t, "--workload", "cold"], "not both"),
        (["--workload", "cold:seed=3"], "do not set seed"),
        (["--workload", "nope"], "unknown workload"),
        (["--workload", "cold:rate"], "key=value"),
        (["--workload", "cold", "--runs", "0"], "at least 1 run"),
        (["--workload", "cold", "--resamples", "5"], "--resamples"),
        (["--trace", tmp_path, "--runs", "3"], "--runs"),
    ]:
        proc = psgate("replay", "--baseline", "lru", "--candidate", "lru",
                      "--out", tmp_path / "o", *args)
        assert_one_line_error(proc, 2, needle)
        assert not (tmp_path / "o").exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = psgate("replay", "--baseline", "lru", "--candidate", "lru",
                  "--trace", empty, "--out", tmp_path / "o")
    assert_one_line_error(proc, 2, "no *.jsonl traces")
    bad = tmp_path / "corpus"
    bad.mkdir()
    kind, params = parse_workload(SMALL)
    write_trace(bad / "a.jsonl", generate(kind, {**params, "seed": 0}))
    (bad / "b.jsonl").write_text('{"psgate_trace": 1, "block_size": 0}\n')
    proc = psgate("replay", "--baseline", "lru",
                  "--trace", bad, "--out", tmp_path / "o", "--candidate", "prefixshield")
    assert_one_line_error(proc, 2, "b.jsonl:1")
    assert not (tmp_path / "o").exists()


def test_verify_and_review_commands_on_an_experiment(tmp_path):
    proc, out = _experiment(tmp_path, "e")
    assert proc.returncode == 0, proc.stderr
    ver = psgate("verify", out)
    assert ver.returncode == 0, ver.stderr + ver.stdout
    assert json.loads(ver.stdout)["compared"][-1] == \
        "receipt.json (outside environment, recomputed from the runs)"
    r = json.loads((out / "receipt.json").read_text())
    r["summary"]["roles"]["victim"]["hit_fraction"]["diff_ci_low"] = 0.5
    (out / "receipt.json").write_text(json.dumps(r))
    ver = psgate("verify", out)
    assert ver.returncode == 1
    assert "summary/roles/victim/hit_fraction/diff_ci_low" in json.loads(ver.stdout)["first_difference"]
    for args in (["explain", out, "--decision", "1"], ["diff", out, out]):
        assert_one_line_error(psgate(*args), 2, "experiment receipt", "runs/run-000")
    # report renders a matched-run experiment as a whole (per-run and paired intervals)
    rep = psgate("report", out, "-o", tmp_path / "r.html")
    assert rep.returncode == 0, rep.stderr
    assert "paired" in (tmp_path / "r.html").read_text().lower()
    assert psgate("explain", out / "runs" / "run-000", "--decision", "1").returncode == 0
