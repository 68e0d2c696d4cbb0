"""psgate check-policy: the policy contract as a command.

Every built-in policy passes it through the real command; every policy in
tests/data/broken_policies/ is broken one way and must fail exactly the contract its
docstring names, as one FAIL line and never a traceback; specs that do not load exit 2
with one line; --junit and --json carry one entry per contract.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from psgate.check import CONTRACTS, check_policy, decision_problem
from psgate.errors import InputError
from psgate.policies import policy_names, register, unregister
from psgate.policies.lru import LRUPolicy
from psgate.policy import API_VERSION, Decision

ROOT = Path(__file__).resolve().parents[1]
BROKEN = "tests/data/broken_policies"      # as a user names a file: relative to the cwd
BUILTINS = [n for n in policy_names() if not n.startswith("test-")]
# The whole suite at its defaults for these; the others at fewer examples (every
# contract still runs, on fewer generated traces).
FULL = {"lru", "prefixshield"}
SMALL_EXAMPLES = "20"
# Contracts a built-in policy is known to fail, each with the bug it shows: the test
# asserts exactly these fail, so fixing the bug fails the test until the entry goes.
# Built-in policies that fail a contract, with the contracts (none: check-policy found
# static-quota's reclaim_first asking for more than the batch, since fixed).
KNOWN_FAILURES: dict[str, set[str]] = {}


def psgate(*args, timeout: float = 300, env: dict | None = None, cwd=ROOT):
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "psgate", *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=timeout, env=e)


def contract_lines(proc) -> dict[str, tuple[str, str]]:
    """name -> (verdict, detail) from the stderr lines, checking their form: one line per
    contract, in order, then the summary line."""
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == len(CONTRACTS) + 1, proc.stderr
    assert lines[-1].startswith("check-policy "), lines[-1]
    out = {}
    for name, line in zip(CONTRACTS, lines):
        verdict, _, rest = line.partition(" ")
        assert verdict in ("PASS", "FAIL", "SKIP"), line
        if verdict == "FAIL":
            assert rest.startswith(f"{name}: "), line
            detail = rest[len(name) + 2:]
        else:
            assert rest.startswith(f"{name}  "), line
            detail = rest[len(name) + 2:]
        assert detail.strip(), line
        out[name] = (verdict, detail)
    return out


def assert_no_traceback(proc) -> None:
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout, proc.stderr
    assert "Exception ignored" not in proc.stderr, proc.stderr


# -- (a) every built-in policy passes ---------------------------------------------------
@pytest.mark.parametrize("policy", BUILTINS)
def test_every_builtin_policy_passes(policy):
    args = ["check-policy", policy, "--json"]
    if policy not in FULL:
        args += ["--examples", SMALL_EXAMPLES]
    proc = psgate(*args)
    assert_no_traceback(proc)
    lines = contract_lines(proc)
    report = json.loads(proc.stdout)
    assert [c["name"] for c in report["contracts"]] == list(CONTRACTS)
    assert {n: v for n, (v, _) in lines.items()} == \
        {c["name"]: c["verdict"].upper() for c in report["contracts"]}
    failed = {c["name"] for c in report["contracts"] if c["verdict"] == "fail"}
    known = KNOWN_FAILURES.get(policy, set())
    assert failed == known, {c["name"]: c["detail"] for c in report["contracts"]
                             if c["verdict"] == "fail"}
    assert proc.returncode == (1 if known else 0)
    assert report["passed"] is not bool(known)
    assert report["policy"]["name"] == policy and report["policy"]["kind"] == "builtin"
    # the contracts that judge replays judged some: nothing vacuous
    for name in ("runs-cleanly", "hard-invariants", "select-victim-pure", "receipt-valid",
                 "deterministic", "hash-seed-independent", "hypothesis-traces"):
        if name not in known and lines["runs-cleanly"][0] == "PASS":
            assert lines[name][0] == "PASS", (name, lines[name])


def test_the_suite_exercises_evictions_preemption_cancels_and_done_events():
    """The generated traces reach what the contract is about: evictions, preemption
    under the step scheduler, cancels, done events and rejections."""
    report = check_policy("lru", examples=30)
    detail = report.result("hard-invariants").detail
    counts = {word: int(n) for n, word in re.findall(r"(\d+) ([a-z]+)", detail)}
    for what in ("evictions", "preemptions", "cancels", "done", "rejections"):
        assert counts.get(what, 0) > 0, detail


# -- (b) each broken policy fails the contract that catches it ------------------------
# file:Class -> the contracts that must name it as FAIL (its docstring says why)
BROKEN_POLICIES = {
    "pinned_victim.py:PinnedVictim": {"victims-are-candidates"},
    "null_block_victim.py:NullBlockVictim": {"victims-are-candidates"},
    "raises_in_select.py:RaisesInSelect": {"runs-cleanly"},
    "raises_on_free.py:RaisesOnFree": {"runs-cleanly"},
    "mutates_in_select.py:MutatesInSelect": {"select-victim-pure"},
    "loops_forever.py:LoopsForever": {"runs-cleanly"},
    "unseeded_random.py:UnseededRandom": {"deterministic", "select-victim-pure"},
    "set_order.py:SetOrder": {"hash-seed-independent"},
    "wall_clock.py:WallClock": {"deterministic", "hash-seed-independent"},
    # the engine refuses the decision before the ledger writes it (a NaN was a silent null)
    "nan_rank.py:NanRank": {"ledger-fields", "receipt-valid", "hypothesis-traces"},
    "set_in_rank.py:SetInRank": {"ledger-fields", "receipt-valid", "hypothesis-traces"},
    "batch_disagrees.py:BatchDisagrees": {"evict-batch-consistent"},
    "wrong_decision_count.py:WrongDecisionCount": {"ledger-fields"},
    "miscount.py:Miscount": {"hard-invariants"},
    "accepts_unknown_params.py:AcceptsUnknownParams": {"params-validated"},
    "refuses_admission.py:RefusesAdmission": {"work-conserving"},
}


def test_every_broken_policy_file_is_checked():
    files = {p.name for p in (ROOT / BROKEN).glob("*.py")} - {"bad_specs.py"}
    assert files == {spec.partition(":")[0] for spec in BROKEN_POLICIES}


@pytest.mark.parametrize("spec", sorted(BROKEN_POLICIES),
                         ids=[s.partition(".")[0] for s in sorted(BROKEN_POLICIES)])
def test_a_broken_policy_fails_the_contract_that_catches_it(spec):
    proc = psgate("check-policy", f"{BROKEN}/{spec}", "--examples", "10", "--time-limit", "3")
    assert proc.returncode == 1, proc.stderr
    assert_no_traceback(proc)
    assert proc.stdout == ""                   # stdout carries JSON only, with --json
    lines = contract_lines(proc)
    failed = {name for name, (verdict, _) in lines.items() if verdict == "FAIL"}
    assert BROKEN_POLICIES[spec] <= failed, proc.stderr


def test_a_raising_hook_is_named_with_the_exception_and_its_line():
    """The hook the engine called, not the helper that raised; the file as given."""
    proc = psgate("check-policy", f"{BROKEN}/raises_in_select.py:RaisesInSelect",
                  "--examples", "5")
    verdict, detail = contract_lines(proc)["runs-cleanly"]
    assert verdict == "FAIL"
    assert detail.startswith("select_victim raised KeyError: "), detail
    assert f" at {BROKEN}/raises_in_select.py:25 (trace-" in detail, detail
    proc = psgate("check-policy", f"{BROKEN}/raises_on_free.py:RaisesOnFree", "--examples", "5")
    verdict, detail = contract_lines(proc)["runs-cleanly"]
    assert detail.startswith("on_free raised ValueError: expected one block at a time"), detail
    assert f"{BROKEN}/raises_on_free.py:17" in detail, detail


def test_a_policy_that_never_returns_is_stopped_and_the_rest_skipped():
    proc = psgate("check-policy", f"{BROKEN}/loops_forever.py:LoopsForever",
                  "--time-limit", "1", timeout=60)
    assert proc.returncode == 1
    assert_no_traceback(proc)
    lines = contract_lines(proc)
    verdict, detail = lines["runs-cleanly"]
    assert verdict == "FAIL"
    assert detail.startswith(f"timed out after 1 s in select_victim ({BROKEN}/loops_forever.py:"), \
        detail
    after = CONTRACTS[CONTRACTS.index("runs-cleanly") + 1:]
    assert all(lines[n][0] == "SKIP" for n in after), lines
    assert lines["params-validated"][0] == "PASS"


# -- (e) determinism across interpreters ---------------------------------------------
def test_set_order_dependence_is_caught_across_hash_seeds_only():
    """Within one interpreter a set of strings iterates the same way every time, so the
    in-process comparison passes; the fresh interpreters with other PYTHONHASHSEEDs catch
    it and name the first differing ledger row."""
    report = check_policy(f"{BROKEN}/set_order.py:SetOrder", examples=10)
    assert report.result("deterministic").verdict == "pass"
    assert report.result("select-victim-pure").verdict == "pass"
    result = report.result("hash-seed-independent")
    assert result.verdict == "fail", result
    assert result.detail.startswith("ledger.csv line "), result.detail
    assert "(run candidate, seq " in result.detail and "under PYTHONHASHSEED=1 '" in \
        result.detail and "under PYTHONHASHSEED=2 '" in result.detail, result.detail
    assert [r.name for r in report.results if r.verdict == "fail"] == ["hash-seed-independent"]


def test_an_unseeded_random_policy_fails_determinism_in_process():
    report = check_policy(f"{BROKEN}/unseeded_random.py:UnseededRandom", examples=10)
    result = report.result("deterministic")
    assert result.verdict == "fail"
    assert "in the first replay '" in result.detail and "in the second '" in result.detail


# -- (c) specs that do not load: exit 2, one line --------------------------------------
@pytest.mark.parametrize("spec,needle", [
    ("no_such_module_for_psgate:Policy", "no module named 'no_such_module_for_psgate'"),
    (f"{BROKEN}/no_such_file.py:Policy", "no such file"),
    (f"{BROKEN}/bad_specs.py:Missing", "has no attribute 'Missing'"),
    (f"{BROKEN}/bad_specs.py:NotAPolicy", "expected a subclass of psgate.policy.EvictionPolicy"),
    (f"{BROKEN}/bad_specs.py:FromTheFuture",
     f"written for policy API version {API_VERSION + 1}"),
    (f"{BROKEN}/bad_specs.py:Nameless", "declares no name"),
    (f"{BROKEN}/bad_specs.py:RefusesToBuild", "constructing it raised RuntimeError: no GPU here"),
    ("no-such-policy", "no such policy; built-in: "),
])
def test_a_spec_that_does_not_load_exits_2_with_one_line(spec, needle):
    proc = psgate("check-policy", spec)
    assert_one_line_error(proc, needle)


def test_a_syntax_error_exits_2_with_one_line(tmp_path):
    bad = tmp_path / "bad_syntax.py"
    bad.write_text("from psgate.policy import EvictionPolicy\n\nclass P(EvictionPolicy:\n")
    proc = psgate("check-policy", f"{bad}:P")
    assert_one_line_error(proc, "syntax error", f"{bad}:3")


@pytest.mark.parametrize("args,needle", [
    (["lru", "--param", "nope=1"], "--param: policy 'lru': unknown parameter(s)"),
    (["lru", "--param", "nope"], "--param: expected KEY=VALUE"),
    (["lru", "--examples", "0"], "--examples: expected an integer in 1..100000"),
    (["lru", "--time-limit", "0"], "--time-limit: expected seconds"),
])
def test_bad_options_exit_2_with_one_line(args, needle):
    assert_one_line_error(psgate("check-policy", *args), needle)


def assert_one_line_error(proc, *needles) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("psgate: error: "), lines[0]
    assert_no_traceback(proc)
    for needle in needles:
        assert needle in lines[0], lines[0]


# -- (d) --junit and --json -------------------------------------------------------------
def test_junit_has_one_case_per_contract_and_fails_the_failed_ones(tmp_path):
    out = tmp_path / "check.xml"
    proc = psgate("check-policy", f"{BROKEN}/nan_rank.py:NanRank", "--examples", "5",
                  "--junit", out, "--json")
    assert proc.returncode == 1
    report = json.loads(proc.stdout)
    cases = ET.parse(out).getroot().find("testsuite").findall("testcase")
    assert [c.get("name") for c in cases] == list(CONTRACTS)
    failed = [c.get("name") for c in cases if c.find("failure") is not None]
    assert failed == [c["name"] for c in report["contracts"] if c["verdict"] == "fail"]
    skipped = [c.get("name") for c in cases if c.find("skipped") is not None]
    assert skipped == [c["name"] for c in report["contracts"] if c["verdict"] == "skip"]
    assert ET.parse(out).getroot().find("testsuite").get("skipped") == str(len(skipped))
    assert "ledger-fields" in failed
    detail = cases[CONTRACTS.index("ledger-fields")].find("failure").get("message")
    assert "rank {'score': nan} holds a number that is not finite" in detail
    # an existing file is replaced only with --force
    again = psgate("check-policy", "lru", "--examples", "2", "--junit", out)
    assert_one_line_error(again, "already exists; pass --force")
    again = psgate("check-policy", "lru", "--examples", "2", "--junit", out, "--force")
    assert again.returncode == 0, again.stderr
    cases = ET.parse(out).getroot().find("testsuite").findall("testcase")
    assert len(cases) == len(CONTRACTS)
    assert all(c.find("failure") is None for c in cases)


def test_json_carries_each_failures_trace_to_reproduce_it(tmp_path):
    """A failure found on a generated trace comes with that trace, capacity and scheduler:
    replaying it shows the same failure."""
    proc = psgate("check-policy", f"{BROKEN}/null_block_victim.py:NullBlockVictim",
                  "--examples", "5", "--json")
    result = next(c for c in json.loads(proc.stdout)["contracts"]
                  if c["name"] == "victims-are-candidates")
    example = result["example"]
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps(x) + "\n" for x in example["trace"]))
    replay = psgate("replay", "--trace", trace, "--baseline", "lru", "--candidate",
                    f"{BROKEN}/null_block_victim.py:NullBlockVictim", "--capacity",
                    example["capacity"], "--scheduler", example["scheduler"], "--out",
                    tmp_path / "out")
    assert replay.returncode == 1
    receipt = json.loads((tmp_path / "out" / "receipt.json").read_text())
    assert "chose block 0, which is not an eviction candidate" in \
        receipt["runs"]["candidate"]["aborted"]


# -- in-process: the library ------------------------------------------------------------
def test_without_hypothesis_its_contract_is_skipped_with_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "hypothesis", None)      # import hypothesis fails
    report = check_policy("lru", examples=3)
    result = report.result("hypothesis-traces")
    assert result.verdict == "skip" and "pip install hypothesis" in result.detail
    assert report.passed


def test_a_policy_registered_at_run_time_is_checked_in_process_only():
    class CheckedLRU(LRUPolicy):
        name = "test-check-lru"

    register(CheckedLRU)
    try:
        report = check_policy("test-check-lru", examples=3)
    finally:
        unregister("test-check-lru")
    assert report.passed
    assert [r.name for r in report.results] == list(CONTRACTS)
    assert report.result("hash-seed-independent").verdict == "skip"
    # a subclass overriding none of lru's hooks batches with lru's evict_batch
    assert report.result("evict-batch-consistent").verdict == "pass"


def test_a_spec_that_does_not_load_raises_input_error():
    with pytest.raises(InputError, match="no such file"):
        check_policy(f"{BROKEN}/no_such_file.py:Policy")
    with pytest.raises(InputError, match="unknown parameter"):
        check_policy("lru", {"nope": 1})


def test_decision_problems_name_the_field():
    ok = Decision(victim=3, num_candidates=2, position=0, queue="q", rank={"a": [1, "x"]})
    assert decision_problem(ok, 3, 2) is None
    assert "num_candidates is 2, but 1" in decision_problem(ok, 3, 1)
    assert "names block 3, but block 4" in decision_problem(ok, 4, 2)
    bad = Decision(victim=3, num_candidates=1, position=0, queue="", rank={})
    assert "queue is ''" in decision_problem(bad)
    bad = Decision(victim=3, num_candidates=1, position=-1, queue="q")
    assert "position is -1" in decision_problem(bad)
    bad = Decision(victim=3, num_candidates=1, position=0, queue="q",
                   rank={"x": {"deep": float("inf")}})
    assert "rank['x']['deep'] is inf" in decision_problem(bad)
    bad = Decision(victim=3, num_candidates=1, position=0, queue="q", rank={1: 2})
    assert "has the key 1, not a string" in decision_problem(bad)
    bad = Decision(victim=3, num_candidates=1, position=0, queue="q",
                   rank={f"k{i}": i for i in range(40)})
    assert "has 40 fields" in decision_problem(bad)


def test_check_policy_leaves_nothing_in_the_working_directory(tmp_path):
    """Hypothesis keeps caches in ./.hypothesis unless told otherwise: not in a user's
    checkout."""
    proc = psgate("check-policy", "lru", "--examples", "3", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert list(tmp_path.iterdir()) == []
