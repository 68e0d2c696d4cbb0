"""prefixshield: per-tenant creation debt picks the group, retention class picks the block.

    on admission of r (group g, contract c) at time t:
        hits of g's own blocks with r's contract and logical prefix are proven reuse:
            promote to Reuse iff raw debt D_g(t) <= eps, else record a denied promotion (I2)
        reclaim: truly free blocks first (the engine), then per victim:
            g* = candidate-owning group with the largest projected debt P_g > eps
                 (P_g = Dn_g(t) at admission, minus 1/W_g per victim taken from g)
            victim = g*'s first block in Probationary, then Normal, then Reuse (native order)
            nobody with P_g > eps: the same segment order over all groups
        charge: B_gc = Bhat_gc(t) - n_r   (n_r = newly materialized full blocks)
        class of the new blocks: Probationary if g never admitted the logical prefix
            or B_gc < -eps after the charge, else Normal

Buckets, per (group, contract), in blocks: refill rho_c per second up to beta_c,
lazily: Bhat(t) = min(beta, B(t0) + rho (t - t0)); they start full. Raw debt
D_g = sum_c max(0, -Bhat_gc), over all of g's contracts so relabelling cannot
launder it; normalized Dn_g = sum_c max(0, -Bhat_gc) / w_c with w_c = rho_c / min rho.

Choices where the paper is silent (each a parameter or stated here):
- ``leaf_only`` (default true): only leaves are eligible (a parent becomes eligible,
  at its own native position, when its last resident child leaves), so no orphans;
  false gives the paper's behaviour. If no eligible leaf exists while candidates do
  (not reachable with vLLM's prefix hits, kept as a guard), the oldest non-leaf goes
  and the ledger row says ``ancestry_fallback``.
- Logical prefix: the request's ``prefix`` label, else the block's own chain hash in
  its namespace. Admission history: the last ``history_size`` logical prefixes each
  group materialized (an LRU set per group; default 65,536).
- Promotion is decided at the hit, before this admission's own charge; the debt is
  read at the admission's time.
- ``segments=false`` (prefixshield-noseg): native order inside the responsible group;
  ``gate=false`` (prefixshield-nogate): promote on proven reuse whatever the debt.

Finding g* costs O(log groups): indebted buckets' normalized debts all fall at the
same rate (min rho), so Dn_g(t) = min_rho * (S_g - k_g t), with z the time a bucket
clears, S_g the sum of z over g's k_g indebted buckets (psgate.policy.buckets). Groups
with equal k keep their order as time passes, so one heap per k (keyed by S_g) plus a
heap of clearing times gives the maximum exactly; within a batch, groups already charged
a victim move to a small heap of their own (psgate.policy.debt_ranking).
"""

from __future__ import annotations

from array import array
from typing import Any

from psgate.policy import (BucketAudit, DebtRanking, Decision, DEFAULT_CONTRACTS,
                          EvictionPolicy, GroupIds, kernels, LeafTracker, PolicyRequest,
                          PoolInfo, PrefixHistory, SeqQueues, TokenBuckets)

NS_PER_S = 1_000_000_000
SEGMENTS = ("probationary", "normal", "reuse")
PROBATIONARY, NORMAL, REUSE = 0, 1, 2


def _r(x: float) -> float:
    return round(x, 9)


class PrefixShield(EvictionPolicy):
    name = "prefixshield"
    api_version = 1
    summary = "PrefixShield (paper): creation debt picks the group, retention class the block"
    defaults: dict[str, Any] = {"contracts": DEFAULT_CONTRACTS, "eps": 1e-9,
                                "history_size": 65536, "leaf_only": True, "segments": True,
                                "gate": True}
    family = "prefixshield"
    max_blocks = SeqQueues.MASK        # the most blocks SeqQueues holds

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        table = self.params["contracts"]
        if not isinstance(table, dict) or not table:
            raise ValueError("'contracts' must map contract names to [rho, beta]")
        for name, spec in table.items():
            if (not isinstance(spec, (list, tuple)) or len(spec) != 2
                    or not all(isinstance(x, (int, float)) and x > 0 for x in spec)):
                raise ValueError(f"contract '{name}': expected [rho, beta] with rho, beta > 0, "
                                 f"found {spec!r}")
        for key in ("leaf_only", "segments", "gate"):
            if not isinstance(self.params[key], bool):
                raise ValueError(f"'{key}' must be true or false")
        if self.params["eps"] < 0:      # a negative tolerance would call a balanced group indebted
            raise ValueError(f"'eps' must be >= 0, found {self.params['eps']!r}")
        if not isinstance(self.params["history_size"], int) or self.params["history_size"] < 1:
            raise ValueError("'history_size' must be a positive integer")
        self.contract_names = sorted(table)
        self.cidx = {c: i for i, c in enumerate(self.contract_names)}
        self.rho = {c: float(table[c][0]) for c in table}
        self.beta = {c: float(table[c][1]) for c in table}
        self.min_rho = min(self.rho.values())
        self.weight = {c: self.rho[c] / self.min_rho for c in table}
        self.eps = float(self.params["eps"])
        # What one newly materialized block of generated tokens is charged (a prompt block:
        # 1); the paper charges every block alike. prefixshield-b sets it.
        self.output_weight = 1.0
        self._segments = self.params["segments"]
        self.seg_names = SEGMENTS if self._segments else ("all", "all", "all")

    def claims(self) -> tuple[str, ...]:
        return ("I1", "I2") if self.params["gate"] else ("I1",)

    def invariant_auditors(self) -> tuple[BucketAudit, ...]:
        claims = self.claims()
        return ((BucketAudit(self.params["contracts"], self.params["eps"], claims,
                             self.output_weight),)
                if claims else ())

    def contract_table(self) -> list[str]:
        return list(self.contract_names)

    # -- setup ------------------------------------------------------------------
    def bind(self, pool: PoolInfo) -> None:
        super().bind(pool)
        n = pool.num_blocks
        self.owner = array("i", [-1]) * n        # gid of the materializing group
        self.cls = array("b", [0]) * n
        self.contract = array("b", [0]) * n      # index into contract_names
        self.lprefix: list = [None] * n          # the request's prefix label, or None
        self.cand = bytearray(n)                 # 1 while unpinned and cached
        self.freed_seq = array("q", [0]) * n
        self.num_cand = 0
        self.free_seq = 0
        self.tree = LeafTracker(n) if self.params["leaf_only"] else None
        compiled_core = kernels()
        compiled = compiled_core is not None and type(self) in _COMPILED
        self.gq = SeqQueues(n)                   # per (group, segment): q = 3*g + s
        # All groups' eligible blocks per segment, for the fallback when nobody is in
        # debt. Kept up to date only while it may be needed: after a run of evictions
        # that never used it as long as the pool (debt picked every victim), it is
        # dropped (None), and the next fallback rebuilds it from the group queues, so its
        # upkeep costs nothing where debt decides and the rebuild is paid for by that run.
        self.glob: SeqQueues | None = SeqQueues(n, 3)
        self.glob_budget = self.glob_patience = n
        # groups
        self.groups = GroupIds()
        self.gids, self.gnames = self.groups.ids, self.groups.names
        self.qnames: list[str] = []              # "group/segment" for queue 3*g + s
        self.history = PrefixHistory(self.params["history_size"], pool.key_shift)
        self.num_eligible = array("q")           # per group (arrays: the core reads them)
        # token buckets per (group, contract), and their groups' kinetic sums S_g, k_g,
        # which rank the groups by normalized debt
        self.buckets = TokenBuckets()
        self.ranking = DebtRanking(self.buckets, self.num_eligible, self.min_rho)
        # per batch
        self.now_s = 0.0
        self.pending: tuple | None = None
        self.new_blocks: list[tuple[int, int]] = []
        self.num_new_output = 0                  # of new_blocks, generated-token blocks
        self.promoted = 0
        self.denied = 0
        self.promotion_debt = 0.0
        self.last_audit: dict = {}
        # valid for one batch (time and stored balances do not move inside it)
        self.debt_cache: dict[int, tuple[float, float, float]] = {}
        # The compiled forms of on_admit, on_free, evict_batch, on_cached and end_admit
        # (psgate.core's PrefixShieldView), over this state (an admission's new blocks
        # are the view's while bound); only for the classes whose methods they mirror.
        self._view = compiled_core.PrefixShieldView(self, Decision, SEGMENTS) if compiled else None
        if self._view is not None:       # called per block by the engine's compiled loop
            self.on_cached = self._view.cached
        else:
            self.__dict__.pop("on_cached", None)

    def group_id(self, group: str) -> int:
        """The group's id, its queues, buckets and history made on first sight."""
        g = self.gids.get(group)
        if g is None:
            g = self.groups.add(group)
            self.history.add_group()
            self.num_eligible.append(0)
            self.buckets.add_group()
            self.ranking.add_group()
            for seg in self.seg_names:
                self.gq.add_queue()
                self.qnames.append(f"{group}/{seg}")
        return g

    def bucket_index(self, g: int, c: int) -> int:
        """The index of g's bucket for contract c in B, made full on first use."""
        i = self.buckets.index.get((g, c))
        if i is None:                            # buckets start full
            cname = self.contract_names[c]
            i = self.buckets.add(g, c, self.rho[cname], self.beta[cname],
                                 self.weight[cname], self.now_s)
        return i

    # -- bucket arithmetic (psgate.policy.buckets) ------------------------------------
    def bhat(self, i: int, t: float) -> float:
        return self.buckets.bhat(i, t)

    def raw_debt(self, g: int, t: float) -> float:
        return self.buckets.raw_debt(g, t)

    def norm_debt(self, g: int, t: float) -> float:
        return self.buckets.norm_debt(g, t)

    def _charge(self, g: int, c: int, n: float, t: float) -> float:
        b = self.buckets.charge(self.bucket_index(g, c), n, t)
        self.ranking.line_moved(g)
        return b

    def _advance(self, t: float) -> None:
        """A batch at time t: the last batch's groups back on their lines, buckets whose
        debt cleared by t out of their groups' S_g / k_g (DebtRanking.start_batch)."""
        self.ranking.start_batch(t)
        self.now_s = t

    # -- group ranking (psgate.policy.debt_ranking) --------------------------------
    def _p(self, g: int) -> float:
        return self.ranking.p(g, self.now_s)

    def _ranked(self) -> tuple[list[int], float, int, float]:
        """(groups tied at the largest P_g, that P, runner-up gid or -1, its P): the
        batch's ranking."""
        return self.ranking.cached(self.now_s)

    def _best_of(self, g: int) -> tuple[int, int]:
        """(segment, block) of g's best eligible candidate; (3, -1) if it has none."""
        q = self.gq.first_queue(3 * g, 3)
        return q - 3 * g, (self.gq.head(q) if q < 3 * g + 3 else -1)

    def global_queues(self) -> SeqQueues:
        """The all-groups queues, rebuilt if they were dropped; a use keeps them."""
        self.glob_budget = self.glob_patience
        if self.glob is None:
            self.glob = SeqQueues(self.pool.num_blocks, 3)
            self.glob.gather(self.gq, 3)         # group queue 3 * g + s into s
        return self.glob

    def global_best(self) -> tuple[int, int]:
        """(segment, block) of the best eligible candidate over all groups; block -1
        when no leaf is eligible."""
        glob = self.global_queues()
        s = glob.first_queue(0, 3)
        return (s, glob.head(s)) if s < 3 else (2, -1)

    # -- events -----------------------------------------------------------------
    def on_admit(self, req: PolicyRequest, now_ns: int) -> None:
        if self._view is not None:
            self._view.on_admit(req, now_ns)
            return
        self._advance(now_ns / NS_PER_S)
        self.group_id(req.group)
        self.new_blocks = []
        self.num_new_output = 0
        self.promoted = self.denied = 0
        self.promotion_debt = 0.0
        self.debt_cache.clear()

    def _debts(self, g: int) -> tuple[float, float, float]:
        """(raw debt, normalized debt, W_g) of g at the batch's time, computed once: the
        sums of raw_debt and norm_debt and W_g, in one pass (TokenBuckets.debts)."""
        d = self.debt_cache.get(g)
        if d is None:
            d = self.debt_cache[g] = self.buckets.debts(g, self.now_s)
        return d

    def on_hit(self, block: int, req: PolicyRequest, pos: int) -> None:
        g = self.gids[req.group]
        if (self.owner[block] != g or self.contract[block] != self.cidx[req.contract]
                or self.lprefix[block] != req.prefix or self.cls[block] == REUSE):
            return
        debt = self._debts(g)[0]       # raw_debt(g, now_s), computed once per batch
        if not self.params["gate"] or debt <= self.eps:
            self.cls[block] = REUSE
            self.promoted += 1
            self.promotion_debt = max(self.promotion_debt, debt)
        else:
            self.denied += 1

    def on_touch(self, block: int) -> None:
        self.uncandidate(block)

    def touch_hits(self):
        return self._view.touched if self._view is not None else None

    def _eligible_push(self, b: int) -> None:
        if self._view is not None:
            self._view.eligible(b)
            return
        g, s = self.owner[b], (self.cls[b] if self._segments else 0)
        seq = self.freed_seq[b]
        self.gq.push(3 * g + s, b, seq)
        if self.glob is not None:
            self.glob.push(s, b, seq)
        ne = self.num_eligible
        ne[g] += 1
        if ne[g] == 1:
            self.ranking.relist(g)

    def uncandidate(self, b: int) -> None:
        if self._view is not None:
            self._view.uncandidate(b)
            return
        self.cand[b] = 0
        self.num_cand -= 1
        if self.gq.where[b] >= 0:
            g = self.owner[b]
            self.gq.remove(b)
            if self.glob is not None:
                self.glob.remove(b)
            self.num_eligible[g] -= 1
            if self.num_eligible[g] == 0:
                self.ranking.drop(g)       # its heap entries are stale now

    def on_free(self, blocks: list[int], now_ns: int) -> None:
        if self._view is not None and type(blocks) is list:
            self._view.freed(blocks)
            return
        # A candidate that is not a leaf waits outside the queues until its last child
        # leaves (on_evict); the guard finds such blocks by scanning (_oldest_nonleaf).
        children = self.tree.children if self.tree is not None else None
        freed_seq, cand = self.freed_seq, self.cand
        for b in blocks:
            self.free_seq += 1
            freed_seq[b] = self.free_seq
            cand[b] = 1
            self.num_cand += 1
            if children is None or children[b] == 0:      # a leaf
                self._eligible_push(b)

    def _oldest_nonleaf(self) -> int:
        """The earliest freed candidate that is not a leaf, -1 if none: the guard's pick,
        by a scan (the guard is not reachable with vLLM's prefix hits)."""
        cand, where, seq = self.cand, self.gq.where, self.freed_seq
        best = -1
        for b in range(len(cand)):
            if cand[b] and where[b] < 0 and (best < 0 or seq[b] < seq[best]):
                best = b
        return best

    def choose(self) -> tuple:
        """(victim, responsible gid or -1, its P before and after, segment, runner-up gid
        or -1, its P, ancestry fallback?): select_victim's choice before the Decision."""
        top, top_p, runner, runner_p = self._ranked()
        if top and top_p > self.eps:
            g = top[0]
            if len(top) > 1:     # equal P_g: best candidate's segment, then native order
                g, runner = self.gq.first_two_families(top, 3)
                runner_p = top_p
            seg, b = self._best_of(g)
            p_after = top_p - self.ranking.inv_w(g, self.now_s)
            if self.glob is not None:
                self.glob_budget -= 1
                if self.glob_budget <= 0:       # unused for a pool's worth: drop it
                    self.glob = None
            return b, g, top_p, p_after, seg, runner, runner_p, False
        seg, b = self.global_best()
        if b >= 0:
            return b, -1, None, None, seg, -1, 0.0, False
        b = self._oldest_nonleaf()     # no eligible leaf at all: guard, see the docstring
        return b, -1, None, None, (self.cls[b] if self.params["segments"] else 0), -1, 0.0, True

    def decision(self, choice: tuple) -> Decision:
        """The ledger's Decision for a choice that choose() made."""
        b, g, p_before, p_after, seg, runner, runner_p, ancestry_fallback = choice
        seg_name = self.seg_names
        if g >= 0:
            q = 3 * g
            queue = self.qnames[q + seg]
            live = self.gq.live
            counts = {"probationary": live[q], "normal": live[q + 1], "reuse": live[q + 2]}
        else:
            queue = "ancestry-fallback" if ancestry_fallback else f"global/{seg_name[seg]}"
            live = self.global_queues().live
            counts = {"probationary": live[0], "normal": live[1], "reuse": live[2]}
        og = self.owner[b]
        raw, norm, _ = self.debt_cache.get(og) or self._debts(og)
        rank = {"segment": seg_name[seg], "class": SEGMENTS[self.cls[b]],
                "freed_seq": self.freed_seq[b], "global_fallback": g < 0,
                "owner_contract": self.contract_names[self.contract[b]],
                "owner_raw_debt": raw, "owner_norm_debt": norm}
        if ancestry_fallback:
            rank["ancestry_fallback"] = True
        return Decision(
            victim=b, num_candidates=self.num_cand, position=0, queue=queue,
            responsible=self.gnames[g] if g >= 0 else None, responsible_p_before=p_before,
            responsible_p_after=p_after, runner_up=self.gnames[runner] if runner >= 0 else None,
            runner_up_p=runner_p if runner >= 0 else None, segments=counts, rank=rank)

    def select_victim(self, req: PolicyRequest, now_ns: int) -> Decision:
        choice = self.choose()
        self.pending = (choice[0], choice[1], choice[3])
        return self.decision(choice)

    def evict_batch(self, req: PolicyRequest, now_ns: int, num_blocks: int,
                    decisions: list[Decision] | None) -> list[int]:
        """select_victim + on_evict, num_blocks times, without building decisions that
        nobody records."""
        if self._view is not None:
            return self._view.evict_batch(num_blocks, decisions)
        choose, evicted = self.choose, self.evicted
        victims: list[int] = []
        for _ in range(num_blocks):
            if self.num_cand == 0:
                break
            choice = choose()
            if decisions is not None:
                decisions.append(self.decision(choice))
            self.pending = None
            evicted(choice[0], choice[1], choice[3])
            victims.append(choice[0])
        return victims

    def on_evict(self, block: int) -> None:
        pending, self.pending = self.pending, None
        if pending is not None and pending[0] == block:
            self.evicted(block, pending[1], pending[2])
        else:
            self.evicted(block, -1, None)

    def evicted(self, b: int, g: int, p_after: float | None) -> None:
        """b is gone; g (>= 0) was responsible and is now projected at p_after."""
        if g >= 0:
            self.ranking.took(g, p_after)
        tree, cand = self.tree, self.cand
        if tree is None and not cand[b]:
            return
        self.uncandidate(b)
        if tree is not None:
            p = tree.evicted(b)
            if p >= 0 and cand[p]:       # p is a leaf now
                self._eligible_push(p)
        self.owner[b] = -1

    def on_cached(self, block: int, req: PolicyRequest, pos: int, parent: int,
                  key: int = -1) -> None:
        self.new_blocks.append((block, key))
        if pos >= req.num_prompt_blocks:         # generated tokens (or the prompt's tail)
            self.num_new_output += 1
        if self.tree is not None:
            self.tree.cached(block, parent)

    def end_admit(self, req: PolicyRequest, now_ns: int) -> dict:
        if self._view is not None:
            return self._view.end_admit(req)
        g = self.gids[req.group]
        c = self.cidx[req.contract]
        self.ranking.end_batch()
        n = len(self.new_blocks)
        t = self.now_s
        n_out = self.num_new_output
        # the bucket is charged n blocks, generated-token blocks at output_weight each
        amount = n if n_out == 0 or self.output_weight == 1.0 else (
            (n - n_out) + self.output_weight * n_out)
        balance = self._charge(g, c, amount, t) if n else self.bhat(self.bucket_index(g, c), t)
        self.last_audit = {"group": req.group, "contract": req.contract, "charged": n,
                           "promoted": self.promoted, "promotion_debt": self.promotion_debt}
        note: dict[str, Any] = {"charged": n, "balance": _r(balance),
                                "raw_debt": _r(self.raw_debt(g, t)),
                                "promoted": self.promoted, "promotion_denied": self.denied}
        if amount != n:
            note["output_blocks"] = n_out
            note["charge"] = _r(amount)
        if self.denied:
            note["denied_reason"] = "group in debt"
        if not n:
            return note
        hist = self.history
        label = req.prefix
        # "first admission" is judged against the history before this request
        keys = [k for _, k in self.new_blocks]
        in_debt = balance < -self.eps
        if label is not None:
            first = dict.fromkeys(keys, not hist.contains(g, label))
        else:
            first = {k: not seen for k, seen in zip(keys, hist.contains_keys(g, keys))}
        classes = [0, 0, 0]
        for b, key in self.new_blocks:
            cls = PROBATIONARY if first[key] or in_debt else NORMAL
            self.cls[b] = cls
            self.owner[b] = g
            self.contract[b] = c
            self.lprefix[b] = label
            classes[cls] += 1
        if label is not None:
            hist.touch(g, label)
        else:
            hist.touch_keys(g, keys)
        note["new_class"] = {SEGMENTS[s]: classes[s] for s in range(3) if classes[s]}
        self.new_blocks = []
        return note

    def audit(self) -> dict:
        """What the last admission did, for the I1/I2 checkers (which redo the arithmetic)."""
        return self.last_audit

    @property
    def num_candidates(self) -> int:
        return self.num_cand

    def candidates(self) -> list[int]:
        return [b for b in range(len(self.cand)) if self.cand[b]]


class PrefixShieldNoSeg(PrefixShield):
    name = "prefixshield-noseg"
    api_version = 1
    summary = "PrefixShield ablation: no segments (native order inside the responsible group)"
    defaults = {**PrefixShield.defaults, "segments": False}


class PrefixShieldNoGate(PrefixShield):
    name = "prefixshield-nogate"
    api_version = 1
    summary = "PrefixShield ablation: promotion to Reuse regardless of debt"
    defaults = {**PrefixShield.defaults, "gate": False}


# The classes whose hooks the compiled core mirrors (a subclass that changes what they
# call, such as prefixshield-b, runs the Python methods).
_COMPILED = (PrefixShield, PrefixShieldNoSeg, PrefixShieldNoGate)
