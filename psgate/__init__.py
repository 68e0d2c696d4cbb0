"""psgate: a policy receipt and release gate for KV prefix-cache eviction."""

__version__ = "0.1.0"
