"""quota-lru: a per-tenant quota, then LRU; an eviction policy for psgate."""

from quota_lru.policy import QuotaLRU

__all__ = ["QuotaLRU"]
