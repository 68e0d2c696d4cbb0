"""Reading receipts back: verify, explain, diff."""
