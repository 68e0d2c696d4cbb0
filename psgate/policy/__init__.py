"""psgate's policy API, version 1: everything an eviction policy is written against.

Every policy psgate ships imports this module and nothing else of psgate (besides another
built-in policy it extends), so a policy in a user's own package stands where the
built-in ones stand::

    from psgate.policy import Decision, EvictionPolicy, BlockQueues

    class MyPolicy(EvictionPolicy):
        name = "my-policy"
        api_version = 1
        ...

Named by ``module:Class``, ``path/to/file.py:Class`` or an entry point in the group
``psgate.policies``, such a class is replayed, gated, checked (``psgate check-policy``)
and served by the vLLM plugin like a built-in one.

What it holds:

- :class:`EvictionPolicy`, the base class, with the events an engine sends in vLLM's
  block-pool order (its docstring lists them) and the hooks a quota policy may answer;
- :class:`PolicyRequest` and :class:`PoolInfo`, what a policy may know of a request and
  of the pool (never a request's ``role``), with its retention hints
  (:class:`RetentionRange`; a policy names the hints it honours in ``honours_hints``);
  :class:`Decision`, one eviction with the
  ranking fields that made it (one ledger row), and :class:`FieldDecision`, a base for
  a Decision a policy builds per victim in a batch as the fields that make it (the
  dicts made only when read);
- helpers over flat arrays: :class:`BlockQueues` (intrusive FIFO queues, O(1)),
  :class:`SeqQueues` (queues ordered by a sequence number, O(log n)),
  :class:`LeafTracker` (which cached blocks are leaves of the chains requests built),
  :class:`LeafCandidates` (a leaf-first policy's candidates: leaves before non-leaves,
  each ordered by the policy's integer key, a parent eligible again at its own key),
  :class:`PrefixHistory` (per-group bounded LRU sets of content keys), :class:`GroupIds`
  (dense group ids);
- :data:`DEFAULT_CONTRACTS`, the contract table (refill blocks/s, burst blocks) that the
  PrefixShield family charges against, :class:`TokenBuckets` (creation debt as token
  buckets per group and contract, with each group's kinetic sums),
  :class:`DebtRanking` (the groups ranked by projected debt over those sums), and
  :class:`BucketAudit`, the independent checker of invariants I1 and I2 for a policy
  that charges token buckets;
- :func:`non_finite`, whether a value holds a NaN or an infinity (no JSON, and a
  comparison with it decides nothing);
- :func:`kernels`, psgate's compiled helpers over these types where they are built
  (None elsewhere: a policy must run without them, they only make it faster).

Versioning. :data:`API_VERSION` is the version this psgate provides. A policy declares
the version it was written against as its class attribute ``api_version``; psgate
refuses (exit 2, one line) a policy that declares none or a newer one than it provides.
A version's names and their meaning do not change; a change that would break a policy
written against it gets a new version.
"""

from __future__ import annotations

from psgate import core
from psgate.contracts import DEFAULT_CONTRACTS
from psgate.invariants.prefixshield import BucketAudit
from psgate.policy.base import (Decision, EvictionPolicy, GroupIds, PolicyRequest,
                                PoolInfo, RetentionRange, non_finite)
from psgate.policy.field_decision import FieldDecision
from psgate.policy.history import PrefixHistory
from psgate.policy.leaf_tracker import LeafTracker
from psgate.policy.queues import BlockQueues, LeafCandidates
from psgate.policy.buckets import TokenBuckets
from psgate.policy.debt_ranking import DebtRanking
from psgate.policy.seq_queues import SeqQueues

API_VERSION = 1
NS_PER_S = 1_000_000_000

__all__ = ["API_VERSION", "NS_PER_S", "BlockQueues", "BucketAudit", "DEFAULT_CONTRACTS",
           "DebtRanking", "Decision", "EvictionPolicy", "FieldDecision", "GroupIds",
           "LeafCandidates", "LeafTracker", "PolicyRequest", "PoolInfo", "PrefixHistory",
           "RetentionRange", "SeqQueues", "TokenBuckets", "kernels", "non_finite"]


def kernels():
    """psgate's compiled helpers (the ``psgate._core`` module) where they are built and
    switched on, else None. Their functions take the helper types above; a policy that
    uses them keeps its Python path beside them (both must decide alike: the replay's
    differential tests hold psgate's own policies to that)."""
    return core.get()
