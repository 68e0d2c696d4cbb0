"""Metrics per run, group and role, and paired comparisons between runs."""
