"""I1 and I2 catch a faulty PrefixShield; the gate fails on it.

Each faulty policy below is registered only for this module's tests. The checkers
keep their own buckets (psgate/invariants/prefixshield.py), so a policy cannot
vouch for itself. Contracts as in test_prefixshield: standard rho 1 / beta 4,
best-effort 2 / 4, critical 4 / 8.
"""

from __future__ import annotations

import dataclasses

import pytest

from psgate.api import ReplayConfig, replay
from psgate.invariants.prefixshield import BucketAudit
from psgate.policies import register, unregister
from psgate.policies.prefixshield import PrefixShield

from helpers import NoteLog, replay_file, write

C = {"standard": [1.0, 4.0], "best-effort": [2.0, 4.0], "critical": [4.0, 8.0]}


class _ChargesHits(PrefixShield):
    """Charges a request's hit blocks too (an I1 violation)."""

    name = "test-ps-charges-hits"

    def on_admit(self, req, now_ns):
        super().on_admit(req, now_ns)
        self.num_hits = 0

    def on_hit(self, block, req, pos):
        super().on_hit(block, req, pos)
        self.num_hits += 1

    def end_admit(self, req, now_ns):
        if self.num_hits:
            self._charge(self.gids[req.group], self.cidx[req.contract], self.num_hits,
                         self.now_s)
        note = super().end_admit(req, now_ns)
        self.last_audit["charged"] += self.num_hits
        return note


class _ChargesWrongGroup(PrefixShield):
    """Charges (and hands ownership of) a request's new blocks to another group."""

    name = "test-ps-wrong-group"

    def end_admit(self, req, now_ns):
        other = next((g for g in self.gnames if g != req.group), None)
        if other is not None and self.new_blocks:
            req = dataclasses.replace(req, group=other)
        return super().end_admit(req, now_ns)


class _SkipsRecompute(PrefixShield):
    """Forgets to charge a request's single recomputed block after hits."""

    name = "test-ps-skips-recompute"

    def end_admit(self, req, now_ns):
        if not (req.num_new_full_blocks == 1 and req.num_prompt_blocks > 1):
            return super().end_admit(req, now_ns)
        dropped, self.new_blocks = self.new_blocks, []
        note = super().end_admit(req, now_ns)
        for b, _ in dropped:        # owned, as PrefixShield's queues need, but not charged
            self.owner[b] = self.gids[req.group]
            self.contract[b] = self.cidx[req.contract]
        return note


class _FastRefill(PrefixShield):
    """Its buckets refill 100 times too fast: it promotes while the group still owes."""

    name = "test-ps-fast-refill"

    def __init__(self, **params):
        super().__init__(**params)
        self.rho = {c: r * 100 for c, r in self.rho.items()}
        self.min_rho = min(self.rho.values())
        self.weight = {c: self.rho[c] / self.min_rho for c in self.rho}


FAULTY = (_ChargesHits, _ChargesWrongGroup, _SkipsRecompute, _FastRefill)


@pytest.fixture(autouse=True, scope="module")
def _register_faulty():
    for cls in FAULTY:
        register(cls)
    yield
    for cls in FAULTY:
        unregister(cls.name)


def _hits_trace(tmp_path):
    return write(tmp_path, [
        {"t": 0, "id": "A", "group": "g1", "blocks": ["a1", "a2"], "tail": 1, "done_t": 0.5},
        {"t": 0, "id": "X", "group": "g2", "blocks": ["b1"], "tail": 1, "done_t": 0.5},
        # 2 hits, 1 new block
        {"t": 1, "id": "B", "group": "g1", "blocks": ["a1", "a2", "a3"], "tail": 1,
         "done_t": 1.5},
        # whole prompt cached: a1 a2 hit, a3 recomputed
        {"t": 2, "id": "D", "group": "g1", "blocks": ["a1", "a2", "a3"], "done_t": 2.5},
    ])


def test_reference_policy_holds_i1_on_the_same_trace(tmp_path):
    result, _, _ = replay_file(_hits_trace(tmp_path), 20, policy="prefixshield",
                               paranoid=True, params={"contracts": C})
    v = result.invariants["I1"]
    assert v.holds and v.checks == 4 + 1
    assert result.invariants["I2"].holds


def test_i1_catches_charging_hits(tmp_path):
    result, _, _ = replay_file(_hits_trace(tmp_path), 20, policy="test-ps-charges-hits",
                               paranoid=True, params={"contracts": C})
    v = result.invariants["I1"]
    assert not v.holds and v.violations == 2 + 1      # B, D, and the end-of-run totals
    assert "(request B, run)" in v.first_violation
    assert v.first_violation.endswith("materialized 1 block(s) for g1/standard; the policy "
                                      "charged 3 to g1/standard")
    # the other hard invariants are unaffected: only the family checker sees it
    assert all(result.invariants[n].holds for n in ("no_pinned_eviction",
                                                     "hits_contiguous_in_namespace",
                                                     "capacity_and_accounting"))


def test_i1_catches_charging_the_wrong_group(tmp_path):
    result, _, _ = replay_file(_hits_trace(tmp_path), 20, policy="test-ps-wrong-group",
                               paranoid=True, params={"contracts": C})
    v = result.invariants["I1"]
    assert not v.holds
    # A came before any other group existed; X (g2) is the first one misattributed
    assert "(request X, run)" in v.first_violation
    assert v.first_violation.endswith("materialized 1 block(s) for g2/standard; the policy "
                                      "charged 1 to g1/standard")
    assert v.violations == 3 + 1                      # X, B, D, and the end-of-run totals


def test_i1_catches_an_uncharged_recompute(tmp_path):
    result, _, engine = replay_file(_hits_trace(tmp_path), 20,
                                    policy="test-ps-skips-recompute", paranoid=True,
                                    params={"contracts": C})
    v = result.invariants["I1"]
    assert v.violations == 2 + 1                      # B, D, and the end-of-run totals
    assert "(request B, run)" in v.first_violation
    assert v.first_violation.endswith("materialized 1 block(s) for g1/standard; the policy "
                                      "charged 0 to g1/standard")
    # the checker's running totals come from engine events, not from the policy
    audit, = engine.auditors
    assert audit.materialized == {"g1": 4, "g2": 1}
    assert audit.charged == {"g1": 2, "g2": 1}


def _debt_trace(tmp_path, name="debt.jsonl"):
    return write(tmp_path, [
        {"t": 0, "id": "A", "prefix": "p", "blocks": ["a1", "a2"], "tail": 1, "done_t": 0.5},
        # 8 new blocks at t=1: B = min(4, 2 + 1) - 8 = -5, clears at t=6
        {"t": 1, "id": "B", "prefix": "q", "blocks": [f"b{i:x}" for i in range(8)],
         "done_t": 1.5},
        # proven reuse while owing 4 blocks
        {"t": 2, "id": "D", "prefix": "p", "blocks": ["a1", "a2"], "tail": 1, "done_t": 2.5},
        {"t": 7, "id": "E", "prefix": "p", "blocks": ["a1", "a2"], "tail": 1, "done_t": 7.5},
    ], name=name)


def test_i2_catches_promotion_under_too_fast_refill(tmp_path):
    result, _, engine = replay_file(_debt_trace(tmp_path), 20, policy="test-ps-fast-refill",
                                    paranoid=True, params={"contracts": C})
    v = result.invariants["I2"]
    assert not v.holds and v.violations == 1
    assert v.first_violation.endswith("(request D, run): 2 block(s) promoted to Reuse while "
                                      "group 'g' owed 4 blocks (eps 1e-09)")
    # the policy believes its own arithmetic: no debt left at t=2
    assert engine.policy.raw_debt(0, 2.0) == 0.0
    assert result.invariants["I1"].holds


def test_nogate_claims_no_i2_while_prefixshield_holds_it_with_a_denial(tmp_path):
    p = _debt_trace(tmp_path)
    gated, glog, _ = replay_file(p, 20, policy="prefixshield", paranoid=True,
                                 params={"contracts": C})
    v = gated.invariants["I2"]
    assert v.holds and v.checks == 4
    ungated, ulog, engine = replay_file(p, 20, policy="prefixshield-nogate", paranoid=True,
                                        params={"contracts": C})
    assert "I2" not in ungated.invariants and ungated.invariants["I1"].holds
    assert engine.policy.claims() == ("I1",)
    # the same trace: gated denies D's promotion, ungated grants it while in debt
    denied = _notes(p, "prefixshield")
    granted = _notes(p, "prefixshield-nogate")
    assert (denied["D"]["promoted"], denied["D"]["promotion_denied"]) == (0, 2)
    assert denied["D"]["raw_debt"] == 4.0
    assert (granted["D"]["promoted"], granted["D"]["promotion_denied"]) == (2, 0)
    assert (denied["E"]["promoted"], granted["E"]["promoted"]) == (2, 0)
    # and its promotion in debt would be an I2 violation if it were claimed
    audit = BucketAudit(C, 1e-9, ("I2",))
    audit.admitted("x", "g", "standard", 0.0, 9, {})
    audit.admitted("y", "g", "standard", 1.0, 0, {"promoted": 2})
    assert not audit.verdicts["I2"].holds


def _notes(path, policy):
    log = NoteLog()
    replay_file(path, 20, policy=policy, params={"contracts": C}, recorder=log)
    return log.notes


def _gate_trace(tmp_path):
    # default contracts; 8 usable blocks; hits, and evictions for both policies
    return write(tmp_path, [
        {"t": 0, "id": "A", "group": "g1", "blocks": ["a1", "a2", "a3"], "tail": 1,
         "done_t": 0.5},
        {"t": 1, "id": "B", "group": "g1", "blocks": ["a1", "a2", "b3"], "tail": 1,
         "done_t": 1.5},
        {"t": 2, "id": "C", "group": "g2", "blocks": ["c1", "c2", "c3", "c4", "c5"], "tail": 1,
         "done_t": 2.5},
        {"t": 3, "id": "D", "group": "g1", "blocks": ["a1", "a2", "d3"], "tail": 1,
         "done_t": 3.5},
    ], name="gate.jsonl")


def _gate(tmp_path, candidate, out):
    res = replay(ReplayConfig(trace=str(_gate_trace(tmp_path)), baseline="lru",
                              candidate=candidate, capacity=9, out=tmp_path / out))
    checks = {c["name"]: c for c in res.receipt["gate"]["checks"]}
    return res, checks


def test_gate_fails_when_i1_is_violated(tmp_path):
    ok, checks = _gate(tmp_path, "prefixshield", "ok")
    assert ok.passed and ok.exit_code == 0, [c for c in checks.values()
                                             if c["verdict"] == "fail"]
    assert checks["candidate invariant I1"]["verdict"] == "pass"
    assert checks["candidate invariant I2"]["verdict"] == "pass"
    assert checks["candidate exercised eviction"]["observed"] > 0

    bad, checks = _gate(tmp_path, "test-ps-charges-hits", "bad")
    assert not bad.passed and bad.exit_code != 0
    assert bad.receipt["gate"]["result"] == "fail"
    c = checks["candidate invariant I1"]
    assert c["verdict"] == "fail" and c["observed"] > 0 and c["threshold"] == 0
    assert [n for n, c in checks.items() if c["verdict"] == "fail"] == [
        "candidate invariant I1"]
    inv = bad.receipt["runs"]["candidate"]["invariants"]["I1"]
    assert inv["hard"] and not inv["holds"] and "request B" in inv["first_violation"]
    assert (tmp_path / "bad" / "receipt.json").exists()


def test_the_auditor_takes_what_its_python_form_takes():
    """Compiled (a cdef class), BucketAudit still keeps a policy's own attributes and takes
    counts that are not C integers, as the Python form does."""
    audit = BucketAudit(C, 1e-9, ("I1", "I2"))
    audit.tag = "mine"
    audit.admitted("x", "g", "standard", 0.0, 2.0, {"charged": 2, "group": "g",
                                                    "contract": "standard"})
    assert audit.tag == "mine" and audit.verdicts["I1"].holds
    assert audit.materialized == {"g": 2.0}
