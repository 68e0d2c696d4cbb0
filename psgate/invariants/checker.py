"""Invariant checking from engine events, with state of its own.

The checker rebuilds reference counts, cached content and residency from the
events the engine reports, and compares the engine's and the policy's own
counters against that; it never trusts either. Checks are incremental (O(1)
per block event); ``paranoid=True`` also recomputes everything from scratch
after every mutation, which tests use.

A violation is recorded, never raised: a replay always ends with a verdict
per invariant (how many times it was checked, how many violations, the first).
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass

from psgate import core

NO_KEY = -1
_COPIES = (1 << 32) - 1
_CHILD = 1 << 32

HARD = ("no_pinned_eviction", "hits_contiguous_in_namespace", "capacity_and_accounting")


@dataclass(slots=True)
class Verdict:
    name: str
    hard: bool
    checks: int = 0
    violations: int = 0
    first_violation: str | None = None

    @property
    def holds(self) -> bool:
        return self.violations == 0

    def record(self, ok: bool, what) -> None:
        self.checks += 1
        if not ok:
            self.violations += 1
            if self.first_violation is None:
                self.first_violation = what() if callable(what) else what

    def to_json(self) -> dict:
        return {"hard": self.hard, "holds": self.holds, "checks": self.checks,
                "violations": self.violations, "first_violation": self.first_violation}


def text_of(where) -> str:
    """Event locations are strings or, on hot paths, callables formatted only on failure."""
    return where() if callable(where) else where


class InvariantChecker:
    def __init__(self, num_blocks: int, parent_of, paranoid: bool = False,
                 parent_table=None, key_shift: int = 32,
                 opaque_keys_from: int = 1 << 63) -> None:
        """``parent_of(key)`` gives the key of a cached block's parent, or NO_KEY for a root.

        With ``parent_table`` (a key's low ``key_shift`` bits index it; a negative entry
        is a root; the parent shares the key's high bits), the lookup is done inline,
        the same mapping without a call per block. Keys from ``opaque_keys_from`` up name
        no entry of the table (blocks of generated tokens): ``parent_of`` answers for them
        and the dict keeps their counts."""
        self.num_blocks = num_blocks
        self.num_usable = num_blocks - 1
        self.paranoid = paranoid
        self._parent_of = parent_of
        self.parent_table = parent_table
        self.key_shift = key_shift
        self.opaque_keys_from = opaque_keys_from
        self.ref = array("i", [0]) * num_blocks
        self.key = array("q", [NO_KEY]) * num_blocks
        self.num_resident = 0            # blocks pinned or holding cached content
        self.num_candidates = 0          # unpinned blocks holding cached content
        # key -> resident copies | (resident children << 32). With a parent table, a
        # hash's counts for the first namespace to hold it sit in flat arrays indexed by
        # the hash (res_ns says which namespace owns the slot), 12 bytes per distinct
        # hash; other namespaces' keys, and every key without a table, use the dict,
        # whose entries are dropped when both counts are zero.
        self.res: dict[int, int] = {}
        self.res_ns = array("i")
        self.res_cnt = array("q")
        self.grow_slots()
        self.num_orphans = 0
        self.max_orphans = 0
        self.orphans_created = 0
        self.verdicts = {name: Verdict(name, True) for name in HARD}
        self._core = core.get() if parent_table is not None else None

    # -- residency bookkeeping ------------------------------------------------
    def grow_slots(self) -> None:
        """Slots for every hash in the parent table (it grows while a trace is read)."""
        if self.parent_table is not None and len(self.parent_table) > len(self.res_ns):
            more = len(self.parent_table) - len(self.res_ns)
            self.res_ns.extend(array("i", [-1]) * more)
            self.res_cnt.extend(array("q", [0]) * more)

    def _count(self, k: int) -> int:
        """copies | children << 32 of key k, wherever it is kept."""
        if self.parent_table is not None and k < self.opaque_keys_from:
            h = k & ((1 << self.key_shift) - 1)
            if h < len(self.res_ns) and self.res_ns[h] == k >> self.key_shift:
                return self.res_cnt[h]
        return self.res.get(k, 0)

    def _tracked(self) -> dict[int, int]:
        """Every key with resident copies -> their number."""
        out = {k: v & _COPIES for k, v in self.res.items() if v & _COPIES}
        for h, ns in enumerate(self.res_ns):
            if ns >= 0 and self.res_cnt[h] & _COPIES:
                out[(ns << self.key_shift) | h] = self.res_cnt[h] & _COPIES
        return out

    def _parent_key(self, k: int) -> int:
        table = self.parent_table
        if table is None or k >= self.opaque_keys_from:
            return self._parent_of(k)
        p = table[k & ((1 << self.key_shift) - 1)]
        return NO_KEY if p < 0 else ((k >> self.key_shift) << self.key_shift) | p

    def _store(self, k: int, v: int) -> None:
        if self.parent_table is not None and k < self.opaque_keys_from:
            h = k & ((1 << self.key_shift) - 1)
            if h < len(self.res_ns) and self.res_ns[h] in (k >> self.key_shift, -1):
                self.res_ns[h] = k >> self.key_shift
                self.res_cnt[h] = v
                return
        if v:
            self.res[k] = v
        else:
            self.res.pop(k, None)

    # The general forms of the inline loops in admitted and evicted_many.
    def _add_copy(self, k: int) -> None:
        p = self._parent_key(k)
        if p != NO_KEY:
            v = self._count(p)
            self._store(p, v + _CHILD)
            if v & _COPIES == 0:
                self.num_orphans += 1
        v = self._count(k)
        self._store(k, v + 1)
        if v & _COPIES == 0:
            self.num_orphans -= v >> 32

    def drop_copy(self, k: int) -> None:
        """One resident copy of k is gone: its parent counts one child less, and where it
        was k's last copy, k's children are orphans now. The compiled eviction loop calls
        this for a key the parent table does not cover."""
        p = self._parent_key(k)
        if p != NO_KEY:
            v = self._count(p) - _CHILD
            self._store(p, v)
            if v & _COPIES == 0:
                self.num_orphans -= 1
        v = self._count(k) - 1
        if v & _COPIES == 0:
            orphaned = v >> 32
            self.num_orphans += orphaned
            self.orphans_created += orphaned
        self._store(k, v)

    def copies(self, k: int) -> int:
        return self._count(k) & _COPIES

    # -- events ---------------------------------------------------------------
    def admitted(self, where, ns_keys: list[int], hits: list[int], max_hits: int,
                 new_blocks: list[int], cached: list[tuple[int, int]]) -> None:
        """A request with chain keys ``ns_keys`` took ``hits`` and ``new_blocks``;
        ``cached`` lists (block, key) that now hold content. ``where`` is a string or
        a callable giving one."""
        ref, key = self.ref, self.key
        v = self.verdicts["hits_contiguous_in_namespace"]
        bad = None
        num_unpinned = i_new = 0
        i_hit = 0
        if (self._core is not None and type(hits) is list and type(new_blocks) is list
                and type(ns_keys) is list):
            i_hit, num_unpinned, i_new = self._core.checker_pinned(self, ns_keys, hits,
                                                                   new_blocks)
        for i in range(i_hit, len(hits)):
            b = hits[i]
            if bad is None and key[b] != ns_keys[i]:
                bad = (i, b)
            if ref[b] == 0:
                num_unpinned += 1
            ref[b] += 1
        self.num_candidates -= num_unpinned
        if bad is None and len(hits) <= max_hits:
            v.checks += 1
        else:
            v.record(False, lambda: f"{text_of(where)}: hit {len(hits)} blocks (at most "
                     f"{max_hits} allowed)" if bad is None else
                     f"{text_of(where)}: hit position {bad[0]} is block {bad[1]}, which does "
                     f"not hold this request's block in its namespace")
        acc = self.verdicts["capacity_and_accounting"]
        acc.checks += i_new
        for b in new_blocks[i_new:] if i_new else new_blocks:
            if ref[b] == 0 and key[b] == NO_KEY:
                acc.checks += 1
            else:
                acc.record(False, lambda b=b: f"{text_of(where)}: block {b} was allocated while "
                           f"{'pinned' if ref[b] else 'holding cached content'}")
            ref[b] += 1
        self.num_resident += len(new_blocks)
        table = self.parent_table
        if table is None:
            add_copy = self._add_copy
            for b, k in cached:
                key[b] = k
                add_copy(k)
        elif self._core is not None:
            if len(table) > len(self.res_ns):
                self.grow_slots()
            self._core.checker_cached(self, cached)
        else:                            # _add_copy, inline, over the slots
            if len(table) > len(self.res_ns):
                self.grow_slots()
            res, rns, cnt = self.res, self.res_ns, self.res_cnt
            shift = self.key_shift
            mask = (1 << shift) - 1
            orphans = self.num_orphans
            opaque = self.opaque_keys_from
            for b, k in cached:
                key[b] = k
                if k >= opaque:           # no parent, no children: a count in the dict
                    res[k] = res.get(k, 0) + 1
                    continue
                h = k & mask
                ns = k >> shift
                p = table[h]
                if p >= 0:
                    o = rns[p]
                    if o == ns:
                        v = cnt[p]
                        cnt[p] = v + _CHILD
                    elif o < 0:
                        rns[p] = ns
                        v = 0
                        cnt[p] = _CHILD
                    else:
                        p |= ns << shift
                        v = res.get(p, 0)
                        res[p] = v + _CHILD
                    if v & _COPIES == 0:
                        orphans += 1
                o = rns[h]
                if o == ns:
                    v = cnt[h]
                    cnt[h] = v + 1
                elif o < 0:
                    rns[h] = ns
                    v = 0
                    cnt[h] = 1
                else:
                    v = res.get(k, 0)
                    res[k] = v + 1
                if v & _COPIES == 0:
                    orphans -= v >> 32
            self.num_orphans = orphans
        if self.num_orphans > self.max_orphans:
            self.max_orphans = self.num_orphans

    def evicted(self, where, b: int) -> None:
        self.evicted_many(where, (b,))

    def evicted_many(self, where, blocks) -> int:
        """Blocks evicted in this order. Stops at the first one that was not a candidate
        (recorded as a violation); returns how many before it were."""
        ref, key = self.ref, self.key
        v = self.verdicts["no_pinned_eviction"]
        n = self.num_blocks
        drop_copy = self.drop_copy
        table, res, shift = self.parent_table, self.res, self.key_shift
        rns, cnt = self.res_ns, self.res_cnt
        mask = (1 << shift) - 1
        num_ok = 0
        if self._core is not None:
            num_ok, start = self._core.checker_evicted(self, blocks, 0)
            v.checks += num_ok
            if start == len(blocks):
                return num_ok
            blocks = blocks[start:]
        for b in blocks:
            if not 0 < b < n:
                v.record(False, lambda b=b: f"{text_of(where)}: evicted block {b}, which is not "
                         f"a usable block of the pool")
                break
            k = key[b]
            if ref[b] == 0 and k != NO_KEY:
                v.checks += 1
                if table is None or k >= self.opaque_keys_from:
                    drop_copy(k)
                else:                    # drop_copy, inline, over the slots
                    h = k & mask
                    ns = k >> shift
                    p = table[h]
                    if p >= 0:
                        if rns[p] == ns:
                            c = cnt[p] - _CHILD
                            cnt[p] = c
                        else:
                            p |= ns << shift
                            c = res[p] - _CHILD
                            if c:
                                res[p] = c
                            else:
                                del res[p]
                        if c & _COPIES == 0:
                            self.num_orphans -= 1
                    if rns[h] == ns:
                        c = cnt[h] - 1
                        cnt[h] = c
                    else:
                        c = res[k] - 1
                        if c:
                            res[k] = c
                        else:
                            del res[k]
                    if c & _COPIES == 0:
                        orphaned = c >> 32
                        self.num_orphans += orphaned
                        self.orphans_created += orphaned
                key[b] = NO_KEY
                self.num_candidates -= 1
                self.num_resident -= 1
                num_ok += 1
                continue
            v.record(False, lambda b=b: f"{text_of(where)}: evicted block {b}, which was "
                     + ("pinned by a running request" if ref[b] else "not holding cached content"))
            if k != NO_KEY:
                drop_copy(k)
                key[b] = NO_KEY
            break
        return num_ok

    def released(self, where: str, blocks: list[int]) -> None:
        if self._core is not None:
            self._core.checker_released(self, blocks)
            return
        ref, key = self.ref, self.key
        for b in blocks:
            ref[b] -= 1
            if ref[b] == 0:
                if key[b] == NO_KEY:
                    self.num_resident -= 1
                else:
                    self.num_candidates += 1

    def check_accounting(self, where: str, num_truly_free: int, num_candidates: int,
                         engine=None, policy=None) -> None:
        """After a mutation: capacity holds and every party counts the same blocks."""
        v = self.verdicts["capacity_and_accounting"]
        resident = self.num_resident
        ok = (resident <= self.num_usable and num_truly_free == self.num_usable - resident
              and num_candidates == self.num_candidates)
        v.record(ok, lambda: f"{text_of(where)}: occupancy {resident} of {self.num_usable} "
                 f"usable; the engine has {num_truly_free} truly free blocks (expected "
                 f"{self.num_usable - resident}) and the policy {num_candidates} candidates "
                 f"(expected {self.num_candidates})")
        if self.paranoid and engine is not None:
            self._recount(where, engine, policy)

    def _recount(self, where: str, engine, policy) -> None:
        """Everything again from scratch: the engine's arrays, the policy's queue, orphans."""
        v = self.verdicts["capacity_and_accounting"]
        mism = [b for b in range(1, self.num_blocks)
                if engine.ref[b] != self.ref[b] or engine.key[b] != self.key[b]]
        v.record(not mism, lambda: f"{text_of(where)}: engine and checker disagree on block "
                 f"{mism[0]} (ref {engine.ref[mism[0]]} vs {self.ref[mism[0]]}, content "
                 f"{engine.key[mism[0]]} vs {self.key[mism[0]]})")
        expected = sorted(b for b in range(1, self.num_blocks)
                          if self.ref[b] == 0 and self.key[b] != NO_KEY)
        got = None
        if policy is not None:
            try:
                got = policy.candidates()
            except NotImplementedError:     # optional: num_candidates was checked above
                got = None
        if got is not None:
            v.record(sorted(got) == expected and len(got) == len(set(got)),
                     lambda: f"{text_of(where)}: the policy's candidates ({len(got)}) are not the "
                     f"unpinned cached blocks ({len(expected)})")
        resident_keys: dict[int, int] = {}
        for b in range(1, self.num_blocks):
            if self.key[b] != NO_KEY:
                resident_keys[self.key[b]] = resident_keys.get(self.key[b], 0) + 1
        orphans = 0
        for b in range(1, self.num_blocks):
            k = self.key[b]
            if k != NO_KEY:
                p = self._parent_of(k)
                if p != NO_KEY and p not in resident_keys:
                    orphans += 1
        tracked = self._tracked()
        v.record(orphans == self.num_orphans and resident_keys == tracked,
                 lambda: f"{text_of(where)}: {orphans} orphans recounted, {self.num_orphans} "
                 f"tracked")

    # -- results --------------------------------------------------------------
    def orphan_stats(self) -> dict:
        return {"orphans_created": self.orphans_created, "orphan_blocks_max": self.max_orphans,
                "orphan_blocks_end": self.num_orphans}

    def results(self) -> dict[str, Verdict]:
        return dict(self.verdicts)
