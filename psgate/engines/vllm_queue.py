"""A psgate policy in the place of vLLM's free-block queue.

vLLM v1's ``BlockPool.free_block_queue`` *is* its eviction order: truly free
blocks sit at the front (freed uncached blocks are prepended), cached blocks
whose last reference was dropped are appended, and ``get_new_blocks`` pops from
the front, evicting whatever cached content it pops. Every access goes through
that one attribute, so replacing the object installs a policy without patching
vLLM's allocation code:

    popleft_n(n)   truly free blocks first, then ask the policy for victims
    remove(b)      a hit took candidate b out             -> policy.on_touch
    prepend_n(bs)  uncached blocks became free            -> policy.on_released
    append_n(bs)   cached blocks became candidates        -> policy.on_free

The same policy objects serve ``sim`` and vLLM; nothing here imports vLLM (the
blocks are only read through ``block_id``), so the module is safe to import in
a base install.
"""

from __future__ import annotations

from collections import deque
from typing import Protocol

from psgate.policy import Decision, EvictionPolicy, PolicyRequest


class QueueOwner(Protocol):
    """Whoever drives the pool: says which request is allocating and records evictions."""

    def context(self) -> tuple[PolicyRequest | None, int]:
        """The request being allocated or released (None outside one) and the time in ns."""

    def reclaim_first(self, num_blocks: int) -> int:
        """How many of the next num_blocks must be evictions even while free blocks exist."""

    def evicting(self, decision: Decision) -> None:
        """The policy chose decision.victim; record and check it, then call policy.on_evict."""

    def released(self, block_ids: list[int]) -> None:
        """Blocks without content went back to the truly free blocks."""

    # Optional: an owner with ``batch_victims(victims, decisions)`` and ``needs_decisions``
    # (whether it needs the decisions) takes a whole batch from ``policy.evict_batch``,
    # which has already called on_evict for each victim, in order.


class PolicyFreeQueue:
    """Duck-types vLLM 0.32's ``FreeKVCacheBlockQueue`` over a psgate policy."""

    def __init__(self, blocks: list, policy: EvictionPolicy, owner: QueueOwner,
                 free_ids: list[int]) -> None:
        self._blocks = blocks
        self.policy = policy
        self.owner = owner
        # Truly free block ids, front first (the engine's view of vLLM's queue head).
        self.free: deque[int] = deque(free_ids)
        # A policy whose evict_batch is its own (select_victim + on_evict, n times, in one
        # call; the contract tests hold it to that) evicts an allocation's victims at once.
        self._batch = (type(policy).batches_evictions()
                       and getattr(owner, "batch_victims", None) is not None)

    @property
    def num_free_blocks(self) -> int:
        return len(self.free) + self.policy.num_candidates

    def popleft(self):
        return self.popleft_n(1)[0]

    def popleft_n(self, n: int) -> list:
        if n <= 0:
            return []
        free = self.free
        # 0..n: sim aborts a replay whose policy asks otherwise; a live server keeps serving
        take = min(n - max(0, min(n, self.owner.reclaim_first(n))), len(free))
        ids = [free.popleft() for _ in range(take)]
        if take < n:
            req, now = self.owner.context()
            if self._batch:
                decisions = [] if self.owner.needs_decisions else None
                victims = self.policy.evict_batch(req, now, n - take, decisions)
                if len(victims) < n - take:
                    raise RuntimeError(f"policy '{self.policy.name}' had {len(victims)} "
                                       f"candidates for {n - take} evictions")
                self.owner.batch_victims(victims, decisions)
                ids += victims
            else:
                for _ in range(n - take):
                    d = self.policy.select_victim(req, now)
                    self.owner.evicting(d)
                    ids.append(d.victim)
        blocks = self._blocks
        return [blocks[i] for i in ids]

    def remove(self, block) -> None:
        self.policy.on_touch(block.block_id)

    def append(self, block) -> None:
        self.append_n([block])

    def append_n(self, blocks: list) -> None:
        _, now = self.owner.context()
        self.policy.on_free([b.block_id for b in blocks], now)

    def prepend_n(self, blocks: list) -> None:
        ids = [b.block_id for b in blocks]
        self.free.extendleft(reversed(ids))
        self.policy.on_released(ids)
        self.owner.released(ids)

    def get_all_free_blocks(self) -> list:
        blocks = self._blocks
        return [blocks[i] for i in self.free] + [blocks[i] for i in self.policy.candidates()]
