"""Receipts, ledgers and the gate: what a replay leaves behind for a reviewer.

Built from engines' results and the registry's description of an engine, the metrics,
traces and the bundled schemas; never from a policy's internals, the reports or the CLI.
"""
