"""Metrics per run, group and role, and paired comparisons between runs.

Computed from what an engine reports (``engines.results``) and the cost model alone, so the
same numbers come from any engine and no metric can reach into a policy.
"""
