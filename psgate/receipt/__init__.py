"""Receipts, ledgers and the gate: what a replay leaves behind for a reviewer."""
