"""Seeded, deterministic workload generators that write psgate-trace v1."""
