"""Invariant checking from engine events, with state of its own.

The checker rebuilds reference counts, cached content and residency from the
events the engine reports, and compares the engine's and the policy's own
counters against that; it never trusts either. Checks are incremental (O(1)
per block event); ``paranoid=True`` also recomputes everything from scratch
after every mutation, which tests use.

A violation is recorded, never raised: a replay always ends with a verdict
per invariant (how many times it was checked, how many violations, the first).

The per-block loops (``pin_hits``, ``pin_new``, ``cache_keys``, ``evict_run``,
``release``) are written once, in Cython's pure-Python mode: ``pip install`` compiles
this module (``checker.pxd`` gives their C types, and the compiled engine calls them as
C functions), and without a compiler they run as written. Each reads the checker's flat
arrays through ``psgate.flat`` (compiled: pointers to their items, no buffer taken per
call), taken again after any call back into the checker's Python, and checks the block
ids it indexes with.
"""

try:
    import cython
except ImportError:
    from psgate import cython_shadow as cython

import functools
from array import array
from dataclasses import dataclass

if not cython.compiled:     # compiled, checker.pxd cimports them (pointers to the items)
    from psgate.flat import ints, llongs

NO_KEY = -1
_COPIES = (1 << 32) - 1
_CHILD = 1 << 32
_ALL_TABLED = (1 << 63) - 1     # opaque_keys_from above this: every key is in the table

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


def _hits_text(where, hits, max_hits, bad) -> str:
    if bad < 0:
        return f"{text_of(where)}: hit {len(hits)} blocks (at most {max_hits} allowed)"
    return (f"{text_of(where)}: hit position {bad} is block {hits[bad]}, which does not "
            f"hold this request's block in its namespace")


def _new_block_text(where, block, was_pinned) -> str:
    return (f"{text_of(where)}: block {block} was allocated while "
            f"{'pinned' if was_pinned else 'holding cached content'}")


def _evicted_text(where, block, which) -> str:
    return f"{text_of(where)}: evicted block {block}, which {which}"


def _accounting_text(where, resident, num_usable, num_truly_free, num_candidates,
                     expected_candidates) -> str:
    return (f"{text_of(where)}: occupancy {resident} of {num_usable} usable; the engine has "
            f"{num_truly_free} truly free blocks (expected {num_usable - resident}) and the "
            f"policy {num_candidates} candidates (expected {expected_candidates})")


@cython.annotation_typing(False)     # its methods' annotations document, compiled too
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

    def add_copy(self, k: int) -> None:
        """One more resident copy of k: its parent counts one child more, and where k had
        none, its children are no orphans now. ``cache_keys`` calls this for a key the
        parent table does not cover."""
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
        was k's last copy, k's children are orphans now. ``evict_run`` calls this for a
        key the parent table does not cover."""
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
        if type(ns_keys) is not list:
            ns_keys = list(ns_keys)
        if type(hits) is not list:
            hits = list(hits)
        if type(new_blocks) is not list:
            new_blocks = list(new_blocks)
        num_unpinned, bad = pin_hits(self, ns_keys, hits)
        self.num_candidates -= num_unpinned
        v = self.verdicts["hits_contiguous_in_namespace"]
        if bad < 0 and len(hits) <= max_hits:
            v.checks += 1
        else:       # the text is made for a first violation only (no closure per call)
            v.record(False, functools.partial(_hits_text, where, hits, max_hits, bad))
        num_bad, bad, was_pinned = pin_new(self, new_blocks)
        acc = self.verdicts["capacity_and_accounting"]
        acc.checks += len(new_blocks) - num_bad
        for _ in range(num_bad):
            acc.record(False, functools.partial(_new_block_text, where, new_blocks[bad],
                                                was_pinned))
        self.num_resident += len(new_blocks)
        if cached:
            if type(cached) is not list:
                cached = list(cached)
            self.grow_slots()
            cache_keys(self, cached)
        if self.num_orphans > self.max_orphans:
            self.max_orphans = self.num_orphans

    def evicted(self, where, b: int) -> None:
        self.evicted_many(where, (b,))

    def evicted_many(self, where, blocks) -> int:
        """Blocks evicted in this order. Stops at the first one that was not a candidate
        (recorded as a violation); returns how many before it were."""
        if type(blocks) is not list:
            blocks = list(blocks)
        num_ok, stop = evict_run(self, blocks, 0)
        v = self.verdicts["no_pinned_eviction"]
        v.checks += num_ok
        if stop == len(blocks):
            return num_ok
        b = blocks[stop]                 # the first that was no candidate
        if not 0 < b < self.num_blocks:
            v.record(False, functools.partial(_evicted_text, where, b,
                                              "is not a usable block of the pool"))
            return num_ok
        v.record(False, functools.partial(_evicted_text, where, b,
                                          "was pinned by a running request" if self.ref[b]
                                          else "was not holding cached content"))
        k = self.key[b]
        if k != NO_KEY:
            self.drop_copy(k)
            self.key[b] = NO_KEY
        return num_ok

    def released(self, where: str, blocks: list[int]) -> None:
        release(self, blocks if type(blocks) is list else list(blocks))

    def check_accounting(self, where: str, num_truly_free: int, num_candidates: int,
                         engine=None, policy=None) -> None:
        """After a mutation: capacity holds and every party counts the same blocks."""
        v = self.verdicts["capacity_and_accounting"]
        resident = self.num_resident
        if (resident <= self.num_usable and num_truly_free == self.num_usable - resident
                and num_candidates == self.num_candidates):
            v.checks += 1
        else:
            v.record(False, functools.partial(_accounting_text, where, resident,
                                              self.num_usable, num_truly_free,
                                              num_candidates, self.num_candidates))
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


# -- the per-block loops (compiled where pip install could; see the module's docstring) --

def pin_hits(checker: InvariantChecker, ns_keys: list, hits: list) -> tuple:
    """Each hit takes a reference. Returns (how many were candidates before, the first
    position whose block does not hold ``ns_keys`` at it, or -1)."""
    ref: cython.p_int = ints(checker.ref)
    key: cython.p_longlong = llongs(checker.key)
    n: cython.Py_ssize_t = checker.num_blocks
    num_keys: cython.Py_ssize_t = len(ns_keys)
    num_unpinned: cython.Py_ssize_t = 0
    bad: cython.Py_ssize_t = -1
    i: cython.Py_ssize_t
    b: cython.Py_ssize_t
    for i in range(len(hits)):
        b = hits[i]
        if not 0 <= b < n:
            raise IndexError(f"hit block {b} is outside the pool of {n}")
        if bad < 0:
            if i >= num_keys:
                raise IndexError(f"hit position {i} has no key ({num_keys} given)")
            if key[b] != cython.cast(cython.longlong, ns_keys[i]):
                bad = i
        if ref[b] == 0:
            num_unpinned += 1
        ref[b] += 1
    return num_unpinned, bad


def pin_new(checker: InvariantChecker, new_blocks: list) -> tuple:
    """Each newly allocated block takes a reference; it must have been free of both
    references and content. Returns (how many were not, the first of them or -1, whether
    that one was pinned)."""
    no_key: cython.longlong = NO_KEY
    ref: cython.p_int = ints(checker.ref)
    key: cython.p_longlong = llongs(checker.key)
    n: cython.Py_ssize_t = checker.num_blocks
    num_bad: cython.Py_ssize_t = 0
    bad: cython.Py_ssize_t = -1
    was_pinned: cython.bint = False
    i: cython.Py_ssize_t
    b: cython.Py_ssize_t
    for i in range(len(new_blocks)):
        b = new_blocks[i]
        if not 0 <= b < n:
            raise IndexError(f"new block {b} is outside the pool of {n}")
        if ref[b] != 0 or key[b] != no_key:
            if bad < 0:
                bad = i
                was_pinned = ref[b] != 0
            num_bad += 1
        ref[b] += 1
    return num_bad, bad, was_pinned


def cache_keys(checker: InvariantChecker, cached: list) -> cython.void:
    """Each (block, key) of ``cached`` now holds that content: one more resident copy of
    the key, counted in the flat slots (a slot another namespace owns, and a key from
    ``opaque_keys_from`` up, in the dict), or by ``add_copy`` without a parent table."""
    child: cython.longlong = _CHILD
    copies: cython.longlong = _COPIES
    if checker.parent_table is None:
        for b, k in cached:
            checker.key[b] = k
            checker.add_copy(k)
        return
    key: cython.p_longlong = llongs(checker.key)
    table: cython.p_longlong = llongs(checker.parent_table)
    rns: cython.p_int = ints(checker.res_ns)
    cnt: cython.p_longlong = llongs(checker.res_cnt)
    res: dict = checker.res
    shift: cython.int = checker.key_shift
    mask: cython.longlong = (cython.cast(cython.longlong, 1) << shift) - 1
    all_tabled: cython.bint = checker.opaque_keys_from > _ALL_TABLED
    opaque: cython.longlong = 0 if all_tabled else checker.opaque_keys_from
    orphans: cython.Py_ssize_t = checker.num_orphans
    item: tuple
    b: cython.Py_ssize_t
    k: cython.longlong
    h: cython.longlong
    ns: cython.longlong
    p: cython.longlong
    o: cython.longlong
    v: cython.longlong
    n: cython.Py_ssize_t = checker.num_blocks
    for item in cached:
        b = item[0]
        k = item[1]
        if not 0 <= b < n:
            raise IndexError(f"cached block {b} is outside the pool of {n}")
        key[b] = k
        if not all_tabled and k >= opaque:  # no parent, no children: a count in the dict
            res[k] = res.get(k, 0) + 1
            continue
        h = k & mask
        ns = k >> shift
        p = table[h]
        if p >= 0:
            o = rns[p]
            if o == ns:
                v = cnt[p]
                cnt[p] = v + child
            elif o < 0:
                rns[p] = cython.cast(cython.int, ns)
                v = 0
                cnt[p] = child
            else:
                p |= ns << shift
                v = res.get(p, 0)
                res[p] = v + child
            if v & copies == 0:
                orphans += 1
        o = rns[h]
        if o == ns:
            v = cnt[h]
            cnt[h] = v + 1
        elif o < 0:
            rns[h] = cython.cast(cython.int, ns)
            v = 0
            cnt[h] = 1
        else:
            v = res.get(k, 0)
            res[k] = v + 1
        if v & copies == 0:
            orphans -= v >> 32
    checker.num_orphans = orphans


def evict_run(checker: InvariantChecker, blocks: list, start: cython.Py_ssize_t) -> tuple:
    """Victims that were candidates, from ``start``, each one resident copy less (a key
    the parent table does not cover through ``drop_copy``). Returns (how many it took,
    the index it stopped at): the first block that was no candidate, or len(blocks)."""
    no_key: cython.longlong = NO_KEY
    child: cython.longlong = _CHILD
    copies: cython.longlong = _COPIES
    ref: cython.p_int = ints(checker.ref)
    key: cython.p_longlong = llongs(checker.key)
    tabled: cython.bint = checker.parent_table is not None
    table: cython.p_longlong = llongs(checker.parent_table) if tabled else cython.NULL
    rns: cython.p_int = ints(checker.res_ns)
    cnt: cython.p_longlong = llongs(checker.res_cnt)
    res: dict = checker.res
    n: cython.Py_ssize_t = checker.num_blocks
    shift: cython.int = checker.key_shift
    mask: cython.longlong = (cython.cast(cython.longlong, 1) << shift) - 1
    all_tabled: cython.bint = checker.opaque_keys_from > _ALL_TABLED
    opaque: cython.longlong = 0 if all_tabled else checker.opaque_keys_from
    orphans: cython.Py_ssize_t = checker.num_orphans
    created: cython.Py_ssize_t = checker.orphans_created
    i: cython.Py_ssize_t = start
    num: cython.Py_ssize_t = len(blocks)
    b: cython.Py_ssize_t
    k: cython.longlong
    h: cython.longlong
    ns: cython.longlong
    p: cython.longlong
    c: cython.longlong
    while i < num:
        b = blocks[i]
        if not 0 < b < n:
            break
        k = key[b]
        if ref[b] != 0 or k == no_key:
            break
        key[b] = no_key
        i += 1
        if not tabled or (not all_tabled and k >= opaque):
            checker.num_orphans = orphans    # its general form, the counters handed over
            checker.orphans_created = created
            checker.drop_copy(k)
            orphans = checker.num_orphans
            created = checker.orphans_created
            ref = ints(checker.ref)          # a call into Python may have replaced them
            key = llongs(checker.key)
            rns = ints(checker.res_ns)
            cnt = llongs(checker.res_cnt)
            if tabled:
                table = llongs(checker.parent_table)
            continue
        h = k & mask
        ns = k >> shift
        p = table[h]
        if p >= 0:
            if rns[p] == ns:
                c = cnt[p] - child
                cnt[p] = c
            else:
                p |= ns << shift
                c = res[p] - child
                if c:
                    res[p] = c
                else:
                    del res[p]
            if c & copies == 0:
                orphans -= 1
        if rns[h] == ns:
            c = cnt[h] - 1
            cnt[h] = c
        else:
            c = res[k] - 1
            if c:
                res[k] = c
            else:
                del res[k]
        if c & copies == 0:
            orphans += c >> 32
            created += c >> 32
    num = i - start
    checker.num_orphans = orphans
    checker.orphans_created = created
    checker.num_candidates -= num
    checker.num_resident -= num
    return num, i


def release(checker: InvariantChecker, blocks: list) -> cython.void:
    """Each block loses a reference; one left with none is free (no content) or a
    candidate (cached)."""
    no_key: cython.longlong = NO_KEY
    ref: cython.p_int = ints(checker.ref)
    key: cython.p_longlong = llongs(checker.key)
    n: cython.Py_ssize_t = checker.num_blocks
    num_free: cython.Py_ssize_t = 0
    num_cand: cython.Py_ssize_t = 0
    b: cython.Py_ssize_t
    for b in blocks:
        if not 0 <= b < n:
            raise IndexError(f"released block {b} is outside the pool of {n}")
        ref[b] -= 1
        if ref[b] == 0:
            if key[b] == no_key:
                num_free += 1
            else:
                num_cand += 1
    checker.num_resident -= num_free
    checker.num_candidates += num_cand


def num_keys_from(cached: list, first: cython.longlong) -> cython.Py_ssize_t:
    """How many of a batch's (block, key) pairs have a key from ``first`` up: with the
    engines' key layout, those holding generated tokens (``OUTPUT_KEY_BIT``), which the
    auditors take as an engine-side fact, not the policy's count."""
    num: cython.Py_ssize_t = 0
    for item in cached:
        if cython.cast(cython.longlong, item[1]) >= first:
            num += 1
    return num
