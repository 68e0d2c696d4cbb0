"""quota-lru's tests: psgate's policy contract suite on it, and a hand-written scenario in
which the quota keeps a light tenant's prompt that lru evicts under a flooding tenant.

They drive the psgate command of the interpreter running them (``python -m psgate``)
and name the policy by its entry point, so they test the package as installed.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

POLICY = "quota-lru"


def psgate(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "psgate", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("params", [[], ["--param", "share=0"]], ids=["defaults", "share=0"])
def test_check_policy(tmp_path, params):
    """Every contract holds, with the defaults and with no quota at all (every group is
    over its quota, so every victim is chosen by the over-quota rule)."""
    junit = tmp_path / "check.xml"
    proc = psgate("check-policy", POLICY, *params, "--junit", str(junit))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    root = ET.parse(junit).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    assert sum(int(s.get("tests")) for s in suites) > 0
    assert all(s.get("failures") == "0" and s.get("errors", "0") == "0" for s in suites)


# Content hashes of the scenario's prompt blocks: light's prompt a1 a2, heavy's one-off
# prompts b1-b3, c1-c3, d1-d3, e1-e3 (padded to psgate's 32 hex digits).
def h(name: str) -> str:
    return name.ljust(32, "0")


def scenario(path):
    """light caches a 2-block prompt at t=0; heavy sends four one-off 3-block prompts
    (t=1..4); light asks again at t=5. 12 usable blocks: each request also holds a
    partial last block, which goes back to the truly free blocks when it ends; the
    fourth heavy request is the first that has to evict (3 blocks)."""
    lines = [{"psgate_trace": 1, "block_size": 16,
              "groups": {"light": {"contracts": ["standard"]},
                         "heavy": {"contracts": ["standard"]}}}]

    def request(t, rid, group, blocks):
        lines.append({"t": t, "op": "request", "id": rid, "group": group,
                      "contract": "standard", "scope": "m1", "blocks": [h(b) for b in blocks],
                      "tail": 1, "out": 1})

    request(0, "l1", "light", ["a1", "a2"])
    for t, p in enumerate("bcde", start=1):
        request(t, f"h{t}", "heavy", [f"{p}1", f"{p}2", f"{p}3"])
    request(5, "l2", "light", ["a1", "a2"])
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_quota_keeps_the_light_tenants_prompt(tmp_path):
    trace = scenario(tmp_path / "flood.jsonl")
    out = tmp_path / "receipt"
    proc = psgate("replay", "--trace", str(trace), "--baseline", "lru", "--candidate", POLICY,
                  "--candidate-param", "share=0.25", "--capacity", "13",
                  "--ledger-compression", "none", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    names = {h(p + i): p + i for p in "abcde" for i in "123"}
    evictions: dict[str, list[tuple]] = {"baseline": [], "candidate": []}
    with open(out / "ledger.csv", newline="") as f:
        for row in csv.DictReader(f):
            if row["kind"] == "evict":
                evictions[row["run"]].append((row["request"], names[row["hash"]],
                                              row["owner"], json.loads(row["rank"])))
    # lru: h4 evicts light's prompt (freed first, last block first), then the oldest
    # heavy block; l2 misses and recomputes its prompt, evicting two more heavy blocks.
    assert [e[:3] for e in evictions["baseline"]] == [
        ("h4", "a2", "light"), ("h4", "a1", "light"), ("h4", "b3", "heavy"),
        ("l2", "b2", "heavy"), ("l2", "b1", "heavy")]
    # quota-lru (quota floor(0.25 x 12) = 3 blocks): heavy holds 9 candidates, light 2,
    # so h4's three victims are heavy's least recently freed blocks; l2 hits its prompt.
    assert [e[:3] for e in evictions["candidate"]] == [
        ("h4", "b3", "heavy"), ("h4", "b2", "heavy"), ("h4", "b1", "heavy")]
    assert [{k: v for k, v in e[3].items() if k != "freed_t"}
            for e in evictions["candidate"]] == [
        {"rule": "over-quota", "group": "heavy", "holding": n, "quota": 3} for n in (9, 8, 7)]
    with open(out / "requests.csv", newline="") as f:
        cached = {(r["run"], r["id"]): int(r["cached_tokens"]) for r in csv.DictReader(f)}
    assert cached[("baseline", "l2")] == 0 and cached[("candidate", "l2")] == 32


def test_without_a_quota_it_decides_as_lru(tmp_path):
    """share=1: no group can be over its quota, so every victim is lru's."""
    trace = scenario(tmp_path / "flood.jsonl")
    out = tmp_path / "receipt"
    proc = psgate("replay", "--trace", str(trace), "--baseline", "lru", "--candidate", POLICY,
                  "--candidate-param", "share=1", "--capacity", "13",
                  "--ledger-compression", "none", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    with open(out / "ledger.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["kind"] == "evict"]
    runs = {run: [r["block"] for r in rows if r["run"] == run]
            for run in ("baseline", "candidate")}
    assert runs["baseline"] and runs["candidate"] == runs["baseline"]
    assert {json.loads(r["rank"])["rule"] for r in rows if r["run"] == "candidate"} == {"lru"}


@pytest.mark.parametrize("param, says", [
    ("share=1.5", "parameter 'share': expected 0..1, found 1.5"),
    ('shares={"light": -1}', "parameter 'shares.light': expected 0..1, found -1"),
    ("shares=[1]", "parameter 'shares': expected {group: share}, found [1]"),
])
def test_a_bad_parameter_is_one_line(tmp_path, param, says):
    proc = psgate("replay", "--trace", str(scenario(tmp_path / "t.jsonl")), "--baseline",
                  "lru", "--candidate", POLICY, "--candidate-param", param,
                  "--out", str(tmp_path / "r"))
    assert proc.returncode == 2 and says in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
