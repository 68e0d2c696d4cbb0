"""I1 and I2, the PrefixShield family's invariants, with bucket arithmetic of their own.

I1: every materialized full block is charged exactly once, to the group (and
    contract) that materialized it; hits charge nothing. Checked per admission
    against the engine's count of newly cached blocks, and as running totals.
I2: no promotion to Reuse while the group's raw debt exceeds eps. The checker
    replays the charges into its own token buckets and reads the debt there,
    so a policy with broken refill arithmetic cannot vouch for itself. A policy
    that charges generated-token blocks at a weight (prefixshield-b's
    output_weight) names it at construction; the engine says how many of each
    batch's new blocks hold generated tokens (output keys), so the checker's
    buckets take the weighted charge without the policy's own count.
"""

from __future__ import annotations

from psgate import core
from psgate.invariants.checker import Verdict, text_of


class BucketAudit:
    def __init__(self, contracts: dict, eps: float, claims: tuple[str, ...],
                 output_weight: float = 1.0) -> None:
        self.output_weight = output_weight
        self.rho = {c: float(v[0]) for c, v in contracts.items()}
        self.beta = {c: float(v[1]) for c, v in contracts.items()}
        self.eps = eps
        self.buckets: dict[tuple[str, str], tuple[float, float]] = {}   # -> (B, t0)
        self.group_contracts: dict[str, list[str]] = {}     # group -> its buckets' contracts
        self.materialized: dict[str, int] = {}
        self.charged: dict[str, int] = {}
        self.verdicts = {name: Verdict(name, True) for name in claims}
        self._kernels = core.get()      # bucket_admitted: admitted when every check passes

    def _bhat(self, g: str, c: str, t: float) -> float:
        b, t0 = self.buckets.get((g, c), (self.beta[c], t))
        return min(self.beta[c], b + self.rho[c] * (t - t0))

    def raw_debt(self, g: str, t: float) -> float:
        # g's buckets in the order they were made (the buckets dict's order, per group)
        return sum(max(0.0, -self._bhat(g, c, t)) for c in self.group_contracts.get(g, ()))

    def admitted(self, where, group: str, contract: str, t: float, num_materialized: int,
                 audit: dict | None, num_output: int = 0) -> None:
        kernels = self._kernels
        if (kernels is not None and type(audit) is dict and type(group) is str
                and type(contract) is str and type(num_materialized) is int
                and kernels.bucket_admitted(self, where, group, contract, t, num_materialized,
                                            audit, num_output)):
            return
        audit = audit or {}
        verdicts = self.verdicts
        v = verdicts.get("I2")
        if v is not None:
            promoted = audit.get("promoted", 0)
            if promoted:
                debt = self.raw_debt(group, t)
                v.record(debt <= self.eps,
                         lambda: f"{text_of(where)}: {promoted} block(s) promoted to Reuse "
                         f"while group '{group}' owed {debt:.6g} blocks (eps {self.eps:g})")
            else:
                v.checks += 1
        v = verdicts.get("I1")
        if v is not None:
            charged = audit.get("charged")
            if (charged == num_materialized and audit.get("group") == group
                    and audit.get("contract") == contract):
                v.checks += 1
            else:
                v.record(False, lambda: f"{text_of(where)}: materialized {num_materialized} "
                         f"block(s) for {group}/{contract}; the policy charged {charged} to "
                         f"{audit.get('group')}/{audit.get('contract')}")
            materialized = self.materialized
            materialized[group] = materialized.get(group, 0) + num_materialized
            if charged:
                g2 = audit.get("group", group)
                self.charged[g2] = self.charged.get(g2, 0) + charged
        key = (group, contract)
        if num_materialized:
            w = self.output_weight
            amount = num_materialized if num_output == 0 or w == 1.0 else (
                (num_materialized - num_output) + w * num_output)
            b = self._bhat(group, contract, t) - amount
            if key not in self.buckets:
                self.group_contracts.setdefault(group, []).append(contract)
            self.buckets[key] = (b, t)
        elif key not in self.buckets:
            self.group_contracts.setdefault(group, []).append(contract)
            self.buckets[key] = (self.beta[contract], t)

    def finish(self) -> None:
        if "I1" in self.verdicts:
            groups = sorted(set(self.charged) | set(self.materialized))
            bad = [g for g in groups if self.charged.get(g, 0) != self.materialized.get(g, 0)]
            self.verdicts["I1"].record(not bad, lambda: f"end of run: group '{bad[0]}' was "
                                       f"charged {self.charged.get(bad[0], 0)} blocks for "
                                       f"{self.materialized.get(bad[0], 0)} materialized")

    def results(self) -> dict[str, Verdict]:
        return dict(self.verdicts)
