"""The default gate compares the policies: a candidate worse than its baseline fails it.

Also the selectors that make gate files work on traces without role labels, diff of a
receipt against itself, and the option names and overwrite rule every command shares.
"""

from __future__ import annotations

import inspect
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from psgate import api, cli
from psgate.errors import InputError
from psgate.experiment import DEFAULT_RESAMPLES, ExperimentConfig, run_experiment
from psgate.policies import register, unregister
from psgate.policies.lru import LRUPolicy
from psgate.receipt.gate import Tolerances, evaluate, evaluate_experiment, load_gate_file
from psgate.receipt.receipt import validate_receipt
from psgate.resources import bundled_trace_path
from psgate.stats.bootstrap import paired_summary
from psgate.sweep import SweepConfig, sweep

ROOT = Path(__file__).resolve().parents[2]


def psgate(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "psgate.cli", *map(str, args)],
                          capture_output=True, text=True, cwd=cwd, env=dict(os.environ),
                          timeout=300)


class _MRU(LRUPolicy):
    """Evicts the most recently freed block: the hot prefixes go first."""

    name = "test-gate-mru"
    defaults = {}

    def select_victim(self, req, now_ns):
        d = super().select_victim(req, now_ns)
        d.victim, d.position = self._q.prev[self._q.num_blocks], self._q.sizes[0] - 1
        return d


class _Starve(LRUPolicy):
    """LRU, except that any block of one group is evicted before anything else."""

    name = "test-gate-starve"
    defaults = {"victim": "tenant-a"}

    def bind(self, pool):
        super().bind(pool)
        self._owner: dict[int, str] = {}

    def on_allocated(self, req, blocks):
        for b in blocks:
            self._owner[b] = req.group

    def select_victim(self, req, now_ns):
        d = super().select_victim(req, now_ns)
        q, pos = self._q, 0
        b = q.next[q.num_blocks]
        while b != q.num_blocks:
            if self._owner.get(b) == self.params["victim"]:
                d.victim, d.position = b, pos
                break
            b, pos = q.next[b], pos + 1
        return d


@pytest.fixture(scope="module", autouse=True)
def _policies():
    for cls in (_MRU, _Starve):
        register(cls)
    yield
    for cls in (_MRU, _Starve):
        unregister(cls.name)


def _replay(tmp_path, baseline, candidate, name="out", **kw):
    return api.replay(api.ReplayConfig(baseline=baseline, candidate=candidate,
                                       out=tmp_path / name, **kw)).receipt


def _failed(receipt) -> dict[str, dict]:
    return {c["name"]: c for c in receipt["gate"]["checks"] if c["verdict"] == "fail"}


# -- the default gate on the bundled example ----------------------------------------------

def test_prefixshield_over_lru_passes_with_every_comparison_recorded(tmp_path):
    r = _replay(tmp_path, "lru", "prefixshield")
    assert r["gate"]["result"] == "pass"
    names = [c["name"] for c in r["gate"]["checks"]]
    for scope in ("run", "group:tenant-a", "group:tenant-b", "group:tenant-x"):
        for metric in ("hit_fraction", "saved_prefill_tokens", "ttft_p95_ms"):
            assert f"non-regression {metric} ({scope})" in names
    assert r["config"]["non_regression"] == {
        "enabled": True, "tolerance_hit": 0.01, "tolerance_tokens": 0.02,
        "tolerance_ttft": 0.05, "min_requests": 30, "min_requests_ttft": 200}
    validate_receipt(r)
    # nothing to lose against itself, whatever the noise rules
    assert _replay(tmp_path, "lru", "lru", "same")["gate"]["result"] == "pass"


def test_lru_over_prefixshield_fails_naming_each_group_with_its_numbers(tmp_path):
    # 320 blocks: tight enough that LRU loses both protected tenants' hits beyond their
    # one-request allowance and adds more than 5% to p95 TTFT under the step scheduler
    proc = psgate("replay", "--baseline", "prefixshield", "--candidate", "lru", "--json",
                  "--capacity", "320", "--out", tmp_path / "o", "--quiet")
    assert proc.returncode == 1, proc.stderr
    checks = {c["name"]: c for c in json.loads(proc.stdout)["checks"]}
    run = checks["non-regression hit_fraction (run)"]
    assert run["verdict"] == "fail"
    assert run["observed"] == 0.342636 and run["threshold"] == 0.371443
    assert "baseline 0.381443, candidate 0.342636, difference -0.038807" in run["note"]
    for group, note in (("tenant-a", "baseline 0.832937, candidate 0.741751, difference "
                                     "-0.091186; allowed 0.01111 absolute (1/90 requests)"),
                        ("tenant-b", "baseline 0.795991, candidate 0.72951, difference "
                                     "-0.066481; allowed 0.025 absolute (1/40 requests)")):
        c = checks[f"non-regression hit_fraction (group:{group})"]
        assert c["verdict"] == "fail" and c["select"] == f"group:{group}"
        assert c["note"] == note
    assert checks["non-regression hit_fraction (group:tenant-x)"]["verdict"] == "pass"
    assert checks["non-regression ttft_p95_ms (run)"]["verdict"] == "fail"   # +6.9%


def test_a_35_line_mru_fails(tmp_path):
    r = _replay(tmp_path, "lru", _MRU.name)
    failed = _failed(r)
    assert r["gate"]["result"] == "fail"
    c = failed["non-regression hit_fraction (run)"]
    assert (c["observed"], r["runs"]["baseline"]["metrics"]["totals"]["hit_fraction"]) == \
        (0.290064, 0.395975)


def test_starving_one_tenant_fails_on_that_tenant(tmp_path):
    r = _replay(tmp_path, "lru", _Starve.name, candidate_params={"victim": "tenant-a"})
    failed = _failed(r)
    assert "non-regression hit_fraction (group:tenant-a)" in failed
    assert "non-regression hit_fraction (group:tenant-b)" not in failed
    assert "baseline 0.867715, candidate 0.636925" in \
        failed["non-regression hit_fraction (group:tenant-a)"]["note"]


# -- tolerances: options, gate file, small groups -----------------------------------------

def test_tolerances_are_options_recorded_in_the_receipt(tmp_path):
    proc = psgate("replay", "--baseline", "prefixshield", "--candidate", "lru", "--quiet",
                  "--tolerance-hit", "0.2", "--tolerance-tokens", "0.2", "--tolerance-ttft",
                  "0.5", "--out", tmp_path / "o")
    assert proc.returncode == 0, proc.stderr
    cfg = json.loads((tmp_path / "o" / "receipt.json").read_text())["config"]
    assert (cfg["non_regression"]["tolerance_hit"], cfg["non_regression"]["tolerance_ttft"]) \
        == (0.2, 0.5)
    proc = psgate("replay", "--baseline", "lru", "--candidate", "lru", "--tolerance-hit",
                  "-1", "--out", tmp_path / "p")
    assert proc.returncode == 2 and "--tolerance-hit" in proc.stderr
    assert not (tmp_path / "p").exists()


def test_gate_file_defaults_replace_the_options(tmp_path):
    off = tmp_path / "off.toml"
    off.write_text("[defaults]\nnon_regression = false\n")
    r = _replay(tmp_path, "prefixshield", "lru", "a", gate_file=str(off))
    assert r["gate"]["result"] == "pass"
    assert not any(c["name"].startswith("non-regression") for c in r["gate"]["checks"])
    assert r["config"]["non_regression"]["enabled"] is False
    loose = tmp_path / "loose.toml"
    loose.write_text("[defaults]\ntolerance_hit = 0.5\ntolerance_tokens = 0.5\n"
                     "tolerance_ttft = 1.0\n")
    r = _replay(tmp_path, "prefixshield", "lru", "b", gate_file=str(loose))
    assert r["gate"]["result"] == "pass"
    assert r["config"]["non_regression"]["tolerance_hit"] == 0.5


def _metrics(groups: dict[str, tuple[int, float]], ttft=100.0) -> dict:
    """Run metrics with (measured requests, hit fraction) per group."""
    scope = lambda n, h: {"measured_requests": n, "hit_fraction": h,  # noqa: E731
                          "saved_prefill_tokens": int(h * 1000 * n), "ttft_p95_ms": ttft}
    n = sum(v[0] for v in groups.values())
    hit = sum(v[0] * v[1] for v in groups.values()) / n
    totals = {**scope(n, hit), "evictions": 5}
    return {"totals": totals, "groups": {g: scope(*v) for g, v in groups.items()},
            "roles": {}}


def _run(metrics):
    return {"aborted": None, "invariants": {}, "metrics": metrics}


def test_small_groups_are_reported_but_not_judged():
    base = _metrics({"big": (1000, 0.5), "tiny": (5, 1.0)})
    cand = _metrics({"big": (1000, 0.5), "tiny": (5, 0.0)})
    gate = evaluate({"baseline": _run(base), "candidate": _run(cand)}, None, False,
                    tolerances=Tolerances())
    c = next(c for c in gate["checks"]
             if c["name"] == "non-regression hit_fraction (group:tiny)")
    assert c["verdict"] == "pass" and "5 measured requests, fewer than 30: not judged" \
        in c["note"]
    assert gate["result"] == "pass"


def test_one_requests_worth_never_fails_a_group_alone():
    base = _metrics({"g": (40, 0.5)})
    for loss, verdict in ((1 / 40, "pass"), (0.03, "fail")):
        cand = _metrics({"g": (40, 0.5 - loss)})
        gate = evaluate({"baseline": _run(base), "candidate": _run(cand)}, None, False,
                        tolerances=Tolerances())
        c = next(c for c in gate["checks"]
                 if c["name"] == "non-regression hit_fraction (group:g)")
        assert c["verdict"] == verdict, (loss, c)


def test_matched_runs_read_the_worse_end_of_the_paired_interval():
    def runs(losses):
        base = [_metrics({"g": (500, 0.5)}) for _ in losses]
        cand = [_metrics({"g": (500, 0.5 - x)}) for x in losses]
        return paired_summary(base, cand, 1000, 0)
    ok = [("run-0", {"num_checks": 1, "num_failed": 0})]
    # mean loss 0.005 but the runs disagree: the loss may be above 0.01
    wide = evaluate_experiment(ok * 4, runs([0.0, 0.0, 0.0, 0.02]), None, Tolerances())
    c = next(c for c in wide["checks"]
             if c["name"] == "non-regression hit_fraction (group:g)")
    assert (c["stat"], c["verdict"]) == ("diff_ci_low", "fail")
    assert c["threshold"] == -0.01 and c["observed"] < -0.01
    narrow = evaluate_experiment(ok * 4, runs([0.004, 0.005, 0.005, 0.006]), None,
                                 Tolerances())
    assert narrow["result"] == "pass"


def test_matched_runs_of_a_worse_candidate_fail(tmp_path):
    base = api.ReplayConfig(baseline="lru", candidate=_MRU.name, out=tmp_path / "exp")
    r = run_experiment(ExperimentConfig(replay=base, workload="example", runs=2)).receipt
    assert r["gate"]["result"] == "fail"
    c = next(c for c in r["gate"]["checks"]
             if c["name"] == "non-regression hit_fraction (run)")
    assert c["run"] == "paired" and c["verdict"] == "fail"
    assert r["config"]["non_regression"]["enabled"] is True
    # each run's own receipt leaves the comparison to the experiment
    run0 = json.loads((tmp_path / "exp" / r["runs"][0]["receipt"]).read_text())
    assert run0["config"]["non_regression"]["enabled"] is False


def test_a_sweep_records_a_worse_candidate_as_a_failed_cell(tmp_path):
    rows = sweep(SweepConfig(workload="example", out=tmp_path / "sw", baseline="prefixshield",
                             candidate="lru", runs=2, resamples=200))
    assert [r["gate"] for r in rows] == ["fail"]
    assert "non-regression hit_fraction (run)" in rows[0]["gate_failed"]
    assert "gate_failed" in (tmp_path / "sw" / "table.csv").read_text().splitlines()[0]


# -- policies are named, never defaulted --------------------------------------------------

@pytest.mark.parametrize("args,missing", [
    ((), "--baseline"), (("--baseline", "lru"), "--candidate"),
    (("--candidate", "lru"), "--baseline")])
def test_replay_requires_both_policies(tmp_path, args, missing):
    proc = psgate("replay", *args, "--out", tmp_path / "o")
    assert proc.returncode == 2, proc.stderr
    assert missing in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "o").exists()


def test_sweep_requires_both_policies_unless_candidate_is_an_axis(tmp_path):
    proc = psgate("sweep", "--workload", "example", "--out", tmp_path / "s", "--baseline",
                  "lru")
    assert proc.returncode == 2 and "--candidate" in proc.stderr
    proc = psgate("sweep", "--workload", "example", "--out", tmp_path / "s", "--candidate",
                  "lru")
    assert proc.returncode == 2 and "--baseline" in proc.stderr


# -- selectors ------------------------------------------------------------------------------

def _roleless(tmp_path) -> str:
    """The bundled example as a capture would record it: groups, no role labels."""
    out = tmp_path / "roleless.jsonl"
    lines = []
    for line in bundled_trace_path("example").read_text().splitlines():
        d = json.loads(line)
        d.pop("role", None)
        lines.append(json.dumps(d))
    out.write_text("\n".join(lines) + "\n")
    return str(out)


def test_each_group_is_one_check_per_group(tmp_path):
    g = tmp_path / "g.toml"
    g.write_text('[[check]]\nname = "hit"\nmetric = "hit_fraction"\nselect = "each:group"\n'
                 'op = ">="\nref = "baseline"\ndelta = -0.01\n')
    r = _replay(tmp_path, "lru", "prefixshield", trace=_roleless(tmp_path), gate_file=str(g))
    checks = [c for c in r["gate"]["checks"] if c["name"].startswith("hit")]
    assert [c["select"] for c in checks] == ["group:tenant-a", "group:tenant-b",
                                            "group:tenant-x"]
    assert all(c["verdict"] == "pass" for c in checks)


def test_roles_map_to_groups_on_a_trace_without_roles(tmp_path):
    g = tmp_path / "g.toml"
    g.write_text('[roles]\nvictim = ["tenant-a"]\n\n[[check]]\nname = "victim"\n'
                 'metric = "hit_fraction"\nselect = "role:victim"\nop = ">="\n'
                 'ref = "baseline"\n')
    r = _replay(tmp_path, "lru", "prefixshield", trace=_roleless(tmp_path), gate_file=str(g))
    (c,) = [c for c in r["gate"]["checks"] if c["name"].startswith("victim")]
    assert (c["select"], c["verdict"]) == ("group:tenant-a", "pass")
    assert c["observed"] == 0.949881


def test_a_role_the_trace_lacks_is_bad_input_naming_the_fix(tmp_path):
    g = tmp_path / "g.toml"
    g.write_text('[[check]]\nmetric = "hit_fraction"\nselect = "role:benign"\nop = ">="\n'
                 'ref = "baseline"\n')
    proc = psgate("replay", "--trace", _roleless(tmp_path), "--baseline", "lru",
                  "--candidate", "prefixshield", "--gate", g, "--out", tmp_path / "o")
    assert proc.returncode == 2, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "check[0].select" in lines[0] and "[roles] benign" in lines[0]
    assert not (tmp_path / "o").exists()


def test_ci_example_gate_file_applies_to_a_trace_without_roles(tmp_path):
    spec = load_gate_file(str(ROOT / "examples" / "ci" / "gate.toml"))
    assert all(not c["select"].startswith("role:") or c["select"][5:] in spec.roles
               for c in spec.checks)
    r = _replay(tmp_path, "lru", "prefixshield", trace=_roleless(tmp_path),
                gate_file=str(ROOT / "examples" / "ci" / "gate.toml"))
    assert not any("fails closed" in c.get("note", "") for c in r["gate"]["checks"])
    assert r["gate"]["result"] == "pass"


def test_readme_gate_selects_only_what_its_workload_has():
    text = (ROOT / "docs" / "concepts" / "commands.md").read_text()
    block = text[text.index("    psgate replay --workload one-touch"):]
    block = block[:block.index("\n\n", block.index("[[check]]") + 400)]
    selects = [ln.split('"')[1] for ln in block.splitlines() if "select =" in ln]
    assert selects and "role:benign" not in selects      # one-touch has no benign role


# -- diff -----------------------------------------------------------------------------------

def test_diff_of_a_receipt_with_itself_never_regresses(tmp_path):
    _replay(tmp_path, "prefixshield", "lru", "a")       # a receipt whose gate fails
    g = tmp_path / "g.toml"
    g.write_text('[[check]]\nmetric = "ttft_p95_ms"\nstat = "rel_diff_mean"\nop = "<="\n'
                 'ref = 0.05\n\n[[check]]\nmetric = "hit_fraction"\nop = ">"\n'
                 'ref = "baseline"\n')
    proc = psgate("diff", tmp_path / "a", tmp_path / "a", "--gate", g)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["regressed"] is False and out["regressions"] == []


def test_diff_compares_the_statistic_not_the_raw_metric(tmp_path):
    # 320 blocks: where swapping the policies moves p95 TTFT by more than 5% either way
    _replay(tmp_path, "lru", "prefixshield", "a", capacity=320)
    _replay(tmp_path, "prefixshield", "lru", "b", capacity=320)
    g = tmp_path / "g.toml"
    g.write_text('[[check]]\nmetric = "ttft_p95_ms"\nstat = "rel_diff_mean"\nop = "<="\n'
                 'ref = 0.05\n')
    out = json.loads(psgate("diff", tmp_path / "a", tmp_path / "b", "--gate", g).stdout)
    (line,) = [x for x in out["regressions"] if "rel_diff_mean" in x]
    assert "A has -0.064830796, B has 0.069325204" in line
    g.write_text('[[check]]\nmetric = "ttft_p95_ms"\nstat = "diff_ci_high"\nop = "<="\n'
                 'ref = 5\n')
    proc = psgate("diff", tmp_path / "a", tmp_path / "b", "--gate", g)
    assert proc.returncode == 2 and "check[0].stat" in proc.stderr


# -- names, defaults and the overwrite rule -------------------------------------------------

def test_one_resamples_default():
    for fn in (cli.replay, cli.sweep):
        assert inspect.signature(fn).parameters["resamples"].default == DEFAULT_RESAMPLES
    assert ExperimentConfig(replay=api.ReplayConfig()).resamples == DEFAULT_RESAMPLES
    assert SweepConfig(workload="example", out=Path(".")).resamples == DEFAULT_RESAMPLES


@pytest.mark.parametrize("command", [("replay",), ("sweep",), ("report",), ("calibrate",),
                                     ("trace", "gen"), ("trace", "import"),
                                     ("trace", "redact")])
def test_out_and_o_are_both_accepted(command):
    proc = psgate(*command, "--help")
    assert proc.returncode == 0
    assert re.search(r"--out(?![a-z-])", proc.stdout) and re.search(r"(?<![a-z-])-o\b",
                                                                     proc.stdout)


def test_replay_accepts_o(tmp_path):
    proc = psgate("replay", "--baseline", "lru", "--candidate", "lru", "-o", tmp_path / "r",
                  "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "r" / "receipt.json").is_file()


def test_trace_gen_refuses_an_existing_output_unless_forced(tmp_path):
    out = tmp_path / "t.jsonl"
    out.write_text("keep me\n")
    proc = psgate("trace", "gen", "steady", "--out", out)
    assert proc.returncode == 2 and "--force" in proc.stderr
    assert out.read_text() == "keep me\n"
    proc = psgate("trace", "gen", "steady", "-o", out, "--force")
    assert proc.returncode == 0, proc.stderr
    assert out.read_text().startswith('{"psgate_trace":1')


def test_report_refuses_an_existing_output_unless_forced(tmp_path):
    _replay(tmp_path, "lru", "prefixshield", "r")
    page = tmp_path / "page.html"
    page.write_text("old")
    proc = psgate("report", tmp_path / "r", "-o", page)
    assert proc.returncode == 2 and "--force" in proc.stderr and page.read_text() == "old"


def test_replay_refuses_an_existing_junit_unless_forced(tmp_path):
    j = tmp_path / "j.xml"
    j.write_text("old")
    proc = psgate("replay", "--baseline", "lru", "--candidate", "lru", "--out",
                  tmp_path / "o", "--junit", j)
    assert proc.returncode == 2 and "--force" in proc.stderr
    assert not (tmp_path / "o").exists()


def test_verify_reruns_with_the_recorded_tolerances(tmp_path):
    proc = psgate("replay", "--baseline", "prefixshield", "--candidate", "lru", "--quiet",
                  "--tolerance-hit", "0.2", "--tolerance-tokens", "0.2", "--tolerance-ttft",
                  "0.5", "--out", tmp_path / "o")
    assert proc.returncode == 0, proc.stderr
    proc = psgate("verify", tmp_path / "o")
    assert proc.returncode == 0, proc.stderr


def test_input_error_for_bad_tolerance_in_api(tmp_path):
    with pytest.raises(InputError):
        _replay(tmp_path, "lru", "lru", tolerances=Tolerances(ttft=float("inf")))


def test_gate_file_defaults_must_be_finite(tmp_path):
    g = tmp_path / "g.toml"
    g.write_text("[defaults]\ntolerance_hit = nan\n")
    proc = psgate("replay", "--baseline", "lru", "--candidate", "lru", "--gate", g, "--out",
                  tmp_path / "o")
    assert proc.returncode == 2
    assert "field 'defaults.tolerance_hit': expected a finite number" in proc.stderr
    assert not (tmp_path / "o").exists()
