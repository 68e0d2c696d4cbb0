"""Reading receipts back: verify, explain, diff, summaries and the HTML report.

The top of the stack below the CLI: reports may import the receipt, stats, traces,
policies, the engines (sim, to re-simulate a run) and the replay and experiment drivers
(verify re-runs them). Re-simulation runs sim, so a receipt of the real vLLM engine is
never re-simulated.
"""
