"""prefixshield-b: PrefixShield with a bounded Probationary segment (psgate's extension).

    as prefixshield (buckets, debt, classes, I1, I2, leaf-only), except
    the charge: B_gc = Bhat_gc(t) - (n_prompt + output_weight x n_output)
        (n_output: new full blocks of generated tokens, default weight 1/4)
    and the block order when nobody is responsible:
        reclaim, per victim:
            g* = candidate-owning group with the largest projected debt P_g > eps
            g* exists:  g*'s first block in Probationary, then Normal, then Reuse
                        (prefixshield's segment order, always)
            otherwise:  over all groups, segment order iff Probationary candidates
                        >= T, or there are none and the requesting group is not
                        in good standing (below); else native order (the eligible
                        block freed earliest, whatever its segment)
    T fixed:    T = round(probationary_bound x usable)
    T adaptive: T starts at round(initial_bound x usable) (default 0: prefixshield's
                order). An eviction where the two orders disagree (the order in force
                takes block X, the other order would take Y: another block of the same
                group, or globally) opens a pair (X's content key, Y, the order that
                chose); at most usable pairs are open (FIFO); a later eviction of X's
                content replaces its pair. Whichever comes first closes the pair:
        group g computes X's content again (a ghost hit):  a regret for that order
        group g hits Y (reuses it while it is resident):   a credit for that order
        Y is evicted first:                                 the pair keeps only its X side
            regret of native order, credit of segment:      T = max(0, T - 1)
            regret of segment order, credit of native:      T = min(usable, T + 1),
                only if g is in good standing: it owes nothing (raw debt D_g <= eps)
                and each of its buckets holds at least evidence_fill (default 1/2)
                of its burst; else ignored (counted, no change)

This policy is not in the PrefixShield paper. The charge first: creation debt is there
to stop a tenant that floods new prefixes. Under vLLM's scheduler every full block of
generated tokens is cached and materialized too (I1 counts it, once, for its group),
and charged like a prompt block it doubles what a chatting tenant owes: on the
ShareGPT-like traces the best-effort tenant creates 6.8 prompt blocks/s of its own
against a 16 blocks/s refill, its answers add 6.7 blocks/s, and once evicted blocks are
recomputed the tenant lives in debt and gives up its freshest blocks first (its hit
fraction fell from 28% under LRU to 12%; psgate's first replay model cached prompt
blocks only).
A quarter weight keeps a flood of generated tokens (hundreds of blocks/s) in debt and
answers out of it; the I1/I2 checker applies the same weight to the engine's count of
output blocks. The block order next: the paper evicts every Probationary
block before any Normal or Reuse block; in conversational traffic the freshest,
never-yet-hit blocks are what the next turn re-reads, so that order loses hits to
plain LRU. Here the Probationary-first order is a defence that switches on only
while Probationary candidates number at least T, as S3-FIFO bounds its small queue.
It is bounded only where nobody is responsible: a group in debt gives up its own
blocks in the paper's order, its overdraft (Probationary) first, so debt keeps
exactly the protection it has in prefixshield. With no Probationary candidate at all
the two orders differ only in whether Normal blocks go before proven reuse (Reuse):
there native order is what the evidence chose for requests from groups in good
standing, and a request from any other group gets the paper's order, so a tenant
about to overdraw cannot take others' proven reuse ahead of their Normal blocks on
the strength of a bound that its own earlier requests may have raised.

The adaptive rule, in words: each disagreement is a bet that X will be needed later
than Y, and Belady's criterion settles it by which of the two is needed first. X's
content needed again before Y is reused: the order that chose X was wrong (a block had
to be recomputed that the other order would have kept, at the price of Y, which nobody
needed yet). Y reused first: it was right (the other order would have thrown away a
block that was needed sooner). Segment order's regrets and native order's credits raise
T (more native order), the converse lowers it; each settled bet moves T by one block,
so T settles where the two orders' mistakes balance. Counting only regrets (an earlier
version of this rule) charged segment order for every recomputed Probationary block even
when the block native order would have taken instead was needed sooner still, and drifted
too far toward native order on conversational traces.

Evidence is weighed by which way it moves T. Evidence for the defence (toward segment
order) counts from any group. Evidence against it counts only from a group in good
standing: one that owes nothing and has at least ``evidence_fill`` of every bucket's
burst left. A flooding group could otherwise recompute its own evicted Probationary
blocks to switch the defence off, and it is such a group until its burst is nearly
spent, which is when its requests start to overdraw and, debt being reckoned before a
request's own charge, evict through the global order. I2 ignores a group's reuse while
it is in debt for the same reason. Everything is integer arithmetic on trace events, so
it is deterministic.

Choices (stated here, each visible in the ledger):
- "Probationary candidates" counts every unpinned cached Probationary block, leaves
  or not (with leaf-only eviction a chain has one eligible leaf, and the bound is
  about blocks); ``rank`` records it with T, the order used and whether the
  other order would have chosen the same victim (``orders_agree``).
- In native order the victim is the eligible leaf freed earliest, whatever its
  segment.
- A responsible group's evictions open pairs as well (its segment-order pick against
  its own native-order pick): they are evidence about the two orders like any other.
- X is remembered by its content key (chain hash in its namespace), Y by its
  block, which is only ever reused while resident. A key whose other copy stays
  resident keeps its pair until it is recomputed, Y settles it or it is pushed out.
- Pairs are kept only in adaptive mode; an admission that settles any reports them
  (``evidence``: regrets and credits of each order, and those ignored because the
  group was not in good standing) and T in its ledger note.
- ``probationary_bound=0`` is prefixshield's order exactly, and the adaptive mode
  starts there: it leaves that order only on evidence from groups in good standing.
  ``probationary_bound=1`` is native order whenever nobody is responsible and some
  Probationary block is a candidate, or none is and the requester is in good standing
  (segment order would need every usable block to be a Probationary candidate, where
  the two orders agree).
- Good standing is read at the start of each admission, before its own charge, as
  debt is; ``rank`` records the requester's (``requester_in_good_standing``).
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from typing import Any

from psgate.policy import Decision, PolicyRequest, PoolInfo
from psgate.policies.prefixshield import PROBATIONARY, PrefixShield

ADAPTIVE = "adaptive"
SEGMENT_CHOICE, NATIVE_CHOICE = 1, -1     # pair tags: the order that chose the victim
# settled pairs, as counted in a ledger note's "evidence"
EVIDENCE = ("regret_segment", "regret_native", "credit_segment", "credit_native",
            "ignored")
IGNORED = 4


def _fraction(name: str, v: Any) -> float:
    if type(v) not in (int, float) or not 0 <= v <= 1:
        raise ValueError(f"'{name}' must be a number in [0, 1]"
                         + (" or 'adaptive'" if name == "probationary_bound" else "")
                         + f", found {v!r}")
    return float(v)


class PrefixShieldB(PrefixShield):
    name = "prefixshield-b"
    api_version = 1
    summary = ("psgate's extension of PrefixShield: where nobody is responsible, "
               "Probationary-first only while Probationary candidates reach a bound, adapted "
               "from ghost hits")
    defaults: dict[str, Any] = {**PrefixShield.defaults, "probationary_bound": ADAPTIVE,
                                "initial_bound": 0.0, "evidence_fill": 0.5,
                                "output_weight": 0.25}

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        bound = self.params["probationary_bound"]
        self.adaptive = bound == ADAPTIVE
        initial = _fraction("initial_bound", self.params["initial_bound"])
        self.evidence_fill = _fraction("evidence_fill", self.params["evidence_fill"])
        self.output_weight = _fraction("output_weight", self.params["output_weight"])
        self.bound_fraction = initial if self.adaptive else _fraction("probationary_bound",
                                                                      bound)

    def bind(self, pool: PoolInfo) -> None:
        super().bind(pool)
        self.key = array("q", [-1]) * pool.num_blocks
        self.num_prob = 0                     # unpinned cached Probationary blocks
        self.max_bound = pool.num_usable
        self.bound = round(self.bound_fraction * pool.num_usable)
        self.ghost: OrderedDict[int, int] = OrderedDict()    # X's key -> open pair, FIFO
        self.pairs: dict[int, list[int]] = {}                # pair -> [key, Y, order]
        self.spared: dict[int, dict[int, None]] = {}         # Y -> its open pairs
        self.next_pair = 0
        self.pending_regret = (-1, 0, -1)     # (victim, order, Y) from select_victim
        self.evidence = [0] * 5               # this batch: EVIDENCE
        self.evidence_totals = [0] * 5        # the whole run
        self.requester_in_good_standing = True    # of the admission under way

    def segment_order(self) -> bool:
        """The order over all groups when nobody is responsible."""
        return self.num_prob >= self.bound or (self.num_prob == 0
                                               and not self.requester_in_good_standing)

    # -- block order ------------------------------------------------------------------
    def _pick(self, g: int, segments: bool) -> tuple[int, int]:
        """(segment, block) of g's first eligible candidate (g < 0: over all groups) in
        segment order or in native order; block -1 when there is none."""
        queues, base = (self.gq, 3 * g) if g >= 0 else (self.global_queues(), 0)
        best = (2, -1)
        for s in range(3):
            b = queues.head(base + s)
            if b >= 0:
                if segments:
                    return s, b
                if best[1] < 0 or queues.seq[b] < queues.seq[best[1]]:
                    best = (s, b)
        return best

    def global_best(self) -> tuple[int, int]:
        return self._pick(-1, self.segment_order())

    def select_victim(self, req: PolicyRequest, now_ns: int) -> Decision:
        d = super().select_victim(req, now_ns)
        g = self.gids[d.responsible] if d.responsible is not None else -1
        segments = g >= 0 or self.segment_order()
        other = -1 if d.rank.get("ancestry_fallback") else self._pick(g, not segments)[1]
        # which order's choice this is, when the other order would have chosen another block
        self.pending_regret = (d.victim, 0 if other in (-1, d.victim) else
                               SEGMENT_CHOICE if segments else NATIVE_CHOICE, other)
        d.rank.update({"order": "segments" if segments else "native",
                       "orders_agree": other in (-1, d.victim),
                       "probationary_candidates": self.num_prob,
                       "probationary_bound": self.bound,
                       "requester_in_good_standing": self.requester_in_good_standing})
        return d

    # -- the Probationary candidate count ------------------------------------------------
    def on_free(self, blocks: list[int], now_ns: int) -> None:
        super().on_free(blocks, now_ns)
        cls = self.cls
        self.num_prob += sum(1 for b in blocks if cls[b] == PROBATIONARY)

    def uncandidate(self, b: int) -> None:
        if self.cand[b] and self.cls[b] == PROBATIONARY:
            self.num_prob -= 1
        super().uncandidate(b)

    # -- the pairs: regrets and credits ---------------------------------------------------
    def ghost_tags(self) -> list[tuple[int, int]]:
        """(X's content key, the order that chose X) of every open pair, oldest first."""
        return [(k, self.pairs[pid][2]) for k, pid in self.ghost.items()]

    def _close(self, pid: int) -> tuple[int, int, int]:
        key, y, order = self.pairs.pop(pid)
        self.ghost.pop(key, None)
        waiting = self.spared.get(y)
        if waiting is not None:
            del waiting[pid]
            if not waiting:
                del self.spared[y]
        return key, y, order

    def in_good_standing(self, g: int) -> bool:
        """g owes nothing and has at least evidence_fill of every bucket's burst left. The
        second implies the first: a bucket at or above fill x beta >= 0 is not overdrawn,
        and raw debt > eps needs some bucket below 0."""
        t, fill, beta = self.now_s, self.evidence_fill, self.buckets.beta
        return all(self.bhat(i, t) >= fill * beta[i] for i in self.buckets.group_buckets[g])

    def _settle(self, group: str, order: int, regret: bool) -> None:
        """One settled pair: a regret or a credit of ``order``, from ``group``."""
        up = (order == SEGMENT_CHOICE) == regret         # toward native order
        if up and not self.in_good_standing(self.gids[group]):
            kind = IGNORED
        else:
            self.bound = min(self.max_bound, self.bound + 1) if up else max(0, self.bound - 1)
            kind = (0 if regret else 2) + (order == NATIVE_CHOICE)
        self.evidence[kind] += 1
        self.evidence_totals[kind] += 1

    def on_admit(self, req: PolicyRequest, now_ns: int) -> None:
        super().on_admit(req, now_ns)
        self.evidence = [0] * 5
        self.requester_in_good_standing = self.in_good_standing(self.gids[req.group])

    def on_evict(self, block: int) -> None:
        key = self.key[block]
        victim, choice, other = self.pending_regret
        super().on_evict(block)
        self.key[block] = -1
        self.pending_regret = (-1, 0, -1)
        if not self.adaptive:
            return
        waiting = self.spared.pop(block, None)     # nobody can reuse this block now
        if waiting:
            for pid in waiting:
                self.pairs[pid][1] = -1
        if key < 0:
            return
        old = self.ghost.get(key)
        if old is not None:       # an older eviction of the same content is superseded
            self._close(old)
        if victim == block and choice:
            pid = self.next_pair
            self.next_pair += 1
            self.pairs[pid] = [key, other, choice]
            self.ghost[key] = pid
            self.spared.setdefault(other, {})[pid] = None
            if len(self.ghost) > self.max_bound:
                self._close(next(iter(self.ghost.values())))

    def on_hit(self, block: int, req: PolicyRequest, pos: int) -> None:
        super().on_hit(block, req, pos)
        if not self.adaptive or block not in self.spared:
            return
        for pid in list(self.spared[block]):     # Y reused first: credits
            _, _, order = self._close(pid)
            self._settle(req.group, order, regret=False)

    def on_cached(self, block: int, req: PolicyRequest, pos: int, parent: int,
                  key: int = -1) -> None:
        super().on_cached(block, req, pos, parent, key)
        self.key[block] = key
        if not self.adaptive or key not in self.ghost:
            return
        _, _, order = self._close(self.ghost[key])      # X needed first: a regret
        self._settle(req.group, order, regret=True)

    def end_admit(self, req: PolicyRequest, now_ns: int) -> dict:
        note = super().end_admit(req, now_ns)
        if any(self.evidence):
            note["evidence"] = dict(zip(EVIDENCE, self.evidence))
            note["probationary_bound"] = self.bound
        return note
