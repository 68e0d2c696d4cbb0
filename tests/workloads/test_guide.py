"""The practitioner guide's workloads (psgate.workloads.guide): valid, deterministic,
labelled, each scenario really has the property it is named for, and each replays
(lru vs prefixshield; priority-expiry also vs priority-lru) with every hard
invariant holding. Hit fractions are not asserted here: they describe policies,
not generators."""

from __future__ import annotations

import csv
import json
from collections import Counter, defaultdict

import pytest

from psgate.api import ReplayConfig, replay
from psgate.errors import InputError
from psgate.invariants.checker import HARD
from psgate.receipt.ledger import open_text
from psgate.trace import validate_trace
from psgate.trace.writer import dump_lines, write_trace
from psgate.workloads import generate, generators
from psgate.workloads import guide

from helpers import structural_failures

DEFAULTS = {
    "steady": guide.STEADY_DEFAULTS,
    "fanout": guide.FANOUT_DEFAULTS,
    "tenant-flood": guide.TENANT_FLOOD_DEFAULTS,
    "priority-expiry": guide.PRIORITY_EXPIRY_DEFAULTS,
    "revision-rollover": guide.REVISION_ROLLOVER_DEFAULTS,
    "adapter-churn": guide.ADAPTER_CHURN_DEFAULTS,
    "cancellation": guide.CANCELLATION_DEFAULTS,
    "cold": guide.COLD_DEFAULTS,
}
KINDS = list(DEFAULTS)
ROLES = {
    "steady": {"benign"},
    "fanout": {"victim", "benign"},
    "tenant-flood": {"victim", "attacker"},
    "priority-expiry": {"victim", "benign", "attacker"},
    "revision-rollover": {"benign"},
    "adapter-churn": {"benign"},
    "cancellation": {"victim", "benign"},
    "cold": {"benign"},
}
# Small overrides that still give a valid trace (every kind, a different seed).
SMALL = {"seed": 3, "duration_s": 12.0}


def requests_of(lines):
    return [x for x in lines[1:] if x["op"] == "request"]


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    d = tmp_path_factory.mktemp("guide")
    out = {}
    for kind in KINDS:
        lines = generate(kind, {"seed": 0})
        path = d / f"{kind}.jsonl"
        write_trace(path, lines)
        out[kind] = (lines, path)
    return out


@pytest.fixture(scope="module")
def replays(traces, tmp_path_factory):
    """Receipts (and requests.csv rows) of lru vs CANDIDATE, computed once per pair."""
    d = tmp_path_factory.mktemp("guide-replays")
    cache = {}

    def get(kind: str, candidate: str = "prefixshield"):
        key = (kind, candidate)
        if key not in cache:
            out = d / f"{kind}-{candidate}"
            res = replay(ReplayConfig(trace=str(traces[kind][1]), baseline="lru",
                                      candidate=candidate, out=out,
                                      allow_unexercised=kind == "cold"))
            with open(out / "requests.csv", newline="") as fh:
                rows = list(csv.DictReader(fh))
            cache[key] = (res, rows, out)
        return cache[key]

    return get


# -- registry -------------------------------------------------------------------

def test_every_kind_is_registered_with_its_documented_defaults():
    gens = generators()
    for kind, defaults in DEFAULTS.items():
        assert kind in gens, kind
        assert gens[kind].defaults == defaults
        assert defaults["block_size"] == 16 and defaults["seed"] == 0
        assert kind in guide.__doc__
        assert gens[kind].summary


def test_parameters_are_checked():
    with pytest.raises(InputError, match="unknown parameter"):
        generate("steady", {"tenant": 3})
    with pytest.raises(InputError, match="expects int"):
        generate("fanout", {"fanout": "16"})
    with pytest.raises(InputError, match="'fanout' expects a value > 0"):
        generate("fanout", {"fanout": 0})
    with pytest.raises(InputError, match="suffix_max_tokens"):
        generate("steady", {"suffix_min_tokens": 80, "suffix_max_tokens": 40})
    with pytest.raises(InputError, match="new_scope"):
        generate("revision-rollover", {"new_scope": "llm@rev-a"})
    with pytest.raises(InputError, match="early_cancel_frac"):
        generate("cancellation", {"early_cancel_frac": 1.5})


# -- every kind -------------------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
def test_trace_validates(kind, traces):
    lines, path = traces[kind]
    header, summary = validate_trace(str(path))
    assert header.block_size == 16
    reqs = requests_of(lines)
    assert summary.num_requests == len(reqs) > 100
    assert summary.num_cancels == sum(x["op"] == "cancel" for x in lines[1:])
    assert set(header.groups) == {r["group"] for r in reqs}
    assert max(len(r["blocks"]) + 1 for r in reqs) < 511     # every request fits


@pytest.mark.parametrize("kind", KINDS)
def test_overridden_trace_validates(kind, tmp_path):
    p = tmp_path / "t.jsonl"
    write_trace(p, generate(kind, SMALL))
    _, summary = validate_trace(str(p))
    assert summary.num_requests > 0


@pytest.mark.parametrize("kind", KINDS)
def test_deterministic_per_seed(kind, traces):
    a = dump_lines(traces[kind][0])
    assert dump_lines(generate(kind, {"seed": 0})) == a
    assert dump_lines(generate(kind, {})) == a              # seed 0 is the default
    assert dump_lines(generate(kind, {"seed": 1})) != a


@pytest.mark.parametrize("kind", KINDS)
def test_header_records_every_parameter(kind, traces):
    header = traces[kind][0][0]
    gen = header["generator"]
    assert gen["name"] == kind
    # cold's ``rates`` at its default ("service") stays out, as before it existed
    recorded = {k: v for k, v in DEFAULTS[kind].items() if k != "rates"}
    assert gen["params"] == recorded
    assert isinstance(gen["derived"], dict)
    assert header["hashing"] == "synthetic-blake2b-128"
    over = generate(kind, SMALL)[0]["generator"]["params"]
    assert over == {**recorded, **SMALL}


@pytest.mark.parametrize("kind", KINDS)
def test_requests_are_labelled(kind, traces):
    lines, _ = traces[kind]
    reqs = requests_of(lines)
    assert {r["role"] for r in reqs} == ROLES[kind]
    assert all(isinstance(r["prefix"], str) and r["prefix"] for r in reqs)
    assert all(r["contract"] in ("critical", "standard", "best-effort") for r in reqs)
    # A prefix label names shared content: in one scope, its requests share their first
    # block; in one (group, scope), two labels never start with the same block.
    first = defaultdict(set)
    label_of = {}
    for r in reqs:
        first[r["scope"], r["prefix"]].add(r["blocks"][0] if r["blocks"] else None)
        key = (r["group"], r["scope"], r["blocks"][0] if r["blocks"] else None)
        assert label_of.setdefault(key, r["prefix"]) == r["prefix"], key
    assert all(len(v) == 1 for v in first.values())
    if kind != "cold":
        assert any(r.get("measure") is False for r in reqs)     # a warm-up is kept out
        counts = Counter(r["prefix"] for r in reqs)
        assert counts.most_common(1)[0][1] >= 10                # something is hot


@pytest.mark.parametrize("kind", KINDS)
def test_replays_with_every_hard_invariant(kind, replays):
    res, rows, _ = replays(kind)
    r = res.receipt
    assert structural_failures(r) == []
    for label in ("baseline", "candidate"):
        run = r["runs"][label]
        assert run["aborted"] is None
        inv = run["invariants"]
        for name in HARD:
            assert inv[name]["holds"], (label, name, inv[name]["first_violation"])
        if kind != "cold":
            assert run["metrics"]["totals"]["evictions"] > 0
    assert {"I1", "I2"} <= set(r["runs"]["candidate"]["invariants"])
    assert all(v["holds"] for v in r["runs"]["candidate"]["invariants"].values())
    assert set(r["runs"]["baseline"]["metrics"]["roles"]) == ROLES[kind]
    assert not r["runs"]["baseline"]["rejected_ids"]


# -- scenario-specific ------------------------------------------------------------

def test_steady_has_no_attacker_and_only_hot_prompts(traces):
    p = guide.STEADY_DEFAULTS
    reqs = requests_of(traces["steady"][0])
    labels = {r["prefix"] for r in reqs}
    assert len(labels) == p["tenants"] * p["prompts_per_tenant"]
    assert {r["scope"] for r in reqs} == {"m"}


def test_fanout_has_synchronized_bursts_from_one_prompt(traces):
    p = guide.FANOUT_DEFAULTS
    lines = traces["fanout"][0]
    agents = [r for r in requests_of(lines) if r["group"] == "agents"]
    assert {r["prefix"] for r in agents} == {"agents-sys"}
    n_sys = p["system_tokens"] // p["block_size"]
    bursts, cur = [], [agents[0]]
    for r in agents[1:]:
        if r["t"] - cur[-1]["t"] > p["burst_spread_ms"] / 1000:
            bursts.append(cur)
            cur = []
        cur.append(r)
    bursts.append(cur)
    assert len(bursts) == lines[0]["generator"]["derived"]["bursts"] >= 10
    for b in bursts:
        assert len(b) >= p["fanout"] == 16
        assert b[-1]["t"] - b[0]["t"] <= p["burst_spread_ms"] / 1000 + 1e-9
        assert len({tuple(r["blocks"][:n_sys]) for r in b}) == 1
        assert len({r["blocks"][n_sys] for r in b}) == len(b)   # each its own task
    assert {r["role"] for r in agents} == {"victim"}


def test_tenant_flood_floods_unseen_prefixes_only_in_its_window(traces):
    p = guide.TENANT_FLOOD_DEFAULTS
    reqs = requests_of(traces["tenant-flood"][0])
    flood = [r for r in reqs if r["role"] == "attacker"]
    assert {r["group"] for r in flood} == {"flooder"}
    assert all(p["flood_start_s"] <= r["t"] < p["flood_end_s"] for r in flood)
    seen = Counter(h for r in flood for h in r["blocks"])
    assert max(seen.values()) == 1                       # never a block twice
    victims = [r for r in reqs if r["role"] == "victim"]
    assert all((r.get("measure", True)) == (r["t"] >= p["flood_start_s"]) for r in victims)
    assert not set(seen) & {h for r in victims for h in r["blocks"]}


def test_priority_expiry_hints_are_as_documented_and_expire_inside_the_trace(traces):
    p = guide.PRIORITY_EXPIRY_DEFAULTS
    lines = traces["priority-expiry"][0]
    reqs = requests_of(lines)
    end = lines[-1]["t"]
    assert set(guide.PRIORITY_HINTS) == {r["group"] for r in reqs}
    assert lines[0]["generator"]["derived"]["hints"] == guide.PRIORITY_HINTS
    by = defaultdict(list)
    for r in reqs:
        by[r["group"]].append(r)
    assert all(r["priority"] == p["chat_priority"] and "priority_until" not in r
               for r in by["chat"])
    assert all(r["priority"] == p["promo_priority"]
               and r["priority_until"] == p["promo_end_s"] for r in by["promo"])
    assert all(r["priority"] == p["session_priority"]
               and r["priority_until"] == pytest.approx(r["t"] + p["session_retention_s"])
               for r in by["assist"])
    assert all("priority" not in r and "priority_until" not in r for r in by["batch"])
    # Hints that end inside the trace, with traffic after them.
    expiring = [r for r in reqs if "priority_until" in r and r["priority_until"] < end]
    assert any(r["group"] == "promo" for r in expiring)
    assert all(r["t"] < r["priority_until"] for r in expiring)
    # Some follow-up turns come after their first turn's hint has ended.
    until = {r["id"]: r["priority_until"] for r in by["assist"]}
    late = [r for r in by["assist"] if r["id"].endswith("-1")
            and r["t"] >= until[r["id"][:-1] + "0"]]
    assert late and len(late) == lines[0]["generator"]["derived"][
        "followups_after_hint_expired"]


def test_priority_expiry_replays_under_priority_lru_and_hints_expire(replays):
    res, _, out = replays("priority-expiry", "priority-lru")
    r = res.receipt
    assert res.passed, [c for c in r["gate"]["checks"] if c["verdict"] == "fail"]
    for label in ("baseline", "candidate"):
        assert all(r["runs"][label]["invariants"][n]["holds"] for n in HARD)
    assert r["runs"]["candidate"]["metrics"]["totals"]["evictions"] > 0
    expired_owners = Counter()
    with open_text(out / "ledger.compact.csv.gz") as fh:
        for row in csv.DictReader(fh):
            if row["run"] == "candidate" and row["kind"] == "evict":
                if json.loads(row["rank"]).get("expired"):
                    expired_owners[row["owner"]] += 1
    # The promo hint (absolute end) and session hints (relative end) both ran out
    # while their blocks were still cached, and priority-lru saw it.
    assert expired_owners["promo"] > 0 and expired_owners["assist"] > 0


def test_revision_rollover_changes_scope_and_old_kv_is_useless(traces, replays):
    p = guide.REVISION_ROLLOVER_DEFAULTS
    reqs = requests_of(traces["revision-rollover"][0])
    for r in reqs:
        assert r["scope"] == (p["new_scope"] if r["t"] >= p["rollover_s"] else p["old_scope"])
    old = {h for r in reqs if r["scope"] == p["old_scope"] for h in r["blocks"]}
    new = {h for r in reqs if r["scope"] == p["new_scope"] for h in r["blocks"]}
    assert old & new                      # same text, same hashes: only the scope differs
    scope_of = {r["id"]: r["scope"] for r in reqs}
    prefix_of = {r["id"]: (r["group"], r["prefix"]) for r in reqs}
    _, rows, _ = replays("revision-rollover")
    for run in ("baseline", "candidate"):
        first_new = {}
        for row in rows:
            if row["run"] == run and scope_of[row["id"]] == p["new_scope"]:
                first_new.setdefault(prefix_of[row["id"]], row)
        assert len(first_new) == p["tenants"] * p["prompts_per_tenant"]
        assert all(int(row["cached_tokens"]) == 0 for row in first_new.values())
        later = [row for row in rows if row["run"] == run
                 and scope_of[row["id"]] == p["new_scope"]
                 and row not in first_new.values() and row["state"] == "completed"]
        assert sum(int(row["cached_tokens"]) > 0 for row in later) > len(later) // 2


def test_adapter_churn_cycles_many_scopes(traces):
    p = guide.ADAPTER_CHURN_DEFAULTS
    reqs = requests_of(traces["adapter-churn"][0])
    scopes = {r["scope"] for r in reqs}
    assert len(scopes) == p["adapters"]
    assert all(s.startswith(p["base_scope"] + "+lora-") for s in scopes)
    assert all(len({r["prefix"] for r in reqs if r["scope"] == s}) == 1 for s in scopes)
    # Only active_adapters scopes are in use within any one cycle.
    per_cycle = defaultdict(set)
    for r in reqs:
        per_cycle[int(r["t"] // p["cycle_s"])].add(r["scope"])
    assert max(len(v) for v in per_cycle.values()) <= p["active_adapters"]
    assert len(per_cycle) >= 8
    # Adapters of one tenant share the system prompt's text: equal hashes, other scopes.
    firsts = defaultdict(set)
    for r in reqs:
        firsts[r["blocks"][0]].add(r["scope"])
    assert max(len(v) for v in firsts.values()) > 1


def test_cancellation_cancels_early_and_late_and_carries_done_t(traces, replays):
    p = guide.CANCELLATION_DEFAULTS
    lines = traces["cancellation"][0]
    reqs = {r["id"]: r for r in requests_of(lines)}
    cancels = [x for x in lines[1:] if x["op"] == "cancel"]
    delays = [c["t"] - reqs[c["id"]]["t"] for c in cancels]
    assert all(d > 0 for d in delays)
    early = [d for d in delays if d <= p["abandon_max_ms"] / 1000]
    late = [d for d in delays if d >= p["late_min_s"]]
    assert len(early) >= 10 and len(late) >= 10
    assert len(early) + len(late) == len(cancels)
    assert len({c["id"] for c in cancels}) == len(cancels)
    done = [r for r in reqs.values() if "done_t" in r]
    assert len(done) >= 10 and all(r["done_t"] > r["t"] for r in done)
    assert not {r["id"] for r in done} & {c["id"] for c in cancels}
    # In replay the cancels hit requests waiting for capacity (dropped), running ones
    # (cancelled) and finished ones (late no-ops), under both policies.
    res, rows, _ = replays("cancellation")
    for run in ("baseline", "candidate"):
        states = Counter(row["state"] for row in rows if row["run"] == run)
        assert states["dropped"] > 0 and states["cancelled"] > 0
        counts = res.receipt["runs"][run]["counts"]
        assert counts["late_cancels"] > 0 and counts["waits"] > 0


def test_cold_never_repeats_a_block_and_never_hits(traces, replays):
    reqs = requests_of(traces["cold"][0])
    hashes = [h for r in reqs for h in r["blocks"]]
    assert len(hashes) == len(set(hashes))
    assert len({r["prefix"] for r in reqs}) == len(reqs)
    res, rows, _ = replays("cold")
    for run in ("baseline", "candidate"):
        totals = res.receipt["runs"][run]["metrics"]["totals"]
        assert totals["hit_fraction"] == 0 and totals["saved_prefill_tokens"] == 0
        assert all(int(row["cached_tokens"]) == 0 for row in rows if row["run"] == run)
