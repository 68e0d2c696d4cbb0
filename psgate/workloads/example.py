"""The bundled example: one tenant floods unseen prefixes past two others' hot prompts.

    tenant-a (critical, victim):  two 64-block system prompts, reused every ~0.5 s
    tenant-b (standard, benign):  one 24-block prompt with short varied suffixes
    tenant-x (best-effort, attacker): from 10 s to 30 s, a new 48-block prompt every ~0.12 s

At 512 configured blocks (16 tokens each) the flood turns the cache over
several times, so an eviction policy has real choices to make. Seeded and
deterministic: ``python -m psgate.workloads.example`` rewrites the bundled file.
"""

from __future__ import annotations

import random
import sys

from psgate.trace.hashing import HASHING_NAME, chain_hashes
from psgate.trace.writer import dump_lines, header_line
from psgate.workloads import register_generator

PARAMS = {"seed": 7, "block_size": 16, "duration_s": 40.0, "victim_gap_s": 0.5,
          "benign_gap_s": 1.0, "attack_start_s": 10.0, "attack_end_s": 30.0,
          "attack_gap_s": 0.12, "victim_prefix_blocks": 64, "benign_prefix_blocks": 24,
          "attack_blocks": 48}
_KEY = b"psgate-example-key"


def _tokens(label: str, n_blocks: int, bs: int) -> list[int]:
    out: list[int] = []
    for j in range(n_blocks):
        rng = random.Random(f"{label}/{j}")
        out.extend(rng.randrange(1, 32000) for _ in range(bs))
    return out


@register_generator("example", "the bundled example: one tenant floods past two others' hot "
                    "prompts", PARAMS)
def make(**params) -> list[dict]:
    return generate(params)


def generate(params: dict | None = None) -> list[dict]:
    p = {**PARAMS, **(params or {})}
    rng = random.Random(p["seed"])
    bs = p["block_size"]
    arrivals: list[tuple[float, str, dict]] = []

    def poisson(start: float, end: float, gap: float):
        t = start
        while True:
            t += rng.expovariate(1.0 / gap)
            if t >= end:
                return
            yield round(t, 3)

    for i, t in enumerate(poisson(0.0, p["duration_s"], p["victim_gap_s"])):
        which = i % 2
        arrivals.append((t, f"a{i}", {
            "group": "tenant-a", "contract": "critical", "role": "victim",
            "prefix": f"a-sys-{which}", "prefix_blocks": p["victim_prefix_blocks"],
            "suffix_blocks": 2, "out": 32, "measure": i >= 2}))
    for i, t in enumerate(poisson(0.0, p["duration_s"], p["benign_gap_s"])):
        arrivals.append((t, f"b{i}", {
            "group": "tenant-b", "contract": "standard", "role": "benign",
            "prefix": "b-sys", "prefix_blocks": p["benign_prefix_blocks"],
            "suffix_blocks": rng.randint(1, 3), "out": 64, "measure": True}))
    for i, t in enumerate(poisson(p["attack_start_s"], p["attack_end_s"], p["attack_gap_s"])):
        arrivals.append((t, f"x{i}", {
            "group": "tenant-x", "contract": "best-effort", "role": "attacker",
            "prefix": f"x-{i}", "prefix_blocks": p["attack_blocks"], "suffix_blocks": 0,
            "out": 8, "measure": True}))
    arrivals.sort(key=lambda a: (a[0], a[1]))

    lines = [header_line(bs, hashing=HASHING_NAME, source="psgate example workload",
                         generator={"name": "example", "params": p},
                         groups={"tenant-a": {"contracts": ["critical"]},
                                 "tenant-b": {"contracts": ["standard"]},
                                 "tenant-x": {"contracts": ["best-effort"]}})]
    cancel_at: list[tuple[float, str]] = []
    for t, rid, spec in arrivals:
        while cancel_at and cancel_at[0][0] <= t:
            ct, cid = cancel_at.pop(0)
            lines.append({"t": ct, "op": "cancel", "id": cid})
        tokens = (_tokens(spec["prefix"], spec["prefix_blocks"], bs)
                  + _tokens(f"{rid}/suffix", spec["suffix_blocks"], bs))
        tail = rng.randrange(0, bs)
        lines.append({"t": t, "op": "request", "id": rid, "group": spec["group"],
                      "contract": spec["contract"], "scope": "m1",
                      "blocks": chain_hashes(tokens, bs, _KEY), "tail": tail,
                      "out": spec["out"], "prefix": spec["prefix"], "role": spec["role"],
                      **({} if spec["measure"] else {"measure": False})})
        if spec["role"] == "benign" and rng.random() < 0.1:
            cancel_at.append((round(t + 0.05, 3), rid))
            cancel_at.sort()
    for ct, cid in cancel_at:
        lines.append({"t": ct, "op": "cancel", "id": cid})
    return lines


def main() -> None:
    sys.stdout.buffer.write(dump_lines(generate()))


if __name__ == "__main__":
    main()
