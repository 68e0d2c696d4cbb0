"""The block pool: per-block state, the free queue and the content index.

Facts checked against vLLM 0.32's ``BlockPool`` (block_pool.py):
  - block 0 is the null block: N configured blocks give N-1 usable ones;
  - the free queue is [truly free blocks ... | cached candidates ...]: a freed request's
    uncached blocks are prepended (its last block frontmost), its cached ones appended
    (last block first); allocation pops from the front, so truly free blocks are used
    first and candidates are evicted in the policy's order. Here the truly free part is
    :attr:`BlockPool.free` and the candidate part is the eviction policy's own structure;
  - one content key may be held by several blocks (after a recompute of a block another
    request still holds) and a lookup takes the earliest inserted
    (``get_cached_block``, block_pool.py).

The state is flat arrays (a few bytes a block), not objects, and the content index keeps
one slot per trace hash, so a lookup is two array reads and no dict. Every engine built on
psgate's bookkeeping (the service model, the step scheduler, and the vLLM engines, which
mirror vLLM's pool into these arrays for the invariant checker) inherits this class. The
loops over these arrays are in ``pool_work.py``, compiled where a compiler was.
"""

from __future__ import annotations

from array import array

from psgate.invariants.checker import NO_KEY
from psgate.trace.keys import HASH_MASK, KEY_SHIFT, OUTPUT_KEY_BIT, content_key
from psgate.trace.reader import HashTable


# Block ids are signed 32-bit in every per-block array (the pool's, the checker's and the
# policies'), so a pool has at most 2^31 - 1 configured blocks.
MAX_BLOCKS = 2**31 - 1


class BlockPool:
    """``num_blocks`` blocks: who pins each (``ref``), what it holds (``key``), which group
    it is charged to (``owner``), the truly free ones (``free``) and where each content key
    is cached (the index)."""

    def __init__(self, capacity: int, hashes: HashTable) -> None:
        n = capacity
        self.hashes = hashes
        self.num_blocks = n
        self.num_usable = n - 1
        self.ref = array("i", [0]) * n
        self.key = array("q", [NO_KEY]) * n
        self.owner = array("i", [-1]) * n
        # Truly free blocks, a stack whose end is the front; block 0 (null) is never in it.
        self.free = array("i", range(n - 1, 0, -1))
        # Content key -> blocks holding it, earliest inserted first (a lookup takes that
        # one). A trace hash's slot belongs to the first namespace that caches it: its
        # earliest block, and whether its content was lost (evicted, no copy left). Later
        # copies, and keys of other namespaces, live in small dicts.
        self.grow_slots()
        self.more: dict[int, list[int]] = {}          # slot key -> later copies
        self.other: dict[int, list[int]] = {}         # other namespaces' key -> copies
        self.other_lost: set[int] = set()
        # Output key (trace/keys.py: output_key) -> blocks holding it, earliest first.
        # Nothing remembers an output key once its last copy is gone (only prompt content
        # counts as recomputed), so what is kept is bounded by the pool, not the trace.
        self.out_copies: dict[int, list[int]] = {}

    def grow_slots(self) -> None:
        """A slot for every trace hash (the table grows while the trace is read)."""
        have = len(getattr(self, "slot_ns", ()))
        more = len(self.hashes.names) - have
        if have == 0:
            self.slot_ns = array("i")
            self.slot_blk = array("i")
            self.slot_lost = bytearray()
        if more > 0:
            self.slot_ns.extend(array("i", [-1]) * more)
            self.slot_blk.extend(array("i", [-1]) * more)
            self.slot_lost.extend(bytes(more))

    def copies_of(self, ns: int, hid: int) -> list[int]:
        """Every block holding (ns, hid), earliest inserted first."""
        if self.slot_ns[hid] == ns:
            b = self.slot_blk[hid]
            return [] if b < 0 else [b] + self.more.get(content_key(ns, hid), [])
        return list(self.other.get(content_key(ns, hid), ()))

    def first_copy(self, k: int) -> int:
        """The block a lookup of k takes (the earliest inserted copy), or -1."""
        if k >= OUTPUT_KEY_BIT:
            v = self.out_copies.get(k)
            return v[0] if v else -1
        h = k & HASH_MASK
        if self.slot_ns[h] == k >> KEY_SHIFT:
            return self.slot_blk[h]
        v = self.other.get(k)
        return v[0] if v else -1

    def index_add(self, k: int, b: int) -> bool:
        """Block b now holds content k; True when k had been lost (a recompute)."""
        if k >= OUTPUT_KEY_BIT:
            self.out_copies.setdefault(k, []).append(b)
            return False
        h = k & HASH_MASK
        ns = k >> KEY_SHIFT
        o = self.slot_ns[h]
        if o < 0:
            self.slot_ns[h] = ns
            o = ns
        if o == ns:
            if self.slot_blk[h] < 0:
                self.slot_blk[h] = b
            else:
                self.more.setdefault(k, []).append(b)
            if self.slot_lost[h]:
                self.slot_lost[h] = 0
                return True
            return False
        self.other.setdefault(k, []).append(b)
        if k in self.other_lost:
            self.other_lost.discard(k)
            return True
        return False

    def index_drop(self, k: int, b: int) -> None:
        """Block b no longer holds content k; with no copy left, k is lost."""
        if k >= OUTPUT_KEY_BIT:
            copies = self.out_copies[k]
            copies.remove(b)
            if not copies:
                del self.out_copies[k]
            return
        h = k & HASH_MASK
        if self.slot_ns[h] == k >> KEY_SHIFT:
            later = self.more.get(k)
            if self.slot_blk[h] == b:
                if later:
                    self.slot_blk[h] = later.pop(0)
                else:
                    self.slot_blk[h] = -1
                    self.slot_lost[h] = 1
            else:
                later.remove(b)
            if later is not None and not later:
                del self.more[k]
            return
        copies = self.other[k]
        copies.remove(b)
        if not copies:
            del self.other[k]
            self.other_lost.add(k)
