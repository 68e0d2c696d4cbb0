"""Per-group admission history: the last ``bound`` distinct logical prefixes each group
materialized, an LRU set per group.

    contains(g, key):  was key among g's last ``bound`` distinct prefixes?
    touch(g, key):     key becomes g's most recent; the least recent beyond ``bound`` leaves

It lives as long as the trace, so it is kept compact. Every touch takes the next stamp
from one counter and is appended, as (key, stamp), to its group's queue (two int64
arrays); a key's current stamp says whether it is present (-1: not) and which of its
queue entries is live, the others being stale. Dropping the least recent key pops
stale entries off the front until the live one; a queue is compacted when its stale
entries outnumber its live ones.

Where the engine's content keys are ``(namespace << key_shift) | hash index`` with
namespaces that never span groups (``PoolInfo.key_shift``), a key's stamp sits in a flat
slot per hash index, owned by the first namespace to use it (12 bytes per distinct
hash); other keys, labels (given negative ids), keys from ``OPAQUE_KEYS_FROM`` up (blocks
of generated tokens, which name no trace hash) and every key without that layout are in a
dict keyed by (group, key). The order and the verdicts are exactly those of one
OrderedDict per group.

The module is written in Cython's pure-Python mode and is its own source: ``pip install``
compiles it (``history.pxd`` declares :class:`PrefixHistory`'s fields, so the batch forms
``contains_keys`` and ``touch_keys`` run as C loops over the slots), and without a
compiler it runs as written.
"""

try:
    import cython
except ImportError:
    from psgate import cython_shadow as cython

from array import array

if not cython.compiled:     # compiled, history.pxd cimports them
    from psgate.flat import append_llong, ints, llongs

# A queue with more stale entries than this, and than twice its live ones, is compacted.
COMPACT_MIN = 1024
# Engines key a block that holds no trace hash (a full block of a prompt's tail and generated
# tokens) from here up (psgate.trace.keys.OUTPUT_KEY_BIT): its low bits index no hash table.
OPAQUE_KEYS_FROM = 1 << 62
# A slot stores its owner's namespace as an int32: keys whose namespace does not fit one
# (possible with a small key_shift) are kept in the dict.
_MAX_SLOT_NS = 2**31 - 1


@cython.annotation_typing(False)     # the annotations are Python's; history.pxd types it
class PrefixHistory:
    """Per group (``add_group`` gives its id), the last ``bound`` distinct keys touched:
    ``contains(g, key)`` and ``touch(g, key)`` (the module docstring has the layout).
    ``compact_min`` (``COMPACT_MIN``) is how many stale entries a queue may hold before
    it is compacted; only tests lower it."""

    def __init__(self, bound: int, key_shift: int | None = None) -> None:
        self.bound = bound
        self.shift = key_shift
        self.mask = (1 << key_shift) - 1 if key_shift is not None else 0
        # keys from 0 up to this have a slot: not opaque, their namespace an int32
        self.slotted_below = (0 if key_shift is None
                              else min(OPAQUE_KEYS_FROM, (_MAX_SLOT_NS + 1) << key_shift))
        self.slot_ns = array("i")         # per hash index: the namespace owning it, or -1
        self.slot_stamp = array("q")      # per hash index: its key's stamp, or -1
        self.other = {}                   # (group, key): stamp, for keys without a slot
        self.clock = 0
        self.label_ids = {}               # a label's key: -2, -3, ...
        self.label_names = []
        self.keys = []                    # per group: queued keys, an array('q')
        self.stamps = []                  # per group: the stamp of each queued entry
        self.head = []                    # per group: index of the first unpopped entry
        self.num_live = []
        self.compact_min = COMPACT_MIN

    def add_group(self) -> int:
        self.keys.append(array("q"))
        self.stamps.append(array("q"))
        self.head.append(0)
        self.num_live.append(0)
        return len(self.keys) - 1

    # -- stamps ---------------------------------------------------------------------
    def key_of(self, prefix) -> int:
        """An int key for a prefix: content keys are their own, labels get negative ids."""
        if type(prefix) is int:
            return prefix
        k = self.label_ids.get(prefix)
        if k is None:
            k = -2 - len(self.label_names)
            self.label_ids[prefix] = k
            self.label_names.append(prefix)
        return k

    def _slot(self, key: int) -> int:
        """The slot index of key, claiming a free one; -1 when key has none."""
        if key < 0 or key >= self.slotted_below:
            return -1
        shift = cython.declare(cython.int, self.shift)
        h = cython.declare(cython.Py_ssize_t, key & self.mask)
        ns = cython.declare(cython.longlong, key >> shift)
        if h >= len(self.slot_ns):
            self.grow_slots(h)
        if h >= len(self.slot_ns) or h >= len(self.slot_stamp):
            raise IndexError(f"slot {h} is beyond the history's slot arrays")
        sns = ints(self.slot_ns)
        o = cython.declare(cython.int, sns[h])
        if o == ns:
            return h
        if o < 0:
            sns[h] = ns
            return h
        return -1

    def grow_slots(self, h: int) -> None:
        """Slots up to index h at least (by half the current size, at least). Low level,
        as are stamp, set_stamp and compact: a policy calls contains and touch."""
        more = max(h + 1 - len(self.slot_ns), len(self.slot_ns) // 2)
        self.slot_ns.extend(array("i", [-1]) * more)
        self.slot_stamp.extend(array("q", [-1]) * more)

    def stamp(self, g: int, key: int) -> int:
        """key's stamp in g: the clock value of its last touch, -1 where it is not there."""
        h = cython.declare(cython.Py_ssize_t, self._slot(key))
        if h >= 0:
            return llongs(self.slot_stamp)[h]
        return self.other.get((g, key), -1)

    def set_stamp(self, g: int, key: int, stamp: int) -> None:
        """key's stamp in g (-1: it leaves), for a caller that keeps g's queue itself."""
        h = cython.declare(cython.Py_ssize_t, self._slot(key))
        if h >= 0:
            llongs(self.slot_stamp)[h] = stamp
        elif stamp >= 0:
            self.other[(g, key)] = stamp
        else:
            self.other.pop((g, key), None)

    # -- the LRU set ----------------------------------------------------------------
    def contains(self, g: int, prefix) -> bool:
        return self.stamp(g, self.key_of(prefix)) >= 0

    def touch(self, g: int, prefix) -> None:
        self.touch_keys(g, [self.key_of(prefix)])

    def contains_keys(self, g: int, keys: list[int]) -> list[bool]:
        """contains(g, k) for int keys (content keys, mostly), in one call."""
        if self.shift is None:
            other = self.other
            return [other.get((g, k), -1) >= 0 for k in keys]
        shift = cython.declare(cython.int, self.shift)
        mask = cython.declare(cython.longlong, self.mask)
        slotted_below = cython.declare(cython.longlong, self.slotted_below)
        sns = ints(self.slot_ns)
        sst = llongs(self.slot_stamp)
        n = cython.declare(cython.Py_ssize_t, min(len(self.slot_ns), len(self.slot_stamp)))
        k = cython.declare(cython.longlong)
        h = cython.declare(cython.longlong)
        o = cython.declare(cython.longlong)
        out = []
        for key in keys:
            k = key
            if 0 <= k < slotted_below:
                h = k & mask
                o = sns[h] if h < n else -1
                if o == k >> shift:                   # k's namespace owns the slot
                    out.append(sst[h] >= 0)
                    continue
                if o < 0:                             # no namespace does: never stored
                    out.append(False)
                    continue
            out.append(self.stamp(g, k) >= 0)         # in the dict, if anywhere
            sns = ints(self.slot_ns)                  # a call into Python: again
            sst = llongs(self.slot_stamp)
            n = min(len(self.slot_ns), len(self.slot_stamp))
        return out

    def touch_keys(self, g: int, keys: list[int]) -> None:
        """touch(g, k) for each int key in order, in one call."""
        qk = self.keys[g]
        qs = self.stamps[g]
        slotted_below = cython.declare(cython.longlong, self.slotted_below)
        shift = cython.declare(cython.int, self.shift if self.shift is not None else 0)
        mask = cython.declare(cython.longlong, self.mask)
        k = cython.declare(cython.longlong)
        h = cython.declare(cython.longlong, 0)
        top = cython.declare(cython.longlong, 0)
        was = cython.declare(cython.longlong)
        slotted = cython.declare(cython.bint, self.shift is not None)
        if slotted:
            for key in keys:
                k = key
                if 0 <= k < slotted_below and k & mask > top:
                    top = k & mask
            if top >= len(self.slot_ns):
                self.grow_slots(top)
            if top >= len(self.slot_ns) or top >= len(self.slot_stamp):
                raise IndexError(f"slot {top} is beyond the history's slot arrays")
        sns = ints(self.slot_ns)
        sst = llongs(self.slot_stamp)
        bound = cython.declare(cython.longlong, self.bound)
        compact_min = cython.declare(cython.Py_ssize_t, self.compact_min)
        # the clock and g's live count and queue head, held here and handed back to the
        # fields around the calls that read or move them and at the end
        clock = cython.declare(cython.longlong, self.clock)
        live = cython.declare(cython.Py_ssize_t, self.num_live[g])
        first = cython.declare(cython.Py_ssize_t, self.head[g])
        try:
            for key in keys:
                k = key
                if 0 <= k < slotted_below:
                    h = k & mask
                if 0 <= k < slotted_below and (sns[h] == k >> shift or sns[h] < 0):
                    sns[h] = k >> shift
                    was = sst[h]
                    sst[h] = clock
                else:
                    was = self.stamp(g, k)
                    self.set_stamp(g, k, clock)
                    sns = ints(self.slot_ns)
                    sst = llongs(self.slot_stamp)
                append_llong(qk, k)
                append_llong(qs, clock)
                clock += 1
                if was < 0:
                    live += 1
                    if live <= bound:
                        continue
                    self.clock = clock
                    self.num_live[g] = live
                    self._drop_oldest(g)
                elif len(qk) - first > 2 * live + compact_min:
                    self.clock = clock
                    self.num_live[g] = live
                    self.compact(g)
                else:
                    continue
                qk = self.keys[g]                     # a compaction replaces them
                qs = self.stamps[g]
                live = self.num_live[g]
                first = self.head[g]
                sns = ints(self.slot_ns)
                sst = llongs(self.slot_stamp)
        finally:
            self.clock = clock
            self.num_live[g] = live

    def _drop_oldest(self, g: int) -> None:
        """The least recent live key of g leaves (stale entries before it are skipped)."""
        keys = self.keys[g]
        n = cython.declare(cython.Py_ssize_t, len(keys))
        qk = llongs(keys)
        qs = llongs(self.stamps[g])
        i = cython.declare(cython.Py_ssize_t, self.head[g])
        st = cython.declare(cython.longlong)
        while True:
            if i >= n or i < 0:
                raise IndexError(f"group {g}'s queue has no live entry from {self.head[g]}")
            st = _slot_stamp(self, qk[i])
            if st == -2:
                st = self.stamp(g, qk[i])
            if st == qs[i]:
                break
            i += 1                                    # stale: touched again since
        self.set_stamp(g, qk[i], -1)
        self.num_live[g] -= 1
        self.head[g] = i + 1
        if i + 1 > self.compact_min and i + 1 > n // 2:
            self.compact(g)

    def compact(self, g: int) -> None:
        """Keep only g's live entries, in order (touch does, when stale ones outnumber
        them)."""
        keys = self.keys[g]
        stamps = self.stamps[g]
        n = cython.declare(cython.Py_ssize_t, len(keys))
        qk = llongs(keys)
        qs = llongs(stamps)
        i = cython.declare(cython.Py_ssize_t)
        m = cython.declare(cython.Py_ssize_t, 0)
        st = cython.declare(cython.longlong)
        nk = array("q", [0]) * (n - self.head[g])      # room for every entry; trimmed
        nst = array("q", [0]) * (n - self.head[g])
        pk = llongs(nk)
        ps = llongs(nst)
        for i in range(self.head[g], n):
            st = _slot_stamp(self, qk[i])
            if st == -2:
                st = self.stamp(g, qk[i])
            if st == qs[i]:
                pk[m] = qk[i]
                ps[m] = st
                m += 1
        del nk[m:]
        del nst[m:]
        self.keys[g] = nk
        self.stamps[g] = nst
        self.head[g] = 0

    def items(self, g: int) -> list:
        """g's prefixes, least recent first (for tests and explain, not hot paths)."""
        keys, stamps = self.keys[g], self.stamps[g]
        return [keys[i] if keys[i] >= 0 else self.label_names[-2 - keys[i]]
                for i in range(self.head[g], len(keys)) if self.stamp(g, keys[i]) == stamps[i]]


def _slot_stamp(hist: PrefixHistory, k: cython.longlong) -> cython.longlong:
    """k's stamp read from its slot where k's namespace owns one (a queued key that has a
    slot has claimed it); -2 where it does not: ask ``hist.stamp()``."""
    if k < 0 or k >= hist.slotted_below:
        return -2
    shift: cython.int = hist.shift
    h: cython.Py_ssize_t = k & hist.mask
    if (h < len(hist.slot_ns) and h < len(hist.slot_stamp)
            and ints(hist.slot_ns)[h] == k >> shift):
        return llongs(hist.slot_stamp)[h]
    return -2
