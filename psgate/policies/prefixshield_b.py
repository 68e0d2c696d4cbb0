"""prefixshield-b: PrefixShield with a bounded Probationary segment (psgate's extension).

    as prefixshield (buckets, debt, classes, I1, I2, leaf-only), except the block order:
        segment order  iff  Probationary candidates >= T   (T in blocks)
        reclaim, per victim:
            g* = candidate-owning group with the largest projected debt P_g > eps
            segment order: g*'s first block in Probationary, then Normal, then Reuse
            otherwise:     g*'s oldest eligible block (native free-queue order)
            nobody with P_g > eps: the same order over all groups
    T fixed:    T = round(probationary_bound x usable)
    T adaptive: T starts at round(initial_bound x usable) (default 0: prefixshield's
                order). An eviction where the two orders disagree (the other order
                would have taken another block from the same group, or globally) puts
                its content key in the ghost G, tagged with the order that chose it;
                FIFO, |G| <= usable; an eviction where they agree drops the key from G
        on_cached(b, key) by group g, key in G:   (a ghost hit; the entry leaves G)
            g owes anything (raw debt D_g > eps):  ignored (counted, no change)
            segment order chose it:                T = min(usable, T + 1)
            native order chose it:                 T = max(0, T - 1)

This policy is not in the PrefixShield paper. The paper evicts every Probationary
block before any Normal or Reuse block; in conversational traffic the freshest,
never-yet-hit blocks are what the next turn re-reads, so that order loses hits to
plain LRU. Here the Probationary-first order is a defence that switches on only
while Probationary candidates number at least T, as S3-FIFO bounds its small queue;
debt still picks the responsible group first, so a flooding group in debt gives up
its own blocks whatever the order.

The adaptive rule, in words: a block that had to be recomputed is a regret for
the order that evicted it, counted only where the other order would have kept it
(taken another block instead). Segment order's regrets raise T (more native
order), native order's lower it (more protection); each recomputed block moves T
by one block, so T settles where the two kinds of regret balance, and an attack
whose victims recompute blocks that native order took drives T back to
prefixshield's order. Evidence from a group in debt is ignored, for the reason I2
ignores its reuse: a flooding group could otherwise recompute its own evicted
Probationary blocks to switch the defence off. Everything is integer arithmetic
on trace events, so it is deterministic.

Choices (stated here, each visible in the ledger):
- "Probationary candidates" counts every unpinned cached Probationary block, leaves
  or not (with leaf-only eviction a chain has one eligible leaf, and the bound is
  about blocks); ``rank`` records it with T, the order used and whether the
  other order would have chosen the same victim (``orders_agree``).
- In native order the victim is the eligible leaf freed earliest, whatever its
  segment; equal P_g is still broken by each group's best candidate's (segment,
  native position), as in prefixshield.
- The ghost keys are content keys (chain hash in its namespace); a key evicted
  again replaces its entry (and its tag). A key whose other copy stays resident
  keeps its entry until it is recomputed or pushed out.
- Ghost state is kept only in adaptive mode; an admission with ghost hits reports
  them and T in its ledger note.
- ``probationary_bound=0`` is prefixshield's order exactly, and the adaptive mode
  starts there: it leaves that order only on evidence from groups that owe nothing.
  ``probationary_bound=1`` is native order (segment order would need every usable
  block to be a Probationary candidate, where the two orders agree).
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from typing import Any

from psgate.policies import register
from psgate.policies.base import Decision, PolicyRequest, PoolInfo
from psgate.policies.prefixshield import PROBATIONARY, PrefixShield

ADAPTIVE = "adaptive"
SEGMENT_CHOICE, NATIVE_CHOICE = 1, -1     # ghost tags: the order that chose the victim


def _fraction(name: str, v: Any) -> float:
    if type(v) not in (int, float) or not 0 <= v <= 1:
        raise ValueError(f"'{name}' must be a number in [0, 1]"
                         + (" or 'adaptive'" if name == "probationary_bound" else "")
                         + f", found {v!r}")
    return float(v)


@register
class PrefixShieldB(PrefixShield):
    name = "prefixshield-b"
    summary = ("psgate's extension of PrefixShield: Probationary-first only while Probationary "
               "candidates exceed a bound, adapted from ghost hits")
    defaults: dict[str, Any] = {**PrefixShield.defaults, "probationary_bound": ADAPTIVE,
                                "initial_bound": 0.0}

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        bound = self.params["probationary_bound"]
        self.adaptive = bound == ADAPTIVE
        initial = _fraction("initial_bound", self.params["initial_bound"])
        self.bound_fraction = initial if self.adaptive else _fraction("probationary_bound",
                                                                      bound)

    def bind(self, pool: PoolInfo) -> None:
        super().bind(pool)
        self.key = array("q", [-1]) * pool.num_blocks
        self.num_prob = 0                     # unpinned cached Probationary blocks
        self.max_bound = pool.num_usable
        self.bound = round(self.bound_fraction * pool.num_usable)
        self.ghost: OrderedDict[int, int] = OrderedDict()    # key -> which order chose it
        self.pending_regret = (-1, 0)         # (victim, choice) from select_victim
        self.ghost_hits = [0, 0, 0]           # this batch: segment, native choice; ignored
        self.ghost_totals = [0, 0, 0]         # the whole run

    def segment_order(self) -> bool:
        return self.num_prob >= self.bound

    # -- block order ------------------------------------------------------------------
    def _pick(self, g: int, segments: bool) -> tuple[int, int]:
        """(segment, block) of g's first eligible candidate (g < 0: over all groups) in
        segment order or in native order; block -1 when there is none."""
        queues, base = (self.gq, 3 * g) if g >= 0 else (self.glob, 0)
        best = (2, -1)
        for s in range(3):
            b = queues.head(base + s)
            if b >= 0:
                if segments:
                    return s, b
                if best[1] < 0 or queues.seq[b] < queues.seq[best[1]]:
                    best = (s, b)
        return best

    def _best_of(self, g: int) -> tuple[int, int, int]:
        s, b = self._pick(g, self.segment_order())
        return (s, self.gq.seq[b], b) if b >= 0 else (3, 0, -1)

    def _global_best(self) -> tuple[int, int]:
        return self._pick(-1, self.segment_order())

    def select_victim(self, req: PolicyRequest, now_ns: int) -> Decision:
        segments = self.segment_order()
        d = super().select_victim(req, now_ns)
        g = self.gids[d.responsible] if d.responsible is not None else -1
        other = -1 if d.rank.get("ancestry_fallback") else self._pick(g, not segments)[1]
        # which order's choice this is, when the other order would have chosen another block
        self.pending_regret = (d.victim, 0 if other in (-1, d.victim) else
                               SEGMENT_CHOICE if segments else NATIVE_CHOICE)
        d.rank.update({"order": "segments" if segments else "native",
                       "orders_agree": other in (-1, d.victim),
                       "probationary_candidates": self.num_prob,
                       "probationary_bound": self.bound})
        return d

    # -- the Probationary candidate count ------------------------------------------------
    def on_free(self, blocks: list[int], now_ns: int) -> None:
        super().on_free(blocks, now_ns)
        cls = self.cls
        self.num_prob += sum(1 for b in blocks if cls[b] == PROBATIONARY)

    def _uncandidate(self, b: int) -> None:
        if self.cand[b] and self.cls[b] == PROBATIONARY:
            self.num_prob -= 1
        super()._uncandidate(b)

    # -- ghost hits ------------------------------------------------------------------------
    def on_admit(self, req: PolicyRequest, now_ns: int) -> None:
        super().on_admit(req, now_ns)
        self.ghost_hits = [0, 0, 0]

    def on_evict(self, block: int) -> None:
        key = self.key[block]
        victim, choice = self.pending_regret
        super().on_evict(block)
        self.key[block] = -1
        self.pending_regret = (-1, 0)
        if not self.adaptive or key < 0:
            return
        ghost = self.ghost
        ghost.pop(key, None)      # an older eviction of the same content is superseded
        if victim == block and choice:
            ghost[key] = choice
            if len(ghost) > self.max_bound:
                ghost.popitem(last=False)

    def on_cached(self, block: int, req: PolicyRequest, pos: int, parent: int,
                  key: int = -1) -> None:
        super().on_cached(block, req, pos, parent, key)
        self.key[block] = key
        if not self.adaptive or key not in self.ghost:
            return
        choice = self.ghost.pop(key)
        if self._debts(self.gids[req.group])[0] > self.eps:
            kind = 2
        elif choice == SEGMENT_CHOICE:
            kind = 0
            self.bound = min(self.max_bound, self.bound + 1)
        else:
            kind = 1
            self.bound = max(0, self.bound - 1)
        self.ghost_hits[kind] += 1
        self.ghost_totals[kind] += 1

    def end_admit(self, req: PolicyRequest, now_ns: int) -> dict:
        note = super().end_admit(req, now_ns)
        hits = self.ghost_hits
        if any(hits):
            note["ghost_hits"] = {"segment_choice": hits[0], "native_choice": hits[1],
                                  "ignored_in_debt": hits[2]}
            note["probationary_bound"] = self.bound
        return note
