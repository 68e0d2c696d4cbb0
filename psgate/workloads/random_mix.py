"""random: small random multi-tenant traces for soak and property testing.

Shared chains (so prefixes hit and ancestry matters), several groups, scopes and
contracts, tails, outputs, done_t on some requests, cancels of waiting and running
requests, and priority hints. Sized for caches of a few dozen blocks.
"""

from __future__ import annotations

import random

from psgate.contracts import CONTRACT_NAMES
from psgate.trace.writer import header_line
from psgate.workloads import register_generator
from psgate.workloads.common import chain

RANDOM_DEFAULTS = {"seed": 0, "block_size": 4, "requests": 40, "groups": 3, "chains": 5,
                   "max_chain_blocks": 6, "cancel_fraction": 0.08}


@register_generator("random", "small random multi-tenant traces (soak and property tests)",
                    RANDOM_DEFAULTS)
def random_mix(**overrides) -> list[dict]:
    p = {**RANDOM_DEFAULTS, **overrides}
    rng = random.Random(p["seed"])
    bs = p["block_size"]
    chains = [chain(f"c{i}", rng.randint(1, p["max_chain_blocks"])) for i in range(p["chains"])]
    lines = [header_line(bs, source="psgate workload random", generator={"name": "random",
                                                                        "params": p})]
    t = 0.0
    ids: list[str] = []
    for i in range(p["requests"]):
        t = round(t + rng.choice([0, 0, 0.001, 0.004, 0.01, 0.05, 0.3]), 3)
        if ids and rng.random() < p["cancel_fraction"]:
            lines.append({"t": t, "op": "cancel", "id": rng.choice(ids)})
            continue
        g = rng.randrange(p["groups"])
        c = rng.choice(chains)
        k = rng.randint(0, len(c))
        blocks = c[:k]
        if k == len(c) and rng.random() < 0.5:
            blocks = blocks + chain(f"u{i}", rng.randint(1, 2), parent=c[-1] if c else None)
        tail = rng.randrange(bs)
        if not blocks and tail == 0:       # a prompt is never empty
            if bs > 1:
                tail = 1
            else:                          # one-token blocks leave no room for a tail
                blocks = chain(f"u{i}", 1)
        r = {"t": t, "op": "request", "id": f"r{i}", "group": f"g{g}",
             "contract": CONTRACT_NAMES[g % 3], "scope": "m" if rng.random() < 0.9 else "m2",
             "blocks": blocks, "tail": tail, "out": rng.randint(0, 3 * bs),
             "prefix": f"c{chains.index(c)}" if rng.random() < 0.5 else None,
             "role": ("victim", "attacker", "benign")[g % 3]}
        if r["prefix"] is None:
            del r["prefix"]
        if rng.random() < 0.5:
            r["done_t"] = round(t + rng.choice([0, 0.001, 0.02, 0.1, 0.5]), 3)
        if rng.random() < 0.2:
            r["priority"] = rng.randint(0, 100)
            r["priority_until"] = round(t + rng.choice([0.01, 0.1, 1.0]), 3)
        lines.append(r)
        ids.append(r["id"])
    return lines
