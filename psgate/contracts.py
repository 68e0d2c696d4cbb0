"""Contracts: how fast each group may create cache content, as a domain concept.

A contract is a token bucket over block creation: ``[rho, beta]`` is the refill rate in
blocks per second and the burst in blocks. Traces name a contract per request, workloads
assign them, the PrefixShield family charges against them and trace stats compare a
group's creation rate with its refill. They all read the one table here, so this module
sits below every package and imports nothing from psgate.
"""

from __future__ import annotations

# name -> [refill rho (blocks/s), burst beta (blocks)]; lists, as receipts record them.
DEFAULT_CONTRACTS: dict[str, list[float]] = {"critical": [64.0, 256.0],
                                             "standard": [40.0, 192.0],
                                             "best-effort": [16.0, 128.0]}
# The contract names in the table's order, for workloads that cycle through them.
CONTRACT_NAMES: tuple[str, ...] = ("critical", "standard", "best-effort")
