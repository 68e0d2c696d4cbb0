"""The PrefixShield paper's evaluation workloads (block size 16, 512 configured blocks).

one-touch        victim group re-reads 4 hot 1,536-token prefixes (96 blocks each, 384 in
                 all) with short unique suffixes; an attacker group sends previously unseen
                 1,536-token prefixes during the pressure window. ``capacity_target``
                 (Fig. 2) scales the hot set to keep ~76.6% of usable blocks at 1024-4096.
borrowing        one group idle after a short warm-up, one active group whose working set
                 (31 prefixes x 16 cached blocks = 496) nearly fills the cache on its own:
                 with the idle group's 32 blocks it exceeds the 511 usable blocks, so the
                 active group reaches a full cache only by taking the idle group's blocks.
low-and-slow     one-touch's victim and total attack volume (240 unseen prefixes), the
                 attacker at a quarter of one-touch's rate over a four times longer window.
two-pass-replay  low-and-slow's schedule, but the attacker replays each unseen prefix right
                 after admitting it (sets of ``replay_set`` = 1; half its requests are
                 replays), manufacturing reuse evidence while its creation debt is
                 outstanding.
delayed-replay   Fig. 3b: the attacker admits 2 prefixes (192 replay-eligible blocks),
                 replays them after ``delay_fraction`` of its designed clearance time, then
                 a neutral group spends exactly its burst and forces evictions.
sharegpt         benign multi-turn chat: 4 tenants, conversations whose every turn re-sends
                 the previous prompt as its prefix (lengths approximating ShareGPT).
sharegpt-bursty  the same conversations with their starts squeezed into short bursts.

Load model (one-touch): C_prefill = requests/s of 32 distinct-prefix requests served
back to back by the cost model; victim arrivals at alpha * C_prefill (alpha = 0.6);
attacker, during the pressure window, at min(0.75 C_prefill, 1.15 alpha C_prefill).
The window holds ``attack_requests`` requests (240: 5.64 turnovers of a 4,096-block
cache, the paper's fixed attack window). Defaults were fixed before any policy was
compared on them and are written into every trace header.

``rates`` picks the model behind C_prefill (and sharegpt's hold times): "service" (the
default) is the per-request CostModel above, one FIFO prefill server; "step" is the model
a ``--scheduler step`` replay runs, vLLM's scheduler on the step cost model
(common.step_prefill_rate: the same 32 distinct-prefix requests, with the workload's
output tokens, arriving together on 512 configured blocks; C_prefill = 32 / makespan,
5.96/s at the step defaults against the service model's 10.09/s: the cache holds five
such requests at once and decodes share the steps). Service-model rates replayed under
the step scheduler overload it. The header's ``derived.rate_model`` records the step
model; service-rate headers are as they always were.

Randomness: one-touch and borrowing draw everything from one ``random.Random(seed)``
(committed outputs; in one-touch every victim draw comes before any attacker draw, so
``attack=false`` already leaves its victim requests byte-identical). The newer
generators draw each role from its own stream (``random.Random(f"{seed}/victim")`` and
so on), so silencing or reshaping one role never shifts another's requests.
"""

from __future__ import annotations

import math
import random

from psgate.contracts import DEFAULT_CONTRACTS
from psgate.engines.cost import CostModel
from psgate.trace.writer import header_line
from psgate.workloads import register_generator
from psgate.workloads.common import (SYNTHETIC_HASHING, StepRates, c_prefill_rate,
                                     chain, distinct, fraction, header_params, need, nonneg,
                                     ordered, poisson, positive, rate_model, rate_provenance,
                                     request, resolve_params, step_makespan_ns, whole_block)

PAPER_CAPACITY = 512                 # configured blocks the load model assumes
PAPER_USABLE = PAPER_CAPACITY - 1    # one is vLLM's null block

ONE_TOUCH_DEFAULTS = {
    "seed": 0, "block_size": 16, "alpha": 0.6, "hot_prefixes": 4, "prefix_tokens": 1536,
    "suffix_tokens": 32, "victim_out": 32, "attack_tokens": 1536, "attack_out": 32,
    "attack_requests": 240, "warmup_s": 10.0, "cooldown_s": 5.0,
    "victim_group": "victim", "victim_contract": "critical",
    "attacker_group": "attacker", "attacker_contract": "best-effort", "attack": True,
    # Added after one-touch's outputs were committed: written into the header only when
    # not at its default, so default outputs stay byte-identical.
    "capacity_target": PAPER_CAPACITY, "creation_pressure": None,
    # Which model sets the rates (module docstring, load model): "service" or "step".
    "rates": "service",
    # Flood variants (one_touch's docstring): attacker cancels, attacker and victim scopes.
    "attack_cancel_fraction": 0.0, "attack_cancel_min_s": 0.05, "attack_cancel_max_s": 1.0,
    "attacker_scopes": 1, "victim_scopes": 1,
}
_FLOOD_VARIANTS = ("attack_cancel_fraction", "attack_cancel_min_s", "attack_cancel_max_s",
                   "attacker_scopes", "victim_scopes")
_ONE_TOUCH_ADDED = ("capacity_target", "creation_pressure", "rates", *_FLOOD_VARIANTS)

BORROWING_DEFAULTS = {
    "seed": 0, "block_size": 16, "idle_prefixes": 2, "active_prefixes": 31,
    "prefix_tokens": 256, "out": 16, "rate": 8.0, "warmup_s": 2.0, "duration_s": 60.0,
}

# The victim/attacker layout every one-touch-like generator shares (one-touch's values).
_ATTACK_BASE = {k: v for k, v in ONE_TOUCH_DEFAULTS.items() if k not in _ONE_TOUCH_ADDED}

LOW_AND_SLOW_DEFAULTS = {**_ATTACK_BASE, "rate_fraction": 0.25, "rates": "service"}

TWO_PASS_DEFAULTS = {**_ATTACK_BASE, "rate_fraction": 0.25, "replay_set": 1, "rates": "service"}

DELAYED_REPLAY_DEFAULTS = {
    "seed": 0, "block_size": 16, "delay_fraction": 0.5,
    "victim_prefixes": 2, "victim_tokens": 1544, "victim_out": 32, "victim_reads": 4,
    "warmup_s": 5.0,
    "attack_prefixes": 2, "attack_tokens": 1544, "attack_out": 32, "attack_gap_s": 0.1,
    "attacker_rho": 16.0, "attacker_beta": 128.0,
    "pressure_requests": 2, "pressure_tokens": 1544, "pressure_out": 32,
    "pressure_gap_s": 1.0, "measure_gap_s": 2.0,
    "victim_group": "victim", "victim_contract": "critical",
    "attacker_group": "attacker", "attacker_contract": "best-effort",
    "neutral_group": "neutral", "neutral_contract": "standard", "attack": True,
}

SHAREGPT_DEFAULTS = {
    "seed": 0, "block_size": 16, "conversations": 200,
    "tenant_contracts": ["critical", "standard", "standard", "best-effort"],
    "min_turns": 2, "max_turns": 8, "mean_turns": 3.5,
    "user_mean_tokens": 85.0, "user_sigma": 1.0, "user_max_tokens": 1024,
    "answer_mean_tokens": 250.0, "answer_sigma": 0.7, "answer_max_tokens": 1024,
    "max_context_tokens": 4096, "think_mean_s": 5.0, "load": 0.6, "warmup_s": 0.0,
    "rates": "service", "answers": False,
}

SHAREGPT_BURSTY_DEFAULTS = {**SHAREGPT_DEFAULTS, "burst_period_s": 20.0, "burst_s": 2.0}


def _streams(seed) -> dict[str, random.Random]:
    """One seeded stream per role: draws of one never shift another's."""
    return {name: random.Random(f"{seed}/{name}")
            for name in ("victim", "attacker", "shapes", "arrivals", "think")}


def _victim_requests(p: dict, rng: random.Random, hot: list[list[str]], end: float,
                     rate: float, measure_from: float) -> list[tuple]:
    """One-touch's victim: Poisson(rate) on [0, end), each a uniformly drawn hot prefix plus
    ``suffix_tokens`` of unique suffix; measured from ``measure_from``. The draw order is
    one-touch's committed one (arrival gap, then prefix). Hot prefix k is read in scope
    k mod ``victim_scopes`` (one scope, "m", by default)."""
    bs = p["block_size"]
    scopes = p.get("victim_scopes", 1)
    events = []
    for i, t in enumerate(poisson(rng, 0.0, end, rate)):
        k = rng.randrange(len(hot))
        n_suffix = p["suffix_tokens"] // bs
        blocks = hot[k] + chain(f"victim-q{i}", n_suffix, parent=hot[k][-1])
        tail = p["suffix_tokens"] % bs
        events.append((t, 0, request(t, f"v{i}", p["victim_group"], p["victim_contract"],
                                     blocks, tail, p["victim_out"], f"victim-sys-{k}",
                                     "victim", measure=t >= measure_from,
                                     scope=_scope(k, scopes))))
    return events


def _scope(k: int, scopes: int) -> str:
    """The k-th of ``scopes`` scopes (adapters of one model): "m" when there is one, so
    default outputs stay as they were."""
    return "m" if scopes == 1 else f"m+adapter-{k % scopes}"


def _attack_groups(p: dict) -> dict:
    return {p["victim_group"]: {"contracts": [p["victim_contract"]]},
            p["attacker_group"]: {"contracts": [p["attacker_contract"]]}}


def _attack_header(kind: str, p: dict, params: dict, derived: dict) -> dict:
    """The header of a victim/attacker trace (one-touch and the two slow attacks)."""
    return header_line(p["block_size"], hashing=SYNTHETIC_HASHING,
                       source=f"psgate workload {kind} (PrefixShield paper)",
                       generator={"name": kind, "params": params, "derived": derived},
                       groups=_attack_groups(p))


def _check_attack_base(kind: str, p: dict) -> None:
    positive(kind, p, "block_size", "alpha", "hot_prefixes", "prefix_tokens", "attack_tokens",
             "attack_requests")
    nonneg(kind, p, "suffix_tokens", "victim_out", "attack_out", "warmup_s", "cooldown_s")
    whole_block(kind, p, "prefix_tokens")
    distinct(kind, p, "victim_group", "attacker_group")


def _scaled_hot_prefixes(p: dict) -> int:
    """Hot prefixes at ``capacity_target``: the 512-block count scaled with usable blocks,
    so the victim working set stays the same fraction of the cache."""
    if p["capacity_target"] == PAPER_CAPACITY:
        return p["hot_prefixes"]
    return max(1, round(p["hot_prefixes"] * (p["capacity_target"] - 1) / PAPER_USABLE))


@register_generator("one-touch", "victim re-reads 4 hot 1,536-token prefixes while an attacker "
                    "floods unseen prefixes (paper)", ONE_TOUCH_DEFAULTS, uses_cost=True)
def one_touch(cost: CostModel | StepRates | None = None, **overrides) -> list[dict]:
    """One-touch (the paper's headline trace).

    ``capacity_target`` (Fig. 2 scaling; default 512 leaves the output byte-identical): the
    hot-prefix count becomes round(hot_prefixes x (capacity_target - 1) / 511), so the
    victim working set, hot x (prefix + suffix blocks) = 4 x 98 = 392 of 511 usable blocks
    (76.7%) at 512, stays about 76.6% of usable blocks (784/1023, 1568/2047, 3136/4095 at
    1024/2048/4096); warm-up grows by the same factor so every hot prefix is read as often
    before the attack as at 512; the attack window stays ``attack_requests`` requests.
    ``creation_pressure`` (Fig. 2's middle panel; default None leaves the output
    byte-identical): the target creation-pressure ratio r = the attacker's block creation
    rate / its contract's refill rate (PrefixShield's default table: best-effort refills
    16 blocks/s). The attacker then arrives at r x refill / (attack_tokens // block_size)
    requests/s (Poisson) over the default attack window (``attack_requests`` / the
    C_prefill-derived rate, about 34.5 s: the window stays fixed, the number of attack
    requests follows the rate), instead of the C_prefill-derived rate (about 668 blocks/s,
    r ~ 42). The header's ``derived.creation_pressure`` records the target, the refill,
    the number of attack requests drawn, the observed ratio (blocks those requests create /
    window / refill) and the nominal mean debt (the attacker's bucket charged at arrival
    times, debt averaged over the window).
    Flood variants (defaults leave the output byte-identical): each attack request is
    cancelled with probability ``attack_cancel_fraction``, uniformly ``attack_cancel_min_s``
    to ``attack_cancel_max_s`` after its arrival (a cancel of a request still waiting
    drops it, of a running one frees its blocks with what it computed cached: the flood
    keeps creating); ``attacker_scopes`` > 1 sends attack request i in scope i mod N and
    ``victim_scopes`` > 1 reads hot prefix k in scope k mod N (adapters of one model, one
    group spread over several namespaces). Cancels draw from their own stream
    (``random.Random(f"{seed}/cancel")``).
    One draw stream (the committed order: all victim draws, then the attacker's), so
    ``attack=false``, ``creation_pressure`` and the flood variants leave the victim
    requests byte-identical (up to ``victim_scopes``' scope names).
    """
    kind = "one-touch"
    p = resolve_params(kind, ONE_TOUCH_DEFAULTS, overrides)
    # only the added parameters are validated: committed outputs must not change
    need(kind, type(p["capacity_target"]) is int and p["capacity_target"] >= 2,
         "capacity_target", "an integer >= 2", p["capacity_target"])
    pressure = p["creation_pressure"]
    if pressure is not None:
        need(kind, type(pressure) in (int, float) and pressure > 0, "creation_pressure",
             "a number > 0 (or null)", pressure)
        need(kind, p["attacker_contract"] in DEFAULT_CONTRACTS, "attacker_contract",
             f"a contract of the default table ({', '.join(DEFAULT_CONTRACTS)}): "
             f"creation_pressure needs its refill", p["attacker_contract"])
        need(kind, p["attack_tokens"] >= p["block_size"], "attack_tokens",
             "at least one block with creation_pressure", p["attack_tokens"])
    _check_flood_variants(kind, p)
    rng = random.Random(p["seed"])
    bs = p["block_size"]
    model = rate_model(kind, p, cost)
    c_prefill, measured = c_prefill_rate(model, p["prefix_tokens"] + p["suffix_tokens"],
                                         p["victim_out"], bs, PAPER_CAPACITY)
    victim_rate = p["alpha"] * c_prefill
    attack_rate = min(0.75 * c_prefill, 1.15 * p["alpha"] * c_prefill)
    n_hot = _scaled_hot_prefixes(p)
    warmup_s = p["warmup_s"] * n_hot / p["hot_prefixes"]
    attack_start = warmup_s
    attack_end = attack_start + p["attack_requests"] / attack_rate
    end = attack_end + p["cooldown_s"]
    n_attack = p["attack_tokens"] // bs
    if pressure is not None:      # the window stays; the rate follows the target ratio
        refill, burst = DEFAULT_CONTRACTS[p["attacker_contract"]]
        attack_rate = pressure * refill / n_attack
    prefix_blocks = p["prefix_tokens"] // bs
    hot = [chain(f"victim-sys-{i}", prefix_blocks) for i in range(n_hot)]
    events = _victim_requests(p, rng, hot, end, victim_rate, attack_start)
    times: list[float] = []
    if p["attack"]:
        times = list(poisson(rng, attack_start, attack_end, attack_rate))
        # cancels draw from their own stream: the victim's and the arrivals' draws stay
        cancel_rng = random.Random(f"{p['seed']}/cancel")
        lo, hi = p["attack_cancel_min_s"], p["attack_cancel_max_s"]
        for i, t in enumerate(times):
            events.append((t, 1, request(t, f"x{i}", p["attacker_group"],
                                         p["attacker_contract"],
                                         chain(f"attack-{i}", n_attack),
                                         p["attack_tokens"] % bs, p["attack_out"],
                                         f"attack-{i}", "attacker",
                                         scope=_scope(i, p["attacker_scopes"]))))
            if p["attack_cancel_fraction"] and cancel_rng.random() < p["attack_cancel_fraction"]:
                tc = round(t + cancel_rng.uniform(lo, hi), 6)
                events.append((tc, 2, {"t": tc, "op": "cancel", "id": f"x{i}"}))
    events.sort(key=lambda e: (e[0], e[1]))
    derived = {"c_prefill_per_s": round(c_prefill, 6),
               "victim_rate_per_s": round(victim_rate, 6),
               "attack_rate_per_s": round(attack_rate, 6),
               "attack_window_s": [round(attack_start, 6), round(attack_end, 6)],
               **rate_provenance(model, measured)}
    if pressure is not None:
        window = attack_end - attack_start
        derived["creation_pressure"] = {
            "target": pressure, "attacker_refill_blocks_per_s": refill,
            "attacker_burst_blocks": burst,
            "attack_creation_blocks_per_s": round(pressure * refill, 6),
            "attack_requests": len(times),
            "observed": round(len(times) * n_attack / window / refill, 6),
            "nominal_mean_debt_blocks": round(
                mean_bucket_debt(times, n_attack, refill, burst, attack_start, attack_end), 6),
            "rule": "attack rate = target x refill / blocks per attack request over the "
                    "fixed window; observed = attack requests x blocks / window / refill"}
    if p["capacity_target"] != PAPER_CAPACITY:
        ws = n_hot * (prefix_blocks + p["suffix_tokens"] // bs)
        derived.update({"hot_prefixes": n_hot, "warmup_s": round(warmup_s, 6),
                        "victim_working_set_blocks": ws,
                        "victim_working_set_fraction": round(ws / (p["capacity_target"] - 1),
                                                             6)})
    params = {k: v for k, v in p.items()
              if k not in _ONE_TOUCH_ADDED or v != ONE_TOUCH_DEFAULTS[k]}
    return [_attack_header("one-touch", p, params, derived)] + [e[2] for e in events]


def _check_flood_variants(kind: str, p: dict) -> None:
    f = p["attack_cancel_fraction"]
    need(kind, type(f) in (int, float) and 0 <= f <= 1, "attack_cancel_fraction",
         "a number in [0, 1]", f)
    nonneg(kind, p, "attack_cancel_min_s", "attack_cancel_max_s")
    need(kind, p["attack_cancel_max_s"] >= p["attack_cancel_min_s"], "attack_cancel_max_s",
         f"a value >= attack_cancel_min_s ({p['attack_cancel_min_s']!r})",
         p["attack_cancel_max_s"])
    for key in ("attacker_scopes", "victim_scopes"):
        need(kind, type(p[key]) is int and p[key] >= 1, key, "an integer >= 1", p[key])


@register_generator("borrowing", "one group idle, one active group whose working set needs "
                    "the idle group's blocks (paper)", BORROWING_DEFAULTS)
def borrowing(**overrides) -> list[dict]:
    p = resolve_params("borrowing", BORROWING_DEFAULTS, overrides)
    rng = random.Random(p["seed"])
    bs = p["block_size"]
    n = p["prefix_tokens"] // bs
    tail = 1 % bs          # one token past the prefix; with one-token blocks none can be
    events = []
    for i in range(p["idle_prefixes"]):
        t = i * 0.1
        events.append((t, request(t, f"i{i}", "idle", "standard", chain(f"idle-{i}", n), tail,
                                  p["out"], f"idle-{i}", "benign", measure=False)))
    active = [chain(f"active-{i}", n) for i in range(p["active_prefixes"])]
    for i, t in enumerate(poisson(rng, p["warmup_s"], p["duration_s"], p["rate"])):
        k = rng.randrange(p["active_prefixes"])
        events.append((t, request(t, f"a{i}", "active", "standard", active[k], tail,
                                  p["out"], f"active-{k}", "victim")))
    events.sort(key=lambda e: e[0])
    header = header_line(bs, hashing=SYNTHETIC_HASHING,
                         source="psgate workload borrowing (PrefixShield paper)",
                         generator={"name": "borrowing", "params": p})
    return [header] + [e[1] for e in events]


def _slow_attack(kind: str, p: dict, attacker_request,
                 cost: CostModel | StepRates | None) -> tuple[list[tuple], dict]:
    """Shared body of low-and-slow and two-pass-replay: one-touch's victim (own stream),
    an attacker at ``rate_fraction`` of one-touch's attack rate for ``attack_requests``
    requests (a window 1/rate_fraction times longer); ``attacker_request(i, t)`` makes
    attacker request i."""
    _check_attack_base(kind, p)
    need(kind, 0 < p["rate_fraction"] <= 1, "rate_fraction", "a fraction in (0, 1]",
         p["rate_fraction"])
    rng = _streams(p["seed"])
    bs = p["block_size"]
    model = rate_model(kind, p, cost)
    c_prefill, measured = c_prefill_rate(model, p["prefix_tokens"] + p["suffix_tokens"],
                                         p["victim_out"], bs, PAPER_CAPACITY)
    victim_rate = p["alpha"] * c_prefill
    one_touch_rate = min(0.75 * c_prefill, 1.15 * p["alpha"] * c_prefill)
    attack_rate = p["rate_fraction"] * one_touch_rate
    attack_start = p["warmup_s"]
    attack_end = attack_start + p["attack_requests"] / attack_rate
    end = attack_end + p["cooldown_s"]
    hot = [chain(f"victim-sys-{i}", p["prefix_tokens"] // bs) for i in range(p["hot_prefixes"])]
    events = _victim_requests(p, rng["victim"], hot, end, victim_rate, attack_start)
    if p["attack"]:
        for i, t in enumerate(poisson(rng["attacker"], attack_start, attack_end, attack_rate)):
            events.append((t, 1, attacker_request(i, t)))
    events.sort(key=lambda e: (e[0], e[1]))
    derived = {"c_prefill_per_s": round(c_prefill, 6),
               "victim_rate_per_s": round(victim_rate, 6),
               "one_touch_attack_rate_per_s": round(one_touch_rate, 6),
               "attack_rate_per_s": round(attack_rate, 6),
               "attack_window_s": [round(attack_start, 6), round(attack_end, 6)],
               **rate_provenance(model, measured)}
    return events, derived


@register_generator("low-and-slow", "one-touch's attack volume at a quarter of its rate over a "
                    "four times longer window (paper)", LOW_AND_SLOW_DEFAULTS, uses_cost=True)
def low_and_slow(cost: CostModel | StepRates | None = None, **overrides) -> list[dict]:
    """Low-and-slow: the same total pressure as one-touch (``attack_requests`` = 240 unseen
    1,536-token prefixes, each seen once) at ``rate_fraction`` (0.25) of one-touch's attack
    rate, so the window is four times longer (about 138 s instead of 34 s); the victim is
    one-touch's. The paper does not state its fraction; a quarter is our choice, fixed
    before any policy ran on it."""
    p = resolve_params("low-and-slow", LOW_AND_SLOW_DEFAULTS, overrides)
    bs = p["block_size"]
    n_attack = p["attack_tokens"] // bs

    def attacker(i, t):
        return request(t, f"x{i}", p["attacker_group"], p["attacker_contract"],
                       chain(f"attack-{i}", n_attack), p["attack_tokens"] % bs,
                       p["attack_out"], f"attack-{i}", "attacker")

    events, derived = _slow_attack("low-and-slow", p, attacker, cost)
    derived["attack_creation_blocks_per_s"] = round(derived["attack_rate_per_s"] * n_attack, 6)
    return [_attack_header("low-and-slow", p, header_params(p), derived)] + [e[2] for e in events]


@register_generator("two-pass-replay", "attacker admits sets of unseen prefixes, then replays "
                    "each set to fake reuse while in debt (paper)", TWO_PASS_DEFAULTS,
                    uses_cost=True)
def two_pass_replay(cost: CostModel | StepRates | None = None, **overrides) -> list[dict]:
    """Two-pass replay: low-and-slow's schedule (``rate_fraction`` 0.25 of one-touch's rate,
    ``attack_requests`` = 240 requests), but the attacker works in rounds of
    2 x ``replay_set`` requests: pass 1 admits ``replay_set`` unseen prefixes, pass 2
    re-sends the same prompts in the same order, so each replay hits what pass 1 left
    and is proven reuse (same group, contract and logical prefix). Half its requests
    create blocks: 0.5 x rate x 96 blocks/s (about 84) against best-effort's refill of 16,
    so its debt is outstanding at every replay. ``replay_set`` = 1: the largest set whose
    replay can still hit at 512 blocks beside the victim's 392-block working set,
    floor((511 - 392) / 96) = 1 (so pass 2 re-sends each prefix right after pass 1). A
    first choice of 4 (the victim's hot-set size) was dropped before any comparison was
    reported: its replays found under 3% of their blocks with every policy (lru, s3fifo,
    prefixshield alike), so its second pass manufactured no reuse evidence at all."""
    p = resolve_params("two-pass-replay", TWO_PASS_DEFAULTS, overrides)
    positive("two-pass-replay", p, "replay_set")
    bs = p["block_size"]
    n_attack = p["attack_tokens"] // bs
    s = p["replay_set"]

    def attacker(i, t):
        rnd, pos = divmod(i, 2 * s)
        j = rnd * s + pos % s
        r = request(t, f"x{i}", p["attacker_group"], p["attacker_contract"],
                    chain(f"attack-{j}", n_attack), p["attack_tokens"] % bs,
                    p["attack_out"], f"attack-{j}", "attacker")
        r["pass"] = 1 if pos < s else 2
        return r

    events, derived = _slow_attack("two-pass-replay", p, attacker, cost)
    derived["attack_creation_blocks_per_s"] = round(
        derived["attack_rate_per_s"] * n_attack / 2, 6)
    header = _attack_header("two-pass-replay", p, header_params(p), derived)
    return [header] + [e[2] for e in events]


def bucket_debt(times: list[float], blocks: list[int], rho: float, beta: float) -> float:
    """Debt (blocks) of a token bucket (refill ``rho``/s up to ``beta``, starting full)
    right after charging ``blocks[i]`` at ``times[i]``: PrefixShield's lazy refill,
    B_i = min(beta, B_{i-1} + rho (t_i - t_{i-1})) - n_i; debt = max(0, -B_last)."""
    b, t0 = beta, None
    for t, n in zip(times, blocks):
        if t0 is not None:
            b = min(beta, b + rho * (t - t0))
        b -= n
        t0 = t
    return max(0.0, -b)


def mean_bucket_debt(times: list[float], blocks: int, rho: float, beta: float, start: float,
                     end: float) -> float:
    """Time-averaged debt (blocks) over [start, end] of a token bucket (refill ``rho``/s up
    to ``beta``, full at ``start``) charged ``blocks`` at each of ``times`` (sorted, within
    the interval): debt(t) = max(0, -B(t)) with PrefixShield's lazy refill, integrated
    exactly between charges."""
    if end <= start:
        return 0.0
    b, t0, area = beta, start, 0.0

    def owed(b0: float, dt: float) -> float:     # integral of max(0, -(b0 + rho s)), s < dt
        if b0 >= 0:
            return 0.0
        m = min(dt, -b0 / rho)
        return -b0 * m - rho * m * m / 2

    for t in times:
        area += owed(b, t - t0)
        b = min(beta, b + rho * (t - t0)) - blocks
        t0 = t
    area += owed(b, end - t0)
    return area / (end - start)


def _ceil_us(t: float) -> float:
    """``t`` rounded up to the trace's microsecond resolution (never earlier than ``t``)."""
    return math.ceil(round(t * 1e6, 3)) / 1e6


@register_generator("delayed-replay", "attacker admits 2 prefixes, replays them after a fraction "
                    "of its clearance time; a neutral burst forces evictions (paper, Fig. 3b)",
                    DELAYED_REPLAY_DEFAULTS)
def delayed_replay(**overrides) -> list[dict]:
    """Delayed replay (the paper's Fig. 3b), in four phases:

    1. warm-up [0, warmup_s): the victim (critical) reads each of ``victim_prefixes``
       1,544-token prompts (96 full blocks + an 8-token tail) ``victim_reads`` times,
       round robin at jittered times; its 192 blocks are within critical's burst (256),
       so its re-reads are proven reuse with no debt (Reuse). Not measured.
    2. first pass at warmup_s: the attacker (best-effort) sends ``attack_prefixes``
       unseen 1,544-token prompts ``attack_gap_s`` apart: 2 x 96 = 192 materialized
       blocks, every one of them hit again by the replay (the tail keeps the last full
       block from being recomputed): 192 replay-eligible blocks (the paper reports 193).
    3. replay: the same prompts, the same gaps apart, from
           t_replay = t_last + delay_fraction x T,   T = D / rho,
           D = max(0, -B_last),  B_i = min(beta, B_{i-1} + rho (t_i - t_{i-1})) - n_i, B_0 = beta
       (the bucket debt after the first pass, ``bucket_debt``; rho = 16 blocks/s and
       beta = 128, PrefixShield's default best-effort contract; defaults: D = 192 - 128 -
       16 x 0.1 = 62.4 blocks, T = 3.9 s), rounded up to the microsecond. delay_fraction 0
       and 0.5 replay while the debt is outstanding, 1 at the designed clearance time.
    4. pressure at t_last + T + pressure_gap_s (after every replay and after the
       attacker's debt has cleared, whatever the delay): the neutral group (role benign,
       standard) sends ``pressure_requests`` unseen 1,544-token prompts at once: 192 new
       blocks, exactly standard's burst (beta 192), so it never runs into debt. With
       the other 384 blocks cached, the second needs ~71 evictions. Then at
       + ``measure_gap_s`` the victim re-reads each prefix once (measured).
    ``attack=false`` drops phases 2 and 3 only: timings come from the parameters, so the
    victim and neutral requests are byte-identical.
    """
    kind = "delayed-replay"
    p = resolve_params(kind, DELAYED_REPLAY_DEFAULTS, overrides)
    positive(kind, p, "block_size", "victim_prefixes", "victim_tokens", "victim_reads",
             "warmup_s", "attack_prefixes", "attack_tokens", "attacker_rho", "attacker_beta",
             "pressure_requests", "pressure_tokens", "pressure_gap_s", "measure_gap_s")
    nonneg(kind, p, "victim_out", "attack_out", "pressure_out", "attack_gap_s")
    fraction(kind, p, "delay_fraction")
    spread = (p["attack_prefixes"] - 1) * p["attack_gap_s"]
    need(kind, p["pressure_gap_s"] > spread, "pressure_gap_s",
         f"a value > the replay's spread ({spread:g} s)", p["pressure_gap_s"])
    distinct(kind, p, "victim_group", "attacker_group", "neutral_group")
    whole_block(kind, p, "victim_tokens", "attack_tokens", "pressure_tokens")
    bs = p["block_size"]
    rng = _streams(p["seed"])

    events = []
    nv = p["victim_tokens"] // bs
    vic = [chain(f"victim-sys-{k}", nv) for k in range(p["victim_prefixes"])]
    n_reads = p["victim_prefixes"] * p["victim_reads"]
    slot = p["warmup_s"] / (n_reads + 1)
    for i in range(n_reads):
        t = i * slot + rng["victim"].uniform(0.0, slot / 2)
        k = i % p["victim_prefixes"]
        events.append((t, 0, request(t, f"v{i}", p["victim_group"], p["victim_contract"],
                                     vic[k], p["victim_tokens"] % bs, p["victim_out"],
                                     f"victim-sys-{k}", "victim", measure=False)))

    na = p["attack_tokens"] // bs
    first = [round(p["warmup_s"] + i * p["attack_gap_s"], 6)
             for i in range(p["attack_prefixes"])]
    debt = bucket_debt(first, [na] * len(first), p["attacker_rho"], p["attacker_beta"])
    clearance_s = debt / p["attacker_rho"]
    t_last = first[-1]
    t_replay = _ceil_us(t_last + p["delay_fraction"] * clearance_s)
    replays = [_ceil_us(t_replay + i * p["attack_gap_s"]) for i in range(p["attack_prefixes"])]
    att = [chain(f"attack-{k}", na) for k in range(p["attack_prefixes"])]
    if p["attack"]:
        for k, t in enumerate(first):
            events.append((t, 1, request(t, f"x{k}", p["attacker_group"],
                                         p["attacker_contract"], att[k],
                                         p["attack_tokens"] % bs, p["attack_out"],
                                         f"attack-{k}", "attacker")))
        for k, t in enumerate(replays):
            r = request(t, f"xr{k}", p["attacker_group"], p["attacker_contract"], att[k],
                        p["attack_tokens"] % bs, p["attack_out"], f"attack-{k}", "attacker")
            r["pass"] = 2
            events.append((t, 2, r))

    t_pressure = t_last + clearance_s + p["pressure_gap_s"]
    npb = p["pressure_tokens"] // bs
    for k in range(p["pressure_requests"]):
        events.append((t_pressure, 3, request(
            t_pressure, f"n{k}", p["neutral_group"], p["neutral_contract"],
            chain(f"neutral-{k}", npb), p["pressure_tokens"] % bs, p["pressure_out"],
            f"neutral-{k}", "benign")))
    t_measure = t_pressure + p["measure_gap_s"]
    for k in range(p["victim_prefixes"]):
        t = t_measure + k * 0.1
        events.append((t, 4, request(t, f"vm{k}", p["victim_group"], p["victim_contract"],
                                     vic[k], p["victim_tokens"] % bs, p["victim_out"],
                                     f"victim-sys-{k}", "victim")))
    events.sort(key=lambda e: (round(e[0], 6), e[1]))
    derived = {"first_pass_t": first, "replay_eligible_blocks": p["attack_prefixes"] * na,
               "debt_blocks": round(debt, 6), "clearance_s": round(clearance_s, 6),
               "replay_t": replays, "pressure_t": round(t_pressure, 6),
               "pressure_blocks": p["pressure_requests"] * npb,
               "measure_t": round(t_measure, 6),
               "formula": "t_replay = t_last + delay_fraction * D / rho; D = max(0, -B_last), "
                          "B_i = min(beta, B_(i-1) + rho (t_i - t_(i-1))) - n_i, B_0 = beta"}
    header = header_line(bs, hashing=SYNTHETIC_HASHING,
                         source="psgate workload delayed-replay (PrefixShield paper, Fig. 3b)",
                         generator={"name": kind, "params": p, "derived": derived},
                         groups={**_attack_groups(p),
                                 p["neutral_group"]: {"contracts": [p["neutral_contract"]]}})
    return [header] + [e[2] for e in events]


def _lognormal_tokens(rng: random.Random, mean: float, sigma: float, cap: int) -> int:
    """A lognormal draw with the given mean (mu = ln mean - sigma^2 / 2), rounded,
    clipped to [1, cap]."""
    return max(1, min(cap, round(rng.lognormvariate(math.log(mean) - sigma * sigma / 2,
                                                    sigma))))


def _sharegpt(kind: str, p: dict, burst: tuple[float, float] | None,
              cost: CostModel | StepRates | None) -> list[dict]:
    positive(kind, p, "block_size", "conversations", "min_turns", "max_turns", "mean_turns",
             "user_mean_tokens", "user_sigma", "user_max_tokens", "answer_mean_tokens",
             "answer_sigma", "answer_max_tokens", "max_context_tokens", "load")
    nonneg(kind, p, "think_mean_s", "warmup_s")
    ordered(kind, p, "min_turns", "mean_turns")
    ordered(kind, p, "mean_turns", "max_turns")
    first_turn = p["user_max_tokens"] + p["answer_max_tokens"]
    need(kind, first_turn <= p["max_context_tokens"], "max_context_tokens",
         f"room for a first turn: user_max_tokens + answer_max_tokens = {first_turn}",
         p["max_context_tokens"])
    tenants = p["tenant_contracts"]
    need(kind, type(p["answers"]) is bool, "answers", "true or false", p["answers"])
    answers = p["answers"]
    need(kind, isinstance(tenants, list) and tenants
         and all(isinstance(c, str) and c for c in tenants),
         "tenant_contracts", "a non-empty list of contract names", tenants)
    bs = p["block_size"]
    rng = _streams(p["seed"])
    model = rate_model(kind, p, cost)
    shapes = rng["shapes"]
    stop = 1.0 / (p["mean_turns"] - p["min_turns"] + 1)   # geometric extra turns, capped
    convs = []
    for c in range(p["conversations"]):
        tenant = shapes.randrange(len(tenants))
        extra = 0
        while p["min_turns"] + extra < p["max_turns"] and shapes.random() >= stop:
            extra += 1
        draws = [(_lognormal_tokens(shapes, p["user_mean_tokens"], p["user_sigma"],
                                    p["user_max_tokens"]),
                  _lognormal_tokens(shapes, p["answer_mean_tokens"], p["answer_sigma"],
                                    p["answer_max_tokens"]))
                 for _ in range(p["min_turns"] + extra)]
        turns, prompt, answer = [], 0, 0
        for user, out in draws:
            nxt = prompt + answer + user
            if nxt + out > p["max_context_tokens"]:
                break            # the context is full: the conversation ends here
            turns.append((nxt, out, prompt))
            prompt, answer = nxt, out
        convs.append((tenant, turns))

    alone: dict[tuple[int, int], float] = {}

    def hold_s(prompt, out):   # modeled, as a miss with no queueing
        if isinstance(model, CostModel):
            return (model.prefill_ms(prompt, 0) + out * model.per_output_token_ms) / 1000.0
        if (prompt, out) not in alone:     # the request alone under the step scheduler
            alone[prompt, out] = step_makespan_ns(model, 1, prompt, out, bs,
                                                  PAPER_CAPACITY) / 1e9
        return alone[prompt, out]

    reqs = [(pr, out, prev) for _, turns in convs for pr, out, prev in turns]
    occupancy = sum(math.ceil((pr + out) / bs) * hold_s(pr, out) for pr, out, _ in reqs)
    occupancy /= len(reqs)
    request_rate = p["load"] * PAPER_USABLE / occupancy
    mean_turns = len(reqs) / len(convs)
    conv_rate = request_rate / mean_turns

    arrivals, think = rng["arrivals"], rng["think"]
    events, t0 = [], 0.0
    for c, (tenant, turns) in enumerate(convs):
        t0 += arrivals.expovariate(conv_rate)
        start = t0
        if burst is not None:
            period, width = burst
            k = math.floor(t0 / period)
            start = k * period + (t0 - k * period) * width / period
        t, blocks, said = start, [], []
        for j, (prompt, out, prev) in enumerate(turns):
            # what the next turn re-sends: with answers, the previous turn's full blocks of
            # prompt and answer (their hashes in its answer field); without, its prompt's
            shared = said if answers else blocks[:prev // bs]
            blocks = shared + chain(f"c{c}/t{j}", prompt // bs - len(shared),
                                    parent=shared[-1] if shared else None, start=len(shared))
            extra = {}
            if answers:
                said = blocks + chain(f"c{c}/a{j}", (prompt + out) // bs - len(blocks),
                                      parent=blocks[-1] if blocks else None, start=len(blocks))
                extra["answer"] = said[len(blocks):]
            group = f"tenant-{tenant}"
            events.append((t, c, j, request(t, f"c{c}t{j}", group, tenants[tenant], blocks,
                                            prompt % bs, out, f"c{c}", "benign",
                                            measure=t >= p["warmup_s"], **extra)))
            t += hold_s(prompt, out) + (think.expovariate(1.0 / p["think_mean_s"])
                                        if p["think_mean_s"] > 0 else 0.0)
    events.sort(key=lambda e: (e[3]["t"], e[1], e[2]))
    max_hit = sum((prev // bs * bs) / pr for pr, _, prev in reqs) / len(reqs)
    derived = {"requests": len(reqs), "mean_turns": round(mean_turns, 6),
               "mean_prompt_tokens": round(sum(r[0] for r in reqs) / len(reqs), 6),
               "mean_answer_tokens": round(sum(r[1] for r in reqs) / len(reqs), 6),
               "mean_blocks_x_hold_s": round(occupancy, 6),
               "request_rate_per_s": round(request_rate, 6),
               "conversation_rate_per_s": round(conv_rate, 6),
               "max_hit_fraction": round(max_hit, 6), **rate_provenance(model)}
    header = header_line(bs, hashing=SYNTHETIC_HASHING,
                         source=f"psgate workload {kind} (PrefixShield paper; ShareGPT-like "
                                "synthetic conversations)",
                         generator={"name": kind, "params": header_params(p),
                                    "derived": derived},
                         groups={f"tenant-{k}": {"contracts": [c]}
                                 for k, c in enumerate(tenants)})
    return [header] + [e[3] for e in events]


@register_generator("sharegpt", "benign multi-tenant multi-turn chat with ShareGPT-like "
                    "lengths; each turn re-sends the previous prompt (paper)", SHAREGPT_DEFAULTS,
                    uses_cost=True)
def sharegpt(cost: CostModel | StepRates | None = None, **overrides) -> list[dict]:
    """ShareGPT-like multi-tenant conversations (all roles benign).

    Turn j's prompt = turn j-1's prompt + its answer + a new user message, so its first
    floor(prompt_{j-1} / 16) blocks are exactly turn j-1's full prompt blocks (answers
    are output, never cached in this replay model; the previous partial block and the
    answer start new blocks). Approximate ShareGPT statistics, as lognormals with the
    given means: user messages ~85 tokens (sigma 1.0), answers ~250 tokens (sigma 0.7),
    both clipped at 1,024; 2-8 turns, 2 + a geometric number of extra turns capped at 8
    (mean ~3.5: ShareChat, Yan et al. 2025, Table 1, counts 3.51 turns per ShareGPT
    conversation; the vLLM paper, Kwon et al. SOSP'23, reports ShareGPT means of ~161
    input tokens, history included, and ~338 output tokens per request). A conversation
    ends early once prompt + answer would pass ``max_context_tokens`` (4,096). Each
    conversation belongs to a uniformly drawn tenant; tenants' contracts come from
    ``tenant_contracts``; the logical prefix is the conversation.

    Arrivals: conversations start as a Poisson process; turn j+1 follows turn j's modeled
    completion (a miss, no queueing) plus an exponential pause (mean ``think_mean_s`` =
    5 s: conversations replayed nearly back to back, as multi-turn serving benchmarks
    do). Load model: in this replay model the blocks a running request holds bind chat
    traffic, not the prefill server, so the request rate is set by Little's law to
    load x 511 / E[blocks held x hold time] (load 0.6, the paper's default load, taken
    over these conversations): running requests hold 60% of usable blocks on average.
    With ``rates=step`` a turn's modeled time is the request alone under the step
    scheduler (its prefill chunks, then one decode step per further output token).
    """
    p = resolve_params("sharegpt", SHAREGPT_DEFAULTS, overrides)
    return _sharegpt("sharegpt", p, None, cost)


@register_generator("sharegpt-bursty", "sharegpt with conversation starts squeezed into short "
                    "bursts (paper)", SHAREGPT_BURSTY_DEFAULTS, uses_cost=True)
def sharegpt_bursty(cost: CostModel | StepRates | None = None, **overrides) -> list[dict]:
    """sharegpt's conversations (same seed: same conversations, same tenants, same pauses),
    their Poisson start times squeezed into bursts: a start at t in period k =
    floor(t / burst_period_s) moves to k x period + (t - k x period) x burst_s / period.
    The mean rate is unchanged; the peak is period / burst_s (10x by default: 2 s of
    every 20 s). Later turns keep their offsets from the conversation's start."""
    p = resolve_params("sharegpt-bursty", SHAREGPT_BURSTY_DEFAULTS, overrides)
    positive("sharegpt-bursty", p, "burst_period_s", "burst_s")
    ordered("sharegpt-bursty", p, "burst_s", "burst_period_s")
    return _sharegpt("sharegpt-bursty", p, (p["burst_period_s"], p["burst_s"]), cost)
