"""The PrefixShield paper's evaluation workloads (block size 16, 512 configured blocks).

one-touch   victim group re-reads 4 hot 1,536-token prefixes (96 blocks each, 384 in
            all) with short unique suffixes; an attacker group sends previously unseen
            1,536-token prefixes during the pressure window.
borrowing   one group idle after a short warm-up, one active group whose working set
            (31 prefixes x 16 cached blocks = 496) nearly fills the cache on its own: with
            the idle group's 32 blocks it exceeds the 511 usable blocks, so the active
            group reaches a full cache only by taking the idle group's blocks.

Load model (one-touch): C_prefill = requests/s of 32 distinct-prefix requests served
back to back by the cost model; victim arrivals at alpha * C_prefill (alpha = 0.6);
attacker, during the pressure window, at min(0.75 C_prefill, 1.15 alpha C_prefill).
The window holds ``attack_requests`` requests (240: 5.64 turnovers of a 4,096-block
cache, the paper's fixed attack window). Defaults were fixed before any policy was
compared on them and are written into every trace header.
"""

from __future__ import annotations

import random

from psgate.engines.cost import CostModel
from psgate.trace.writer import header_line
from psgate.workloads import register_generator
from psgate.workloads.common import SYNTHETIC_HASHING, chain, poisson, unique_prefill_rate

ONE_TOUCH_DEFAULTS = {
    "seed": 0, "block_size": 16, "alpha": 0.6, "hot_prefixes": 4, "prefix_tokens": 1536,
    "suffix_tokens": 32, "victim_out": 32, "attack_tokens": 1536, "attack_out": 32,
    "attack_requests": 240, "warmup_s": 10.0, "cooldown_s": 5.0,
    "victim_group": "victim", "victim_contract": "critical",
    "attacker_group": "attacker", "attacker_contract": "best-effort", "attack": True,
}

BORROWING_DEFAULTS = {
    "seed": 0, "block_size": 16, "idle_prefixes": 2, "active_prefixes": 31,
    "prefix_tokens": 256, "out": 16, "rate": 8.0, "warmup_s": 2.0, "duration_s": 60.0,
}


def _request(t, rid, group, contract, blocks, tail, out, prefix, role, measure=True):
    r = {"t": round(t, 6), "op": "request", "id": rid, "group": group, "contract": contract,
         "scope": "m", "blocks": blocks, "tail": tail, "out": out, "prefix": prefix,
         "role": role}
    if not measure:
        r["measure"] = False
    return r


@register_generator("one-touch", "victim re-reads 4 hot 1,536-token prefixes while an attacker "
                    "floods unseen prefixes (paper)", ONE_TOUCH_DEFAULTS)
def one_touch(**overrides) -> list[dict]:
    p = {**ONE_TOUCH_DEFAULTS, **overrides}
    unknown = set(overrides) - set(ONE_TOUCH_DEFAULTS)
    if unknown:
        raise ValueError(f"unknown one-touch parameter(s): {', '.join(sorted(unknown))}")
    rng = random.Random(p["seed"])
    bs = p["block_size"]
    cost = CostModel()
    c_prefill = unique_prefill_rate(cost, p["prefix_tokens"] + p["suffix_tokens"])
    victim_rate = p["alpha"] * c_prefill
    attack_rate = min(0.75 * c_prefill, 1.15 * p["alpha"] * c_prefill)
    attack_start = p["warmup_s"]
    attack_end = attack_start + p["attack_requests"] / attack_rate
    end = attack_end + p["cooldown_s"]
    prefix_blocks = p["prefix_tokens"] // bs
    hot = [chain(f"victim-sys-{i}", prefix_blocks) for i in range(p["hot_prefixes"])]
    events = []
    for i, t in enumerate(poisson(rng, 0.0, end, victim_rate)):
        k = rng.randrange(p["hot_prefixes"])
        n_suffix = p["suffix_tokens"] // bs
        blocks = hot[k] + chain(f"victim-q{i}", n_suffix, parent=hot[k][-1])
        tail = p["suffix_tokens"] % bs
        events.append((t, 0, _request(t, f"v{i}", p["victim_group"], p["victim_contract"],
                                      blocks, tail, p["victim_out"], f"victim-sys-{k}",
                                      "victim", measure=t >= attack_start)))
    if p["attack"]:
        n_attack = p["attack_tokens"] // bs
        times = list(poisson(rng, attack_start, attack_end, attack_rate))
        for i, t in enumerate(times):
            events.append((t, 1, _request(t, f"x{i}", p["attacker_group"],
                                          p["attacker_contract"],
                                          chain(f"attack-{i}", n_attack),
                                          p["attack_tokens"] % bs, p["attack_out"],
                                          f"attack-{i}", "attacker")))
    events.sort(key=lambda e: (e[0], e[1]))
    header = header_line(bs, hashing=SYNTHETIC_HASHING,
                         source="psgate workload one-touch (PrefixShield paper)",
                         generator={"name": "one-touch", "params": p,
                                    "derived": {"c_prefill_per_s": round(c_prefill, 6),
                                                "victim_rate_per_s": round(victim_rate, 6),
                                                "attack_rate_per_s": round(attack_rate, 6),
                                                "attack_window_s": [round(attack_start, 6),
                                                                    round(attack_end, 6)]}},
                         groups={p["victim_group"]: {"contracts": [p["victim_contract"]]},
                                 p["attacker_group"]: {"contracts": [p["attacker_contract"]]}})
    return [header] + [e[2] for e in events]


@register_generator("borrowing", "one group idle, one active group whose working set needs "
                    "the idle group's blocks (paper)", BORROWING_DEFAULTS)
def borrowing(**overrides) -> list[dict]:
    p = {**BORROWING_DEFAULTS, **overrides}
    unknown = set(overrides) - set(BORROWING_DEFAULTS)
    if unknown:
        raise ValueError(f"unknown borrowing parameter(s): {', '.join(sorted(unknown))}")
    rng = random.Random(p["seed"])
    bs = p["block_size"]
    n = p["prefix_tokens"] // bs
    events = []
    for i in range(p["idle_prefixes"]):
        t = i * 0.1
        events.append((t, _request(t, f"i{i}", "idle", "standard", chain(f"idle-{i}", n), 1,
                                   p["out"], f"idle-{i}", "benign", measure=False)))
    active = [chain(f"active-{i}", n) for i in range(p["active_prefixes"])]
    for i, t in enumerate(poisson(rng, p["warmup_s"], p["duration_s"], p["rate"])):
        k = rng.randrange(p["active_prefixes"])
        events.append((t, _request(t, f"a{i}", "active", "standard", active[k], 1, p["out"],
                                   f"active-{k}", "victim")))
    events.sort(key=lambda e: e[0])
    header = header_line(bs, hashing=SYNTHETIC_HASHING,
                         source="psgate workload borrowing (PrefixShield paper)",
                         generator={"name": "borrowing", "params": p})
    return [header] + [e[1] for e in events]
