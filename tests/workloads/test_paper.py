"""The paper's workload generators (psgate.workloads.paper): one-touch with PrefixShield
protecting the victim and borrowing (the committed defaults, docs/design.md section 7,
fixed before any policy was compared on them); then the newer generators: low-and-slow,
two-pass-replay, delayed-replay, sharegpt, sharegpt-bursty, and one-touch's
``capacity_target`` and ``creation_pressure`` (Fig. 2 scaling and the creation-pressure
axis).

Structure only: every trace validates, is deterministic, records its parameters, labels
roles, prefixes and warm-up; no-attack controls keep the other roles byte-identical; the
documented formulas hold. The replays check only that the default gate passes (hard
invariants hold, eviction exercised): no policy ranking is asserted here.
"""

from __future__ import annotations

import math

import orjson
import pytest

from psgate.api import ReplayConfig, replay
from psgate.contracts import DEFAULT_CONTRACTS
from psgate.engines.cost import CostModel
from psgate.errors import InputError
from psgate.stats.metrics import summarize
from psgate.trace.reader import validate_trace
from psgate.trace.writer import dump_lines, write_trace
from psgate.workloads import generate, generators
from psgate.workloads.paper import (DELAYED_REPLAY_DEFAULTS, LOW_AND_SLOW_DEFAULTS,
                                    ONE_TOUCH_DEFAULTS, SHAREGPT_BURSTY_DEFAULTS,
                                    SHAREGPT_DEFAULTS, TWO_PASS_DEFAULTS, borrowing,
                                    bucket_debt, mean_bucket_debt, one_touch)

from helpers import replay_file, structural_failures


def victim_hit(result) -> float:
    return summarize([o for o in result.requests if o.role == "victim"],
                     CostModel())["hit_fraction"]


def test_one_touch_defaults_are_the_papers():
    assert ONE_TOUCH_DEFAULTS["prefix_tokens"] == 1536 and ONE_TOUCH_DEFAULTS["hot_prefixes"] == 4
    assert ONE_TOUCH_DEFAULTS["alpha"] == 0.6 and ONE_TOUCH_DEFAULTS["block_size"] == 16
    header = one_touch()[0]
    d = header["generator"]["derived"]
    assert d["attack_rate_per_s"] == pytest.approx(min(0.75, 1.15 * 0.6) * d["c_prefill_per_s"])


@pytest.mark.parametrize("seed", range(5))
def test_one_touch_prefixshield_beats_lru_for_the_victim(tmp_path, seed):
    p = tmp_path / "ot.jsonl"
    write_trace(p, one_touch(seed=seed))
    lru, _, _ = replay_file(p, 512, policy="lru")
    ps, _, _ = replay_file(p, 512, policy="prefixshield")
    assert all(v.holds for v in ps.invariants.values())
    assert {"I1", "I2"} <= set(ps.invariants)
    assert lru.evictions > 1000 and ps.evictions > 1000
    assert victim_hit(ps) > victim_hit(lru)
    assert ps.orphans["orphans_created"] == 0


@pytest.mark.parametrize("policy, low, high", [
    ("lru", 509, 511), ("prefixshield", 509, 511), ("s3fifo", 509, 511),
    ("static-quota", 250, 255),
])
def test_borrowing_active_group_fills_cache_unless_quota(tmp_path, policy, low, high):
    p = tmp_path / "b.jsonl"
    write_trace(p, borrowing())
    result, _, _ = replay_file(p, 512, policy=policy, paranoid=False)
    assert low <= result.occupancy_max["active"] <= high
    assert all(v.holds for v in result.invariants.values())

NEW = {"low-and-slow": LOW_AND_SLOW_DEFAULTS, "two-pass-replay": TWO_PASS_DEFAULTS,
       "delayed-replay": DELAYED_REPLAY_DEFAULTS, "sharegpt": SHAREGPT_DEFAULTS,
       "sharegpt-bursty": SHAREGPT_BURSTY_DEFAULTS}
ATTACK_KINDS = ("one-touch", "low-and-slow", "two-pass-replay", "delayed-replay")
ROLES = {"victim", "attacker", "benign"}
_CACHE: dict[tuple, list[dict]] = {}


def gen(kind: str, **params) -> list[dict]:
    key = (kind, orjson.dumps(params, option=orjson.OPT_SORT_KEYS))
    if key not in _CACHE:
        _CACHE[key] = generate(kind, params)
    return _CACHE[key]


def requests(lines):
    return [x for x in lines[1:] if x["op"] == "request"]


@pytest.mark.parametrize("kind", sorted(NEW))
def test_registered_with_the_module_defaults(kind):
    g = generators()[kind]
    assert g.defaults == NEW[kind]
    assert g.defaults["block_size"] == 16 and g.defaults["seed"] == 0


@pytest.mark.parametrize("kind", sorted(NEW))
def test_output_validates_and_records_params(tmp_path, kind):
    lines = gen(kind)
    path = tmp_path / "t.jsonl"
    write_trace(path, lines)
    header, summary = validate_trace(str(path))
    assert header.block_size == 16
    assert summary.num_requests == len(requests(lines)) > 0
    h = lines[0]
    assert h["generator"]["name"] == kind
    # rates at its default ("service") and answers off stay out, as before they existed
    assert h["generator"]["params"] == {k: v for k, v in NEW[kind].items()
                                        if k not in ("rates", "answers")}
    assert h["generator"]["derived"]
    reqs = requests(lines)
    assert set(h["groups"]) == {r["group"] for r in reqs}
    for r in reqs:
        assert r["role"] in ROLES and r["prefix"]
        assert r["contract"] in h["groups"][r["group"]]["contracts"]
        assert r.get("measure", True) in (True, False)
    assert any(r.get("measure", True) for r in reqs)
    if kind in ATTACK_KINDS:
        assert {r["role"] for r in reqs} >= {"victim", "attacker"}
        assert any(r.get("measure") is False for r in reqs)     # the warm-up
        assert all(r.get("measure") is False for r in reqs if r["t"] < 1.0)
    else:
        assert {r["role"] for r in reqs} == {"benign"}


@pytest.mark.parametrize("kind", sorted(NEW))
def test_deterministic_from_the_seed(kind):
    a = dump_lines(gen(kind))
    assert dump_lines(generate(kind, {})) == a
    assert dump_lines(gen(kind, seed=1)) != a
    assert dump_lines(generate(kind, {"seed": 1})) == dump_lines(gen(kind, seed=1))


@pytest.mark.parametrize("kind, bad", [
    ("delayed-replay", {"delay_fraction": 1.5}), ("delayed-replay", {"attacker_rho": 0.0}),
    ("low-and-slow", {"rate_fraction": 0.0}), ("two-pass-replay", {"replay_set": 0}),
    ("sharegpt", {"min_turns": 9}), ("sharegpt", {"tenant_contracts": []}),
    ("sharegpt-bursty", {"burst_s": 30.0}), ("one-touch", {"capacity_target": 1}),
    ("one-touch", {"creation_pressure": 0.0}), ("one-touch", {"creation_pressure": -1.0}),
    ("one-touch", {"creation_pressure": "high"}), ("one-touch", {"creation_pressure": True}),
    ("one-touch", {"creation_pressure": 2.0, "attacker_contract": "gold"}),
])
def test_bad_parameters_are_input_errors(kind, bad):
    with pytest.raises(InputError):
        generate(kind, bad)


@pytest.mark.parametrize("kind", ATTACK_KINDS)
def test_attack_false_keeps_everyone_elses_requests_byte_identical(kind):
    on, off = gen(kind), gen(kind, attack=False)
    assert not any(r["role"] == "attacker" for r in requests(off))
    assert any(r["role"] == "attacker" for r in requests(on))
    others = [r for r in requests(on) if r["role"] != "attacker"]
    assert dump_lines(others) == dump_lines(requests(off))
    p = dict(on[0]["generator"]["params"], attack=False)
    assert off[0]["generator"]["params"] == p


def test_new_attack_kinds_share_one_touchs_victim_layout():
    ls, tp = gen("low-and-slow"), gen("two-pass-replay")
    victims = [r for r in requests(ls) if r["role"] == "victim"]
    assert victims == [r for r in requests(tp) if r["role"] == "victim"]
    hot = {r["prefix"] for r in victims}
    assert hot == {f"victim-sys-{i}" for i in range(4)}
    assert {len(r["blocks"]) for r in victims} == {96 + 2}
    assert {(r["group"], r["contract"]) for r in victims} == {("victim", "critical")}


def test_low_and_slow_is_one_touchs_volume_at_a_fraction_of_its_rate():
    d = gen("low-and-slow")[0]["generator"]["derived"]
    ot = gen("one-touch")[0]["generator"]["derived"]
    assert d["one_touch_attack_rate_per_s"] == ot["attack_rate_per_s"]
    assert d["attack_rate_per_s"] == pytest.approx(0.25 * ot["attack_rate_per_s"], rel=1e-6)
    w, w_ot = d["attack_window_s"], ot["attack_window_s"]
    assert w[1] - w[0] == pytest.approx(4 * (w_ot[1] - w_ot[0]), rel=1e-5)
    attacks = [r for r in requests(gen("low-and-slow")) if r["role"] == "attacker"]
    assert len({r["prefix"] for r in attacks}) == len(attacks)          # each unseen
    assert 200 <= len(attacks) <= 280                                   # ~240 requests
    assert all(w[0] <= r["t"] < w[1] for r in attacks)


def test_two_pass_replays_each_admitted_set_while_in_debt():
    attacks = [r for r in requests(gen("two-pass-replay", replay_set=3))
               if r["role"] == "attacker"]
    admitted: list[str] = []
    for i, r in enumerate(attacks):
        rnd, pos = divmod(i, 6)
        assert r["pass"] == (1 if pos < 3 else 2)
        if r["pass"] == 1:
            assert r["prefix"] not in admitted
            admitted.append(r["prefix"])
        else:   # the same prompt, same order, as pass 1 of this round
            first = attacks[rnd * 6 + pos - 3]
            assert (r["prefix"], r["blocks"]) == (first["prefix"], first["blocks"])
    d = gen("two-pass-replay")[0]["generator"]["derived"]
    assert d["attack_creation_blocks_per_s"] > DEFAULT_CONTRACTS["best-effort"][0]


@pytest.mark.parametrize("fraction", [0.0, 0.5, 1.0])
def test_delayed_replay_timing_is_the_documented_formula(fraction):
    assert [DELAYED_REPLAY_DEFAULTS["attacker_rho"],
            DELAYED_REPLAY_DEFAULTS["attacker_beta"]] == DEFAULT_CONTRACTS["best-effort"]
    lines = gen("delayed-replay", delay_fraction=fraction)
    reqs = requests(lines)
    first = [r for r in reqs if r["role"] == "attacker" and "pass" not in r]
    second = [r for r in reqs if r.get("pass") == 2]
    assert len(first) == len(second) == 2
    assert [r["blocks"] for r in first] == [r["blocks"] for r in second]
    assert [r["prefix"] for r in first] == [r["prefix"] for r in second]
    # D: a full bucket of beta = 128 charged 96 blocks, refilled 16/s for the gap, charged 96.
    t1, t2 = first[0]["t"], first[1]["t"]
    debt = 96 + 96 - 128 - 16 * (t2 - t1)
    assert bucket_debt([t1, t2], [96, 96], 16.0, 128.0) == pytest.approx(debt)
    clearance = debt / 16
    expect = math.ceil(round((t2 + fraction * clearance) * 1e6, 3)) / 1e6
    assert second[0]["t"] == pytest.approx(expect, abs=1e-9)
    assert second[0]["t"] >= t2 + fraction * clearance - 1e-12
    d = lines[0]["generator"]["derived"]
    assert d["debt_blocks"] == pytest.approx(debt, abs=1e-6)
    assert d["clearance_s"] == pytest.approx(clearance, abs=1e-6)
    assert d["replay_eligible_blocks"] == 192          # the replay hits every full block
    assert all(r["tail"] > 0 for r in first)
    # Pressure: after every replay and after the debt cleared, exactly standard's burst.
    neutral = [r for r in reqs if r["role"] == "benign"]
    assert [r["t"] for r in neutral] == pytest.approx([t2 + clearance + 1.0] * 2, abs=1e-6)
    assert min(r["t"] for r in neutral) > max(r["t"] for r in second)
    assert sum(len(r["blocks"]) for r in neutral) == DEFAULT_CONTRACTS["standard"][1]
    after = [r for r in reqs if r["role"] == "victim" and r.get("measure", True)]
    assert len(after) == 2 and min(r["t"] for r in after) > neutral[0]["t"]


def test_one_touch_capacity_target_default_is_byte_identical():
    assert ONE_TOUCH_DEFAULTS["capacity_target"] == 512
    base = gen("one-touch")
    assert dump_lines(gen("one-touch", capacity_target=512)) == dump_lines(base)
    assert "capacity_target" not in base[0]["generator"]["params"]
    assert "hot_prefixes" not in base[0]["generator"]["derived"]


@pytest.mark.parametrize("capacity", [512, 1024, 2048, 4096])
def test_one_touch_capacity_target_keeps_the_working_set_fraction(capacity):
    lines = gen("one-touch", capacity_target=capacity)
    victims = [r for r in requests(lines) if r["role"] == "victim"]
    hot = {r["prefix"] for r in victims}
    assert len(hot) == 4 * capacity // 512
    per_prefix = {len(r["blocks"]) for r in victims}
    assert per_prefix == {96 + 2}
    fraction = len(hot) * 98 / (capacity - 1)
    assert fraction == pytest.approx(0.766, abs=0.002)
    d = lines[0]["generator"]["derived"]
    w = d["attack_window_s"]
    w512 = gen("one-touch")[0]["generator"]["derived"]["attack_window_s"]
    assert w[1] - w[0] == pytest.approx(w512[1] - w512[0])          # fixed in requests
    assert d["attack_rate_per_s"] * (w[1] - w[0]) == pytest.approx(240)
    if capacity != 512:
        assert lines[0]["generator"]["params"]["capacity_target"] == capacity
        assert d["victim_working_set_fraction"] == pytest.approx(fraction, abs=1e-6)
        # every hot prefix is read before the attack as often as at 512 blocks
        warm = [r for r in victims if r["t"] < w[0]]
        assert all(r.get("measure") is False for r in warm)
        assert len(warm) / len(hot) > 10


def test_one_touch_creation_pressure_default_is_byte_identical():
    assert ONE_TOUCH_DEFAULTS["creation_pressure"] is None
    base = gen("one-touch")
    assert dump_lines(gen("one-touch", creation_pressure=None)) == dump_lines(base)
    assert "creation_pressure" not in base[0]["generator"]["params"]
    assert "creation_pressure" not in base[0]["generator"]["derived"]


@pytest.mark.parametrize("ratio", [0.54, 1.02, 2.14, 4.23])
def test_one_touch_creation_pressure_sets_the_attack_rate_over_the_fixed_window(ratio):
    base, lines = gen("one-touch"), gen("one-touch", creation_pressure=ratio)
    # the victim is untouched: same requests, same window
    victims = [r for r in requests(lines) if r["role"] != "attacker"]
    assert dump_lines(victims) == dump_lines([r for r in requests(base)
                                              if r["role"] != "attacker"])
    d, d0 = lines[0]["generator"]["derived"], base[0]["generator"]["derived"]
    assert d["attack_window_s"] == d0["attack_window_s"]
    assert lines[0]["generator"]["params"]["creation_pressure"] == ratio
    rho, beta = DEFAULT_CONTRACTS["best-effort"]
    cp = d["creation_pressure"]
    assert (cp["target"], cp["attacker_refill_blocks_per_s"], cp["attacker_burst_blocks"]) == (
        ratio, rho, beta)
    assert d["attack_rate_per_s"] == pytest.approx(ratio * rho / 96, abs=1e-6)
    attacks = [r for r in requests(lines) if r["role"] == "attacker"]
    start, end = d["attack_window_s"]
    assert all(start <= r["t"] < end and len(r["blocks"]) == 96 for r in attacks)
    assert cp["attack_requests"] == len(attacks)
    assert cp["observed"] == pytest.approx(len(attacks) * 96 / (end - start) / rho, abs=1e-5)
    assert cp["nominal_mean_debt_blocks"] == pytest.approx(mean_bucket_debt(
        [r["t"] for r in attacks], 96, rho, beta, start, end), abs=1e-4)


def test_one_touch_creation_pressure_observed_ratio_tracks_the_target():
    """Over seeds the Poisson draw averages out: the mean observed ratio is near the target,
    and a higher target gives more attack requests and more debt."""
    obs, debt = {}, {}
    for ratio in (1.0, 4.0):
        cps = [generate("one-touch", {"seed": s, "creation_pressure": ratio})[0]["generator"]
               ["derived"]["creation_pressure"] for s in range(12)]
        obs[ratio] = sum(c["observed"] for c in cps) / len(cps)
        debt[ratio] = sum(c["nominal_mean_debt_blocks"] for c in cps) / len(cps)
        assert obs[ratio] == pytest.approx(ratio, rel=0.2)
    assert debt[4.0] > debt[1.0] * 10


def test_mean_bucket_debt_is_the_time_average_of_the_lazy_bucket():
    # one charge of beta + 32 at t = 0: debt 32 falling at rho = 16/s, clear at t = 2 s
    assert mean_bucket_debt([0.0], 160, 16.0, 128.0, 0.0, 4.0) == pytest.approx(32 * 2 / 2 / 4)
    assert mean_bucket_debt([], 96, 16.0, 128.0, 0.0, 4.0) == 0.0
    assert mean_bucket_debt([1.0], 100, 16.0, 128.0, 0.0, 4.0) == 0.0   # within the burst
    # two charges: the second lands while 16 are still owed
    m = mean_bucket_debt([0.0, 1.0], 160, 16.0, 128.0, 0.0, 10.0)
    # debt 32 -> 16 over [0, 1] (area 24), then 16 + 160 = 176 -> 0 over 11 s, cut at 10
    area = 24 + (176 * 9 - 16 * 81 / 2)
    assert m == pytest.approx(area / 10)


def _conversations(lines):
    convs: dict[str, list[dict]] = {}
    for r in requests(lines):
        convs.setdefault(r["prefix"], []).append(r)
    return convs


@pytest.mark.parametrize("kind", ["sharegpt", "sharegpt-bursty"])
def test_sharegpt_turns_share_the_previous_prompt_as_prefix(kind):
    lines = gen(kind)
    convs = _conversations(lines)
    assert len(convs) == 200
    turns = [len(c) for c in convs.values()]
    assert max(turns) <= 8 and 2.5 <= sum(turns) / len(turns) <= 4.5
    shared = 0
    for c in convs.values():
        assert len({(r["group"], r["contract"]) for r in c}) == 1
        for prev, cur in zip(c, c[1:]):
            assert cur["t"] > prev["t"]
            assert cur["blocks"][:len(prev["blocks"])] == prev["blocks"]
            prev_tokens = 16 * len(prev["blocks"]) + prev["tail"]
            cur_tokens = 16 * len(cur["blocks"]) + cur["tail"]
            # the previous answer and a new message follow the previous prompt
            assert cur_tokens >= prev_tokens + prev["out"] + 1
            # only the previous prompt's full blocks are shared: the next block is new
            if len(cur["blocks"]) > len(prev["blocks"]):
                assert cur["blocks"][len(prev["blocks"])] not in prev["blocks"]
            shared += len(prev["blocks"])
        assert 16 * len(c[-1]["blocks"]) + c[-1]["tail"] + c[-1]["out"] <= 4096
    assert shared > 0
    tenants = lines[0]["groups"]
    assert {g: v["contracts"] for g, v in tenants.items()} == {
        "tenant-0": ["critical"], "tenant-1": ["standard"], "tenant-2": ["standard"],
        "tenant-3": ["best-effort"]}
    d = lines[0]["generator"]["derived"]
    assert d["request_rate_per_s"] * d["mean_blocks_x_hold_s"] == pytest.approx(0.6 * 511,
                                                                                 rel=1e-5)


@pytest.mark.parametrize("kind", ["sharegpt", "sharegpt-bursty"])
def test_sharegpt_with_answers_re_sends_each_answer(kind, tmp_path):
    """answers=true: the same conversations and times, each turn carrying its answer (the
    full blocks of its prompt and output past its prompt's), and the next turn's blocks
    starting with the previous turn's blocks and answer."""
    lines, plain = gen(kind, answers=True), gen(kind)
    assert lines[0]["generator"]["params"]["answers"] is True
    assert [(r["id"], r["t"], r["out"], r["tail"]) for r in requests(lines)] == \
        [(r["id"], r["t"], r["out"], r["tail"]) for r in requests(plain)]
    answered = 0
    for c in _conversations(lines).values():
        for prev, cur in zip(c, c[1:]):
            said = prev["blocks"] + prev.get("answer", [])
            full = (16 * len(prev["blocks"]) + prev["tail"] + prev["out"]) // 16
            assert len(said) == full
            assert cur["blocks"][:len(said)] == said
            answered += "answer" in prev
    assert answered > 100
    path = tmp_path / "t.jsonl"
    write_trace(path, lines)
    validate_trace(str(path))
    with pytest.raises(InputError, match="'answers' expects bool, found 1"):
        generate(kind, {"answers": 1})


def test_sharegpt_bursty_is_the_same_conversations_in_bursts():
    plain, bursty = gen("sharegpt"), gen("sharegpt-bursty")
    key = lambda r: r["id"]   # noqa: E731
    strip = lambda r: {k: v for k, v in r.items() if k != "t"}   # noqa: E731
    assert ([strip(r) for r in sorted(requests(plain), key=key)]
            == [strip(r) for r in sorted(requests(bursty), key=key)])
    starts = [c[0]["t"] for c in _conversations(bursty).values()]
    assert all(t % 20.0 <= 2.0 + 1e-6 for t in starts)
    plain_starts = [c[0]["t"] for c in _conversations(plain).values()]
    assert sum(t % 20.0 > 2.0 for t in plain_starts) > 100
    # later turns keep their offsets from the conversation's start
    for a, b in zip(_conversations(plain).values(), _conversations(bursty).values()):
        assert [r["t"] - a[0]["t"] for r in a] == pytest.approx(
            [r["t"] - b[0]["t"] for r in b], abs=2e-6)


@pytest.mark.parametrize("kind", sorted(NEW))
def test_replay_gate_passes(tmp_path, kind):
    path = tmp_path / "t.jsonl"
    write_trace(path, gen(kind))
    result = replay(ReplayConfig(trace=str(path), baseline="lru", candidate="prefixshield",
                                 capacity=512, out=tmp_path / "out"))
    assert structural_failures(result.receipt) == []
    for run in result.receipt["runs"].values():
        assert run["aborted"] is None
        assert all(v["holds"] for v in run["invariants"].values())
        assert run["metrics"]["totals"]["evictions"] > 0
        assert run["metrics"]["totals"]["rejected"] == 0
    assert {"I1", "I2"} <= set(result.receipt["runs"]["candidate"]["invariants"])


# -- one-touch's flood variants: attacker cancels, several scopes -------------------------

def validate_trace_lines(lines, tmp=None):
    import tempfile
    from pathlib import Path
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "t.jsonl"
        write_trace(path, lines)
        header, summary = validate_trace(str(path))
    assert summary.num_requests == len(requests(lines))
    return summary


def test_attack_cancels_name_attack_requests_only_and_keep_every_request():
    """attack_cancel_fraction cancels about that share of attack requests, each within
    [attack_cancel_min_s, attack_cancel_max_s] of its arrival; the requests themselves
    (victim and attacker) are byte-identical to the plain flood's."""
    plain = gen("one-touch")
    lines = gen("one-touch", attack_cancel_fraction=0.5, attack_cancel_min_s=0.1,
                attack_cancel_max_s=0.4)
    assert dump_lines([x for x in lines if x.get("op") == "request"]) == \
        dump_lines([x for x in plain if x.get("op") == "request"])
    arrival = {r["id"]: r["t"] for r in requests(lines)}
    cancels = [x for x in lines[1:] if x["op"] == "cancel"]
    attackers = [r for r in requests(lines) if r["role"] == "attacker"]
    assert all(c["id"].startswith("x") for c in cancels)
    assert len({c["id"] for c in cancels}) == len(cancels)
    assert 0.35 * len(attackers) < len(cancels) < 0.65 * len(attackers)
    assert all(0.1 - 1e-6 <= c["t"] - arrival[c["id"]] <= 0.4 + 1e-6 for c in cancels)
    assert [x["t"] for x in lines[1:]] == sorted(x["t"] for x in lines[1:])
    assert lines[0]["generator"]["params"]["attack_cancel_fraction"] == 0.5
    validate_trace_lines(lines)


def test_scopes_spread_attacker_and_victim_over_adapters():
    lines = gen("one-touch", attacker_scopes=3, victim_scopes=2)
    scopes = {}
    for r in requests(lines):
        scopes.setdefault(r["role"], set()).add(r["scope"])
    assert scopes["attacker"] == {"m+adapter-0", "m+adapter-1", "m+adapter-2"}
    assert scopes["victim"] == {"m+adapter-0", "m+adapter-1"}
    by_prefix = {}
    for r in requests(lines):
        if r["role"] == "victim":
            by_prefix.setdefault(r["prefix"], set()).add(r["scope"])
    assert all(len(s) == 1 for s in by_prefix.values())   # a hot prefix keeps its scope
    assert "attacker_scopes" not in gen("one-touch")[0]["generator"]["params"]
    validate_trace_lines(lines)


@pytest.mark.parametrize("bad", [
    {"attack_cancel_fraction": 1.5}, {"attack_cancel_fraction": "half"},
    {"attack_cancel_min_s": -1.0}, {"attack_cancel_min_s": 2.0, "attack_cancel_max_s": 1.0},
    {"attacker_scopes": 0}, {"victim_scopes": 1.5}])
def test_bad_flood_variants_are_input_errors(bad):
    with pytest.raises(InputError):
        generate("one-touch", bad)
