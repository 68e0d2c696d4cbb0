"""psgate.suggest: contracts sized from a history, and the cases that break naive sizing.

Each attack case cuts a generated trace at half its arrival span, suggests contracts from
the first half and replays the second half under lru (baseline) and prefixshield-b
(candidate), once with the trace's labels (the built-in table) and once with the suggested
file. The attacker's contract must come from its own history, never from what its flood
would buy, and the victim must keep the protection the built-in table gives it."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from psgate import api
from psgate.contracts import DEFAULT_CONTRACTS, load_contracts, parse_contracts
from psgate.errors import InputError
from psgate.suggest import SuggestConfig, rest_lines, split_time_s, suggest
from psgate.trace.writer import write_trace
from psgate.workloads import generate

CAPACITY = 512


def _flood(**params) -> list[dict]:
    return generate(params.pop("kind", "one-touch"), {"seed": 3, "attack_requests": 120,
                                                       **params})


def _split(tmp: Path, lines: list[dict], name: str, **settings):
    """(suggestion, contracts file path, rest trace path) of a trace cut at half."""
    full = tmp / f"{name}.jsonl"
    write_trace(full, lines)
    t_s = split_time_s(lines, 0.5)
    rest = tmp / f"{name}.rest.jsonl"
    write_trace(rest, rest_lines(lines, t_s))
    found = suggest(SuggestConfig(trace=str(full), capacity=CAPACITY, until_s=t_s,
                                  **settings))
    path = tmp / f"{name}.toml"
    path.write_text(found.text(full.name))
    return found, path, rest


def _replay(tmp: Path, rest: Path, contracts: Path | None, name: str) -> dict:
    out = tmp / f"out-{name}"
    receipt = api.replay(api.ReplayConfig(
        trace=str(rest), baseline="lru", candidate="prefixshield-b", capacity=CAPACITY,
        out=out, force=True, contracts_file=str(contracts) if contracts else None,
        ledger_rows="evictions")).receipt
    hits = {run: {g: v["hit_fraction"] for g, v in
                  receipt["runs"][run]["metrics"]["groups"].items()}
            for run in ("baseline", "candidate")}
    with open(out / "requests.csv", newline="") as fh:
        charged = {(r["run"], r["group"], r["contract"]) for r in csv.DictReader(fh)}
    return {"hits": hits, "charged": charged, "receipt": receipt}


def _victim(tmp, rest, path, name) -> tuple[float, float, float]:
    """The victim's hit fraction on the rest: lru, prefixshield-b with the built-in table,
    prefixshield-b with the suggested file."""
    default = _replay(tmp, rest, None, f"{name}-default")["hits"]
    mine = _replay(tmp, rest, path, f"{name}-suggested")["hits"]
    assert mine["baseline"] == default["baseline"]      # lru is contract-blind
    return (default["baseline"]["victim"], default["candidate"]["victim"],
            mine["candidate"]["victim"])


def _row(found, group: str):
    (row,) = [g for g in found.groups if g.group == group]
    return row


# -- the attack cases --------------------------------------------------------------------
@pytest.mark.parametrize("kind, params", [
    ("one-touch", {}),
    ("low-and-slow", {}),
    ("two-pass-replay", {}),
    ("one-touch", {"attack_tokens": 16, "attack_out": 1536}),      # an output flood
], ids=["flood", "low-and-slow", "two-pass-replay", "output-flood"])
def test_an_attacker_flooding_in_the_history_keeps_its_class(tmp_path, kind, params):
    found, path, rest = _split(tmp_path, _flood(kind=kind, **params), kind)
    attacker = _row(found, "attacker")
    # its flood is far beyond what any contract under the caps covers
    assert not attacker.fits
    assert attacker.rate_need > 5 * DEFAULT_CONTRACTS["best-effort"][0]
    assert [attacker.refill, attacker.burst] == DEFAULT_CONTRACTS["best-effort"]
    assert attacker.owed_share > 0.2
    assert load_contracts(str(path)).groups["attacker"] == DEFAULT_CONTRACTS["best-effort"]
    lru, default, suggested = _victim(tmp_path, rest, path, kind)
    assert suggested >= default - 0.005      # the built-in table's protection, kept
    if default > lru:       # (an output flood beats prefixshield-b's table as it beats lru)
        assert suggested > lru


def test_an_attacker_that_appears_after_the_history_gets_the_default_class(tmp_path):
    lines = _flood()
    t_s = split_time_s(lines, 0.5)
    late = [lines[0]] + [e for e in lines[1:] if e.get("group") != "attacker" or e["t"] >= t_s]
    found, path, rest = _split(tmp_path, late, "late")
    assert [g.group for g in found.groups] == ["victim"]
    assert "attacker" not in load_contracts(str(path)).groups
    got = _replay(tmp_path, rest, path, "late")
    charged = {(g, c) for run, g, c in got["charged"] if run == "candidate"}
    assert charged == {("attacker", "best-effort"), ("victim", "@victim")}
    lru, default, suggested = _victim(tmp_path, rest, path, "late")
    assert suggested > lru and suggested >= default - 0.005


def test_a_tenant_that_turns_into_a_flooder_owes_on_its_benign_contract(tmp_path):
    """"switch" sends short prompts in the history (the victim's first four blocks, under
    its own name), then floods."""
    lines = _flood()
    t_s = split_time_s(lines, 0.5)
    out = [{**lines[0], "groups": {**lines[0]["groups"],
                                   "switch": {"contracts": ["best-effort"]}}}]
    for e in lines[1:]:
        if e.get("group") == "attacker":
            if e["t"] >= t_s:
                out.append({**e, "group": "switch"})
        else:
            out.append(e)
            if e["op"] == "request" and e["t"] < t_s:
                out.append({**e, "id": "s-" + e["id"], "group": "switch",
                            "contract": "best-effort", "blocks": e["blocks"][:4], "tail": 0})
    out[1:] = sorted(out[1:], key=lambda e: e["t"])
    found, path, rest = _split(tmp_path, out, "switch")
    switch = _row(found, "switch")
    assert switch.fits and switch.owed_share == 0
    # what it got is sized to its benign history, far below the flood to come
    assert switch.refill < 0.5 * _row(_split(tmp_path, _flood(), "ref")[0],
                                      "attacker").rate_need
    lru, default, suggested = _victim(tmp_path, rest, path, "switch")
    assert suggested > lru and suggested >= default - 0.005


# -- what holds for any history -----------------------------------------------------------
def test_suggest_is_deterministic(tmp_path):
    lines = generate("sharegpt", {"seed": 1})
    a = _split(tmp_path, lines, "a")[0].text("t")
    b = _split(tmp_path, lines, "b")[0].text("t")
    assert a == b
    parsed = parse_contracts(a, "x")
    assert sorted(parsed.groups) == ["tenant-0", "tenant-1", "tenant-2", "tenant-3"]


def _water_level(needs: list[float], budget: float) -> float:
    """The fair level by bisection (independent of stats.creation.max_min_fair)."""
    if sum(needs) <= budget:
        return max(needs)
    lo, hi = 0.0, max(needs)
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if sum(min(n, mid) for n in needs) <= budget else (lo, mid)
    return lo


@pytest.mark.parametrize("capacity, window", [(256, 5.0), (1024, 5.0), (512, 1.0)])
def test_the_caps_hold(tmp_path, capacity, window):
    path = tmp_path / "t.jsonl"
    write_trace(path, generate("sharegpt", {"seed": 2}))
    cfg = SuggestConfig(trace=str(path), capacity=capacity, window_s=window)
    found = suggest(cfg)
    level = _water_level([g.rate_need for g in found.groups], capacity / window)
    for g in found.groups:
        rho, beta = DEFAULT_CONTRACTS[g.label]
        if g.fits:
            # the refill: the turnover share or the class's, the burst: the cache share or
            # the class's; never below the class
            assert g.refill <= max(min(g.rate_need, level), rho) + 1e-3
            assert rho <= g.refill and beta <= g.burst
            assert g.burst <= max(cfg.max_burst_share * capacity, beta) + 1e-3
            assert g.owed_share == 0
        else:
            assert [g.refill, g.burst] == [rho, beta]
    # the refills raised by data (above their classes) fit in the cache once per window
    raised = [g.refill for g in found.groups if g.refill > DEFAULT_CONTRACTS[g.label][0]]
    assert sum(raised) <= capacity / window + 1e-3


def test_a_burst_the_cache_cannot_give_keeps_the_class(tmp_path):
    """At 64 blocks a 256-block prompt fits no burst cap: every group keeps its class."""
    path = tmp_path / "t.jsonl"
    write_trace(path, generate("sharegpt", {"seed": 2}))
    found = suggest(SuggestConfig(trace=str(path), capacity=64))
    assert found.groups and all(not g.fits for g in found.groups)
    assert all([g.refill, g.burst] == DEFAULT_CONTRACTS[g.label] for g in found.groups)


@pytest.mark.parametrize("field, value, option", [
    ("history", 0.0, "--history"), ("history", 1.5, "--history"),
    ("window_s", 0.0, "--window"), ("headroom", float("inf"), "--headroom"),
    ("quantile", 0.0, "--quantile"), ("max_burst_share", 2.0, "--max-burst-share"),
    ("min_burst", 0.5, "--min-burst"), ("until_s", -1.0, "--until"),
    ("capacity", 1, "--capacity"), ("capacity", 2**40, "--capacity"),
    ("default", "gold", "--default"),
])
def test_bad_settings_name_their_option(tmp_path, field, value, option):
    path = tmp_path / "t.jsonl"
    write_trace(path, generate("sharegpt", {"seed": 2}))
    with pytest.raises(InputError) as e:
        suggest(SuggestConfig(**{"trace": str(path), "capacity": 512, field: value}))
    assert str(e.value).startswith(f"{option}: expected ")


def test_a_history_without_requests_is_bad_input(tmp_path):
    path = tmp_path / "t.jsonl"
    lines = generate("sharegpt", {"seed": 2})
    write_trace(path, lines)
    first = min(e["t"] for e in lines[1:] if e["op"] == "request")
    with pytest.raises(InputError, match="no request arrives in the history window"):
        suggest(SuggestConfig(trace=str(path), capacity=512, until_s=first / 2))


def test_rest_lines_keep_the_rest_and_its_cancels(tmp_path):
    lines = [{"psgate_trace": 1},
             {"t": 1.0, "op": "request", "id": "a"}, {"t": 2.0, "op": "cancel", "id": "a"},
             {"t": 3.0, "op": "request", "id": "b"}, {"t": 4.0, "op": "done", "id": "b"}]
    assert split_time_s(lines, 0.5) == 2.0
    assert rest_lines(lines, 2.0) == [lines[0], lines[3], lines[4]]


def test_a_group_whose_history_was_all_rejected_keeps_its_class(tmp_path):
    """Every prompt larger than the pool: rejected, nothing created, nothing to size."""
    lines = [{"psgate_trace": 1, "block_size": 4}]
    for i in range(6):
        lines.append({"t": float(i), "op": "request", "id": f"r{i}", "group": "big",
                      "contract": "standard", "scope": "m",
                      "blocks": [f"{i:x}{j:x}" for j in range(40)], "tail": 0, "out": 1})
    path = tmp_path / "t.jsonl"
    write_trace(path, lines)
    (row,) = suggest(SuggestConfig(trace=str(path), capacity=16)).groups
    assert (row.group, row.requests, row.created) == ("big", 3, 0.0)
    assert [row.refill, row.burst] == DEFAULT_CONTRACTS["standard"] and row.owed_share == 0
