"""Engines replay a trace under one policy and report what happened.

``sim`` is psgate's own block pool and service model, reproducing vLLM v1's
block pool. Engines never import the receipt or the CLI.
"""

ENGINES = ("sim",)
