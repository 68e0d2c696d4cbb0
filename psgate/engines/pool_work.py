"""The block pool's per-block loops, over the flat arrays of :class:`BlockPool`.

    lookup(evb, ns, num):    the longest run of evb's first num hashes cached in ns,
                             each its earliest copy: (hit blocks, how many are unpinned)
    cache_blocks(start..stop): each block takes its content key (a trace hash of ns, or
                             past the chain the request's own output key), is indexed,
                             and is given to the policy's on_cached; -> tokens recomputed
    touch(hits):             each hit gains a reference; one that was a candidate leaves
                             the policy's queue (vLLM's touch)
    take_free(num):          up to num truly free blocks, from the free queue's front
    pin_allocated(new, g):   each new block pinned by its request, owned by group g
    release(blocks):         in vLLM's free order, each loses a reference; unpinned
                             ones are (uncached -> free queue, cached -> the policy)
    drop_evicted(victims):   each victim's content dropped from the index, counted per
                             owner; stops at the first one that is no candidate

Every engine on psgate's own pool (the service model ``sim.py``, the step scheduler
``sched.py`` and the hybrid model) runs these. An allocation batch's engine-level steps
are here too, as functions of the engine that :class:`~psgate.engines.base.ReplayEngine`
takes as its methods (compiled, they bind as Python functions do): ``touch``
(``take_hits``), ``get_new_blocks``, ``evicted_batch``, ``check_batch`` and
``free_in_order``. They call one another as C functions, so an engine cannot override
one of them alone: ``ReplayEngine`` refuses a subclass that tries.

The module is written in Cython's pure-Python mode and is their only source: ``pip
install`` compiles it (``pool_work.pxd`` gives the types, so the loops index the arrays
as C arrays), and without a compiler it runs as written. Compiled, the pool's per-block
state must be the flat arrays (``array('i')``/``array('q')``/``bytearray``) that
:class:`BlockPool` makes; the vLLM engines, whose reference counts are vLLM's own, keep
their own paths.
"""

import functools
from array import array

try:
    import cython
except ImportError:
    from psgate import cython_shadow as cython

if not cython.compiled:     # compiled, pool_work.pxd cimports them
    from psgate.flat import byte_items, ints, llongs

from psgate.invariants.checker import NO_KEY, InvariantChecker
from psgate.trace.keys import HASH_MASK, KEY_SHIFT, OUTPUT_KEY_BIT


@cython.cclass
class CachedHook:
    """A policy's ``on_cached`` that the loops call as a C method: a compiled policy
    state derives from this and gives ``block_cached``; its bound ``cached`` is the
    policy's on_cached. Any other on_cached is called as Python."""

    def cached(self, block, req, pos, parent, key=-1):
        """on_cached(block, req, pos, parent, key)."""
        self.block_cached(block, pos, parent, key, req.num_prompt_blocks)

    def block_cached(self, block, pos, parent, key, num_prompt):
        """Block ``block`` (position ``pos``, after ``parent``) now holds ``key``; the
        request has ``num_prompt`` prompt blocks."""
        raise TypeError(f"{type(self).__name__} gives no block_cached")


def lookup(pool, evb: list, ns: cython.int, num: cython.Py_ssize_t) -> tuple:
    """vLLM's ``get_computed_blocks`` over a request's trace hashes ``evb`` in namespace
    ``ns``: the longest run of the first ``num`` that are cached, each its earliest copy
    (``get_cached_block``), and how many of those blocks are unpinned (candidates)."""
    shift: cython.int = KEY_SHIFT
    num_slots: cython.Py_ssize_t = len(pool.slot_ns)
    slot_ns: cython.p_int = ints(pool.slot_ns)
    slot_blk: cython.p_int = ints(pool.slot_blk)
    ref: cython.p_int = ints(pool.ref)
    other: dict = pool.other
    base: cython.longlong = cython.cast(cython.longlong, ns) << shift
    hits: list = []
    num_evictable: cython.Py_ssize_t = 0
    pos: cython.Py_ssize_t
    h: cython.longlong
    b: cython.int
    if num > len(evb):
        num = len(evb)
    for pos in range(num):
        h = evb[pos]
        if h >= num_slots:          # the trace's hash table grew since the last lookup
            pool.grow_slots()
            num_slots = len(pool.slot_ns)
            slot_ns = ints(pool.slot_ns)
            slot_blk = ints(pool.slot_blk)
        if not 0 <= h < num_slots:
            raise IndexError(f"trace hash {h} has no slot in the pool ({num_slots})")
        if slot_ns[h] == ns:
            b = slot_blk[h]
            if b < 0:
                break
        else:
            v = other.get(base | h)
            if not v:
                break
            b = v[0]
        hits.append(b)
        if ref[b] == 0:
            num_evictable += 1
    return hits, num_evictable


def cache_blocks(pool, blocks: list, evb: list, start: cython.Py_ssize_t,
                 stop: cython.Py_ssize_t, ns: cython.int, block_size: cython.longlong,
                 cached_now: list, on_cached, preq) -> cython.longlong:
    """Blocks ``start``..``stop`` of a request (positions in ``blocks``) now hold their
    content: at a position of ``evb`` its trace hash in namespace ``ns``, past them the
    request's own output key (``trace.keys.output_key``). Each block's key is set and
    indexed, (block, key) appended to ``cached_now`` and given to ``on_cached`` (the
    policy's hook, or None). Returns the tokens recomputed: content that had been lost
    (only trace content counts; an output key is its request's own)."""
    shift: cython.int = KEY_SHIFT
    out_bit: cython.longlong = OUTPUT_KEY_BIT
    num_chain: cython.Py_ssize_t = len(evb)
    base: cython.longlong = cython.cast(cython.longlong, ns) << shift
    index_add = pool.index_add
    key: cython.p_longlong = llongs(pool.key)
    slot_ns: cython.p_int = ints(pool.slot_ns)
    slot_blk: cython.p_int = ints(pool.slot_blk)
    slot_lost: cython.p_uchar = byte_items(pool.slot_lost)
    num_slots: cython.Py_ssize_t = len(pool.slot_ns)
    num_blocks: cython.Py_ssize_t = len(pool.key)
    recompute: cython.longlong = 0
    index: cython.longlong = -1
    num_prompt: cython.Py_ssize_t = 0
    hook: CachedHook = None
    pos: cython.Py_ssize_t
    h: cython.longlong
    k: cython.longlong
    b: cython.int
    o: cython.int
    parent: cython.int
    if on_cached is not None:
        owner = getattr(on_cached, "__self__", None)
        if isinstance(owner, CachedHook) and on_cached.__name__ == "cached":
            hook = owner                    # a compiled policy's own: a C call
            num_prompt = preq.num_prompt_blocks
    for pos in range(start, stop):
        b = blocks[pos]
        if not 0 <= b < num_blocks:
            raise IndexError(f"block {b} is outside the pool of {num_blocks}")
        if pos < num_chain:
            h = evb[pos]
            if h >= num_slots:      # the trace's hash table grew since the pool's slots
                pool.grow_slots()
                num_slots = len(pool.slot_ns)
                slot_ns, slot_blk = ints(pool.slot_ns), ints(pool.slot_blk)
                slot_lost = byte_items(pool.slot_lost)
            if not 0 <= h < num_slots:
                raise IndexError(f"trace hash {h} has no slot in the pool ({num_slots})")
            k = base | h
            key[b] = k
            o = slot_ns[h]
            if o == ns and slot_blk[h] < 0 and not slot_lost[h]:
                slot_blk[h] = b                             # index_add's common case
            elif o < 0:
                slot_ns[h] = ns
                slot_blk[h] = b
            else:
                if index_add(k, b):
                    recompute += block_size
                key, slot_ns, slot_blk = llongs(pool.key), ints(pool.slot_ns), ints(pool.slot_blk)
                slot_lost = byte_items(pool.slot_lost)
        else:
            if index < 0:
                index = preq.index
            k = out_bit | (index << 24) | pos
            index_add(k, b)
            key = llongs(pool.key)
            key[b] = k
        cached_now.append((b, k))
        parent = blocks[pos - 1] if pos else -1
        if hook is not None:
            hook.block_cached(b, pos, parent, k, num_prompt)
        elif on_cached is not None:
            on_cached(b, preq, pos, parent, k)
            key, slot_ns, slot_blk = llongs(pool.key), ints(pool.slot_ns), ints(pool.slot_blk)
            slot_lost = byte_items(pool.slot_lost)
    return recompute


def touch(pool, hits: list, queues, on_touch, on_hit, preq) -> cython.void:
    """vLLM's ``touch``: each hit gains a reference, and one that was a candidate leaves
    the policy's queue: unlinked here from ``queues`` (the policy's ``touch_queues``,
    which says that on_touch does only that), else through ``on_touch``. ``on_hit``, if
    given, is told of each hit with its position."""
    ref: cython.p_int = ints(pool.ref)
    num_blocks: cython.Py_ssize_t = len(pool.ref)
    nxt: cython.p_int = cython.NULL
    prv: cython.p_int = cython.NULL
    where: cython.p_int = cython.NULL
    sizes: list = None
    linked: cython.bint = queues is not None
    i: cython.Py_ssize_t
    b: cython.int
    p: cython.int
    n: cython.int
    q: cython.int
    if linked:
        nxt, prv, where = ints(queues.next), ints(queues.prev), ints(queues.where)
        sizes = queues.sizes
    for i in range(len(hits)):
        b = hits[i]
        if not 0 <= b < num_blocks:
            raise IndexError(f"hit block {b} is outside the pool of {num_blocks}")
        if ref[b] == 0:
            if linked and where[b] >= 0:
                q = where[b]
                p = prv[b]
                n = nxt[b]
                nxt[p] = n
                prv[n] = p
                where[b] = -1
                sizes[q] -= 1
            else:
                on_touch(b)
                ref = ints(pool.ref)
                if linked:
                    nxt, prv, where = ints(queues.next), ints(queues.prev), ints(queues.where)
        ref[b] += 1
        if on_hit is not None:
            on_hit(b, preq, i)
            ref = ints(pool.ref)
            if linked:
                nxt, prv, where = ints(queues.next), ints(queues.prev), ints(queues.where)


def take_free(pool, num: cython.Py_ssize_t) -> list:
    """Up to ``num`` truly free blocks from the front of the free queue (the end of
    ``pool.free``, a stack), front first: vLLM's ``popleft_n``."""
    free = pool.free
    fv: cython.p_int = ints(free)
    num_free: cython.Py_ssize_t = len(free)
    take: cython.Py_ssize_t = num if num < num_free else num_free
    if take <= 0:
        return []
    new: list = [fv[num_free - 1 - i] for i in range(take)]
    del free[num_free - take:]
    return new


def pin_allocated(pool, new: list, g: cython.int) -> cython.void:
    """The blocks an allocation hands out: each pinned by its request (one reference)
    and owned by the request's group ``g``."""
    ref: cython.p_int = ints(pool.ref)
    owner: cython.p_int = ints(pool.owner)
    num_blocks: cython.Py_ssize_t = len(pool.ref)
    i: cython.Py_ssize_t
    b: cython.int
    for i in range(len(new)):
        b = new[i]
        if not 0 <= b < num_blocks:
            raise IndexError(f"block {b} is outside the pool of {num_blocks}")
        ref[b] = 1
        owner[b] = g


def release(pool, blocks: list) -> tuple:
    """vLLM's ``free_blocks`` walk over ``blocks`` in the order given (a request's own
    blocks last first): each loses a reference; those left with none are (uncached,
    cached) in walk order. The uncached are no longer charged to anyone: returns them
    with {owner group: how many}."""
    no_key: cython.longlong = NO_KEY
    ref: cython.p_int = ints(pool.ref)
    key: cython.p_longlong = llongs(pool.key)
    owner: cython.p_int = ints(pool.owner)
    num_blocks: cython.Py_ssize_t = len(pool.ref)
    uncached: list = []
    freed: list = []
    num_by_owner: dict = {}
    i: cython.Py_ssize_t
    b: cython.int
    og: cython.int
    for i in range(len(blocks)):
        b = blocks[i]
        if not 0 <= b < num_blocks:
            raise IndexError(f"block {b} is outside the pool of {num_blocks}")
        ref[b] -= 1
        if ref[b] == 0:
            if key[b] == no_key:
                uncached.append(b)
                og = owner[b]
                num_by_owner[og] = num_by_owner.get(og, 0) + 1
                owner[b] = -1
            else:
                freed.append(b)
    return uncached, freed, num_by_owner


def drop_evicted(pool, victims: list, num_valid: cython.Py_ssize_t, hash_names, owners,
                 names: list, gnames: list, num_by_owner: dict,
                 on_row=None) -> cython.Py_ssize_t:
    """The victims of one eviction batch, in order: each one's content dropped from the
    index (lost where no copy is left), its owner cleared and counted in
    ``num_by_owner``, and, where ``hash_names`` is given, its hash name and owner's name
    appended for the ledger; or, where ``on_row`` is, given to ``on_row(i, block, hash
    name, owner name)`` just before its content is dropped (a recorder that writes each
    row may read the pool as the decision saw it). Stops at the first victim past ``num_valid`` or that is no
    candidate (no block, pinned, or holding no content): returns its index, or
    len(victims). What was dropped before it is counted even when this raises."""
    no_key: cython.longlong = NO_KEY
    out_bit: cython.longlong = OUTPUT_KEY_BIT
    mask: cython.longlong = HASH_MASK
    shift: cython.int = KEY_SHIFT
    key: cython.p_longlong = llongs(pool.key)
    ref: cython.p_int = ints(pool.ref)
    owner: cython.p_int = ints(pool.owner)
    slot_ns: cython.p_int = ints(pool.slot_ns)
    slot_blk: cython.p_int = ints(pool.slot_blk)
    slot_lost: cython.p_uchar = byte_items(pool.slot_lost)
    num_slots: cython.Py_ssize_t = len(pool.slot_ns)
    more: dict = pool.more
    index_drop = pool.index_drop
    nb: cython.Py_ssize_t = pool.num_blocks
    named: cython.bint = hash_names is not None or on_row is not None
    num: cython.Py_ssize_t = len(victims)
    i: cython.Py_ssize_t
    run_n: cython.Py_ssize_t = 0
    v: cython.Py_ssize_t
    og: cython.int
    run_og: cython.int = 0
    k: cython.longlong
    h: cython.longlong
    # victims come in runs of one owner: each run is counted when it ends, so the dict's
    # order is still each owner's first victim
    try:
        for i in range(num):
            v = victims[i]
            if i >= num_valid or not 0 < v < nb:
                return i
            k = key[v]
            if k == no_key or ref[v] != 0:
                return i
            og = owner[v]
            h = k & mask
            if named:
                hash_name = names[h] if k < out_bit else ""
                if on_row is None:
                    hash_names.append(hash_name)
                    owners.append(gnames[og])
                else:
                    on_row(i, v, hash_name, gnames[og])
                    key, ref, owner = llongs(pool.key), ints(pool.ref), ints(pool.owner)
                    slot_ns, slot_blk = ints(pool.slot_ns), ints(pool.slot_blk)
                    slot_lost = byte_items(pool.slot_lost)
                    num_slots = len(pool.slot_ns)
            if (k < out_bit and h < num_slots and slot_ns[h] == (k >> shift)
                    and slot_blk[h] == v and (not more or k not in more)):
                slot_blk[h] = -1                        # index_drop's common case
                slot_lost[h] = 1
            else:
                index_drop(k, v)
                key, ref, owner = llongs(pool.key), ints(pool.ref), ints(pool.owner)
                slot_ns, slot_blk = ints(pool.slot_ns), ints(pool.slot_blk)
                slot_lost = byte_items(pool.slot_lost)
                num_slots = len(pool.slot_ns)
            key[v] = no_key
            owner[v] = -1
            if run_n and og != run_og:
                num_by_owner[run_og] = num_by_owner.get(run_og, 0) + run_n
                run_n = 0
            run_og = og
            run_n += 1
        return num
    finally:
        if run_n:
            num_by_owner[run_og] = num_by_owner.get(run_og, 0) + run_n


# -- an allocation batch, as the engines' methods (ReplayEngine binds these) ------------

class PolicyFault(Exception):
    """The policy chose a block that is not a candidate; the run cannot go on."""


@cython.cclass
class Where:
    """Where an event of request ``r`` happened, the engine's ``where(r)``, formatted only
    when a check fails: the checker takes a callable for its ``where``."""

    def __init__(self, eng, r):
        self.eng = eng
        self.r = r

    def __call__(self):
        return self.eng.where(self.r)


def free_in_order(eng, blocks: list) -> cython.void:
    """Blocks a request lets go of, in vLLM's ``free_blocks`` order (the first is
    evicted first): unpinned uncached ones to the front of the free queue, unpinned
    cached ones to the policy."""
    uncached: list
    freed: list
    num_by_owner: dict
    uncached, freed, num_by_owner = release(eng, blocks)
    eng.free.extend(reversed(uncached))        # the front is the end
    if eng.on_released_fn is not None:
        eng.on_released_fn(uncached)
    for og, num in num_by_owner.items():
        eng.occ_add(og, -num)
    eng.policy.on_free(freed, eng.now)


def take_hits(eng, r, hits: list) -> cython.void:
    """r takes its hits, as vLLM's ``touch``: a candidate leaves the policy's queue,
    every hit block gains a reference (the policy's compiled ``touch_hits`` where it
    gives one and wants on_hit)."""
    on_hit = eng.on_hit_fn
    if on_hit is not None and eng.touch_hits_fn is not None and type(eng.ref) is array:
        eng.touch_hits_fn(hits, eng.ref, r.preq)
        return
    touch(eng, hits, eng.touch_queues, eng.policy.on_touch, on_hit, r.preq)


def get_new_blocks(eng, r, num_new: cython.Py_ssize_t) -> list:
    """``num_new`` blocks for r, as vLLM's ``get_new_blocks`` pops them
    (block_pool.py): truly free ones from the front first, then the policy's victims;
    each is pinned by r and charged to its group."""
    policy = eng.policy
    preq = r.preq
    plain: cython.bint = eng.plain_allocation
    reclaim: object = 0 if plain else policy.reclaim_first(preq, num_new)
    if type(reclaim) is not int or not 0 <= reclaim <= num_new:
        raise PolicyFault(f"{Where(eng, r)()}: policy '{policy.name}' asked "
                          f"reclaim_first={reclaim!r:.40} for a batch of {num_new} "
                          f"blocks, expected 0..{num_new}")
    new: list = take_free(eng, num_new - reclaim)
    num_evict: cython.Py_ssize_t = num_new - len(new)
    if num_evict:
        now = eng.now
        if eng.batch_evictions:
            decisions = [] if eng.records else None
            victims = policy.evict_batch(preq, now, num_evict, decisions)
            evicted_batch(eng, r, victims, decisions, num_evict)
            new += victims
        elif eng.batch_records:
            new += eng.evict_each(r, num_evict)
        else:
            for _ in range(num_evict):
                d = policy.select_victim(preq, now)
                eng.evict(d, r)
                new.append(d.victim)
    g = r.gid
    pin_allocated(eng, new, g)
    if not plain:
        policy.on_allocated(preq, new)
    eng.occ_add(g, num_new)
    return new


def _eviction_row(rec, now, preq, decisions, i, block, hash_name, owner):
    rec.eviction(now, preq, decisions[i], block, hash_name, owner)


def evicted_batch(eng, r, victims, decisions, num_asked: cython.Py_ssize_t) -> cython.void:
    """The policy evicted ``victims`` in one batch (its ``evict_batch``): check each
    in order as _evict would, record it, and drop its content."""
    where = Where(eng, r)
    if eng.checks_decisions and decisions:
        eng.check_decisions(r, decisions)
    checker: InvariantChecker = eng.checker
    num_valid = checker.evicted_many(where, victims)
    rec = eng.recorder if decisions is not None else None
    batch_rec = getattr(rec, "eviction_batch", None)
    now, preq = eng.now, r.preq
    hash_names = [] if batch_rec is not None else None
    owners = [] if batch_rec is not None else None
    on_row = None
    if rec is not None and batch_rec is None:       # a row each, as each is dropped
        on_row = functools.partial(_eviction_row, rec, now, preq, decisions)
    row = eng.evict_matrix[r.gid]
    num_by_owner: dict = {}
    if type(victims) is not list:
        victims = list(victims)
    try:
        stop = drop_evicted(eng, victims, num_valid, hash_names, owners, eng.hashes.names,
                            eng.group_names, num_by_owner, on_row)
    finally:                  # what was evicted counts, even when the run aborts here
        for og, num in num_by_owner.items():
            eng.occ_add(og, -num)
            row[og] += num
            eng.num_evictions += num
    done = stop == len(victims)
    if batch_rec is not None:       # a stop: the rows of the victims before it
        batch_rec(now, preq, decisions if done else decisions[:stop],
                  victims if done else victims[:stop], hash_names, owners)
    if not done:
        raise PolicyFault(f"{where()}: policy '{eng.policy.name}' chose block "
                          f"{victims[stop]}, which is not an eviction candidate (pinned "
                          f"or holding no content)")
    if len(victims) != num_asked:
        raise PolicyFault(f"{where()}: policy '{eng.policy.name}' evicted "
                          f"{len(victims)} blocks where {num_asked} were asked for")


def check_batch(eng, r, keys, hits, max_hits: cython.Py_ssize_t, new, cached_now,
                num_new_full: cython.Py_ssize_t, more_groups=()) -> cython.void:
    """After one allocation batch of r (``keys``: the content its hits must hold): the
    hard invariants, then the policy's own auditors. Every engine on this pool. A
    hybrid model's batch gives its first KV-cache group as above (with the new blocks)
    and every later group's (keys, hits, cached_now) in ``more_groups``: each group's
    hits are held to its own content, the accounting and the auditors run once."""
    where = Where(eng, r)
    policy = eng.policy
    checker: InvariantChecker = eng.checker
    checker.admitted(where, keys, hits, max_hits, new, cached_now)
    for group_keys, group_hits, group_cached in more_groups:
        checker.admitted(where, group_keys, group_hits, max_hits, [], group_cached)
    checker.check_accounting(where, len(eng.free), policy.num_candidates, eng, policy)
    if eng.auditors:
        if more_groups:
            cached_now = cached_now + [c for _, _, part in more_groups for c in part]
        eng.audit_batch(r, cached_now, num_new_full)
