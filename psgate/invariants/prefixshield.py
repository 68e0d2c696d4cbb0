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

The module is written in Cython's pure-Python mode and is its own source: ``pip install``
compiles it (``prefixshield.pxd`` declares :class:`BucketAudit`'s fields, a ``cdef
class``, and the C types of its per-admission check), and without a compiler it runs as
written.
"""

from __future__ import annotations

try:
    import cython
except ImportError:
    from psgate import cython_shadow as cython

import functools

from psgate.invariants.checker import Verdict, text_of


@cython.annotation_typing(False)     # the annotations are Python's; prefixshield.pxd types it
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

    def _bhat(self, g: str, c: str, t: float) -> float:
        """Bucket (g, c)'s level at t: refilled at rho since it was last charged, capped at
        beta (full, beta, where it was never made)."""
        beta = cython.declare(cython.double, self.beta[c])
        prev = self.buckets.get((g, c))
        if prev is None:
            return beta
        x = cython.declare(cython.double,
                           cython.cast(cython.double, prev[0])
                           + cython.cast(cython.double, self.rho[c])
                           * (t - cython.cast(cython.double, prev[1])))
        return x if x < beta else beta

    def raw_debt(self, g: str, t: float) -> float:
        """What g owes at t: the sum of its buckets below zero, in the order they were made
        (the buckets dict's order, per group), added one by one."""
        debt = cython.declare(cython.double, 0.0)
        x = cython.declare(cython.double)
        for c in self.group_contracts.get(g, ()):
            x = -self._bhat(g, c, t)
            if x > 0.0:
                debt += x
        return debt

    def admitted(self, where, group: str, contract: str, t: float, num_materialized: int,
                 audit: dict | None, num_output: int = 0) -> None:
        audit = audit or {}
        verdicts = self.verdicts
        v = verdicts.get("I2")
        if v is not None:
            promoted = audit.get("promoted", 0)
            debt = cython.declare(cython.double, self.raw_debt(group, t) if promoted else 0.0)
            if not promoted or debt <= self.eps:
                v.checks += 1
            else:                # the text is made for the first violation only
                v.record(False, functools.partial(_promoted_in_debt, where, promoted, group,
                                                  debt, self.eps))
        v = verdicts.get("I1")
        if v is not None:
            charged = audit.get("charged")
            if (charged == num_materialized and audit.get("group") == group
                    and audit.get("contract") == contract):
                v.checks += 1
            else:
                v.record(False, functools.partial(_charged_otherwise, where, num_materialized,
                                                  group, contract, charged, audit))
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


def _promoted_in_debt(where, promoted, group, debt, eps) -> str:
    return (f"{text_of(where)}: {promoted} block(s) promoted to Reuse while group "
            f"'{group}' owed {debt:.6g} blocks (eps {eps:g})")


def _charged_otherwise(where, num_materialized, group, contract, charged, audit) -> str:
    return (f"{text_of(where)}: materialized {num_materialized} block(s) for "
            f"{group}/{contract}; the policy charged {charged} to "
            f"{audit.get('group')}/{audit.get('contract')}")
