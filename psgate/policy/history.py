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
"""

from __future__ import annotations

from array import array

from psgate import core

_COMPACT_MIN = 1024
# Engines key a block that holds no trace hash (a full block of a prompt's tail and generated
# tokens) from here up (psgate.trace.keys.OUTPUT_KEY_BIT): its low bits index no hash table.
OPAQUE_KEYS_FROM = 1 << 62


class PrefixHistory:
    """Per group (``add_group`` gives its id), the last ``bound`` distinct keys touched:
    ``contains(g, key)`` and ``touch(g, key)`` (the module docstring has the layout)."""

    def __init__(self, bound: int, key_shift: int | None = None) -> None:
        self.bound = bound
        self.shift = key_shift
        self.mask = (1 << key_shift) - 1 if key_shift is not None else 0
        self.slot_ns = array("i")
        self.slot_stamp = array("q")
        self.other: dict[tuple[int, int], int] = {}
        self.clock = 0
        self.label_ids: dict[str, int] = {}   # a label's key: -2, -3, ...
        self.label_names: list[str] = []
        self.keys: list[array] = []       # per group: queued keys
        self.stamps: list[array] = []     # per group: the stamp of each queued entry
        self.head: list[int] = []         # per group: index of the first unpopped entry
        self.num_live: list[int] = []
        # the compiled forms of contains_keys and touch_keys (psgate.core), or None
        self._kernels = core.get()

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

    def _slot(self, key) -> int:
        """The slot index of key, claiming a free one; -1 when key has none."""
        if self.shift is None or key < 0 or key >= OPAQUE_KEYS_FROM:
            return -1
        h = key & self.mask
        ns = key >> self.shift
        if h >= len(self.slot_ns):
            self.grow_slots(h)
        o = self.slot_ns[h]
        if o == ns:
            return h
        if o < 0:
            self.slot_ns[h] = ns
            return h
        return -1

    def grow_slots(self, h: int) -> None:
        """Slots up to index h at least (by half the current size, at least). Low level,
        as are stamp, set_stamp and compact: the compiled loops' primitives; a policy
        calls contains and touch."""
        more = max(h + 1 - len(self.slot_ns), len(self.slot_ns) // 2)
        self.slot_ns.extend(array("i", [-1]) * more)
        self.slot_stamp.extend(array("q", [-1]) * more)

    def stamp(self, g: int, key: int) -> int:
        """key's stamp in g: the clock value of its last touch, -1 where it is not there."""
        h = self._slot(key)
        return self.slot_stamp[h] if h >= 0 else self.other.get((g, key), -1)

    def set_stamp(self, g: int, key: int, stamp: int) -> None:
        """key's stamp in g (-1: it leaves), for a caller that keeps g's queue itself."""
        h = self._slot(key)
        if h >= 0:
            self.slot_stamp[h] = stamp
        elif stamp >= 0:
            self.other[(g, key)] = stamp
        else:
            self.other.pop((g, key), None)

    # -- the LRU set ----------------------------------------------------------------
    def contains(self, g: int, prefix) -> bool:
        return self.stamp(g, self.key_of(prefix)) >= 0

    def touch(self, g: int, prefix) -> None:
        key = self.key_of(prefix)
        was = self.stamp(g, key)
        stamp = self.clock
        self.clock += 1
        self.set_stamp(g, key, stamp)
        self.keys[g].append(key)
        self.stamps[g].append(stamp)
        if was < 0:
            self.num_live[g] += 1
            if self.num_live[g] > self.bound:
                self._drop_oldest(g)
        elif len(self.keys[g]) - self.head[g] > 2 * self.num_live[g] + _COMPACT_MIN:
            self.compact(g)

    def contains_keys(self, g: int, keys: list[int]) -> list[bool]:
        """contains(g, k) for content keys, in one call."""
        if self._kernels is not None and self.shift is not None and type(keys) is list:
            out = self._kernels.history_contains_keys(self, g, keys)
            if out is not None:         # None: a key the compiled form does not take
                return out
        return self._contains_keys(g, keys)

    def _contains_keys(self, g: int, keys: list[int]) -> list[bool]:
        shift = self.shift
        if shift is None:
            other = self.other
            return [other.get((g, k), -1) >= 0 for k in keys]
        mask, sns, sst = self.mask, self.slot_ns, self.slot_stamp
        out = []
        n = len(sns)
        for k in keys:
            if k >= OPAQUE_KEYS_FROM:
                out.append(self.other.get((g, k), -1) >= 0)
                continue
            h = k & mask
            o = sns[h] if h < n else -1
            if o == k >> shift:                               # _stamp, inline
                out.append(sst[h] >= 0)
            elif o < 0:
                out.append(False)         # an unclaimed slot: the key was never stored
            else:
                out.append(self.stamp(g, k) >= 0)
        return out

    def touch_keys(self, g: int, keys: list[int]) -> None:
        """touch(g, k) for each content key in order, in one call."""
        if (self._kernels is not None and self.shift is not None and type(keys) is list
                and self._kernels.history_touch_keys(self, g, keys)):
            return                      # False: a key the compiled form does not take
        self._touch_keys(g, keys)

    def _touch_keys(self, g: int, keys: list[int]) -> None:
        shift = self.shift
        if shift is None:
            for k in keys:
                self.touch(g, k)
            return
        mask = self.mask
        top = max((k & mask for k in keys if k < OPAQUE_KEYS_FROM), default=0)
        if top >= len(self.slot_ns):
            self.grow_slots(top)
        sns, sst = self.slot_ns, self.slot_stamp
        qk, qs = self.keys[g], self.stamps[g]
        for k in keys:
            h = k & mask
            ns = k >> shift
            if k < OPAQUE_KEYS_FROM and (sns[h] == ns or sns[h] < 0):   # _set_stamp, inline
                sns[h] = ns
                was = sst[h]
                sst[h] = self.clock
            else:
                was = self.stamp(g, k)
                self.set_stamp(g, k, self.clock)
            qk.append(k)
            qs.append(self.clock)
            self.clock += 1
            if was < 0:
                self.num_live[g] += 1
                if self.num_live[g] > self.bound:
                    self._drop_oldest(g)
                    qk, qs = self.keys[g], self.stamps[g]     # a compaction replaces them
            elif len(qk) - self.head[g] > 2 * self.num_live[g] + _COMPACT_MIN:
                self.compact(g)
                qk, qs = self.keys[g], self.stamps[g]

    def _drop_oldest(self, g: int) -> None:
        keys, stamps = self.keys[g], self.stamps[g]
        i = self.head[g]
        while self.stamp(g, keys[i]) != stamps[i]:      # stale: touched again since
            i += 1
        self.set_stamp(g, keys[i], -1)
        self.num_live[g] -= 1
        self.head[g] = i + 1
        if i + 1 > _COMPACT_MIN and i + 1 > len(keys) // 2:
            self.compact(g)

    def compact(self, g: int) -> None:
        """Keep only g's live entries, in order (touch does, when stale ones outnumber
        them)."""
        if self._kernels is not None and self.shift is not None:
            self._kernels.history_compact(self, g)
            return
        keys, stamps = self.keys[g], self.stamps[g]
        live = [i for i in range(self.head[g], len(keys))
                if self.stamp(g, keys[i]) == stamps[i]]
        self.keys[g] = array("q", [keys[i] for i in live])
        self.stamps[g] = array("q", [stamps[i] for i in live])
        self.head[g] = 0

    def items(self, g: int) -> list:
        """g's prefixes, least recent first (for tests and explain, not hot paths)."""
        keys, stamps = self.keys[g], self.stamps[g]
        return [keys[i] if keys[i] >= 0 else self.label_names[-2 - keys[i]]
                for i in range(self.head[g], len(keys)) if self.stamp(g, keys[i]) == stamps[i]]
