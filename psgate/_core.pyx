# cython: language_level=3
"""psgate's compiled core: the replay's inner loops over the flat arrays.

Each function here is the compiled form of one loop whose Python form stays in its
module as the reference (named in each docstring). A function takes the common case and
returns where it stopped; the Python form goes on from there, so anything unusual (a
violation to record, a key kept in a dict, a hook) runs the reference code. The arrays
are the modules' own ``array.array`` objects, read and written in place: ``i`` arrays
are C ints, ``q`` arrays C long longs.
"""

cdef long long COPIES = (1 << 32) - 1
cdef long long CHILD = 1 << 32
cdef long long NO_KEY = -1


# -- the invariant checker (psgate/invariants/checker.py) ------------------------------

def checker_cached(checker, list cached):
    """InvariantChecker.admitted's loop over the blocks that now hold content, with a
    parent table: every key counted in the flat slots, or in the dict for a slot that
    another namespace owns. Returns nothing; the orphan count is updated."""
    cdef long long[:] key = checker.key
    cdef long long[:] table = checker._parent
    cdef int[:] rns = checker.res_ns
    cdef long long[:] cnt = checker.res_cnt
    cdef dict res = checker.res
    cdef int shift = checker._shift
    cdef long long mask = (<long long>1 << shift) - 1
    cdef object opaque_obj = checker._opaque
    cdef bint all_tabled = opaque_obj > 0x7FFFFFFFFFFFFFFF
    cdef long long opaque = 0 if all_tabled else opaque_obj
    cdef Py_ssize_t orphans = checker.num_orphans
    cdef long long k, h, ns, p, o, v
    cdef Py_ssize_t b
    cdef tuple item
    for item in cached:
        b = item[0]
        k = item[1]
        key[b] = k
        if not all_tabled and k >= opaque:
            res[k] = res.get(k, 0) + 1
            continue
        h = k & mask
        ns = k >> shift
        p = table[h]
        if p >= 0:
            o = rns[p]
            if o == ns:
                v = cnt[p]
                cnt[p] = v + CHILD
            elif o < 0:
                rns[p] = <int>ns
                v = 0
                cnt[p] = CHILD
            else:
                p |= ns << shift
                v = res.get(p, 0)
                res[p] = v + CHILD
            if v & COPIES == 0:
                orphans += 1
        o = rns[h]
        if o == ns:
            v = cnt[h]
            cnt[h] = v + 1
        elif o < 0:
            rns[h] = <int>ns
            v = 0
            cnt[h] = 1
        else:
            v = res.get(k, 0)
            res[k] = v + 1
        if v & COPIES == 0:
            orphans -= v >> 32
    checker.num_orphans = orphans


def checker_evicted(checker, blocks, Py_ssize_t start):
    """InvariantChecker.evicted_many's loop for victims that were candidates and whose
    keys the parent table covers, from ``start``. Returns (how many it took, the index it
    stopped at): the first block that is not such a victim, or len(blocks)."""
    cdef long long[:] key = checker.key
    cdef int[:] ref = checker.ref
    cdef long long[:] table = checker._parent
    cdef int[:] rns = checker.res_ns
    cdef long long[:] cnt = checker.res_cnt
    cdef dict res = checker.res
    cdef int shift = checker._shift
    cdef long long mask = (<long long>1 << shift) - 1
    cdef object opaque_obj = checker._opaque
    cdef bint all_tabled = opaque_obj > 0x7FFFFFFFFFFFFFFF
    cdef long long opaque = 0 if all_tabled else opaque_obj
    cdef Py_ssize_t n = checker.num_blocks
    cdef Py_ssize_t orphans = checker.num_orphans
    cdef Py_ssize_t created = checker.orphans_created
    cdef Py_ssize_t i = start, num = len(blocks), b
    cdef long long k, h, ns, p, c
    cdef object pk
    while i < num:
        b = blocks[i]
        if not 0 < b < n:
            break
        k = key[b]
        if ref[b] != 0 or k == NO_KEY or (not all_tabled and k >= opaque):
            break
        h = k & mask
        ns = k >> shift
        p = table[h]
        if p >= 0:
            if rns[p] == ns:
                c = cnt[p] - CHILD
                cnt[p] = c
            else:
                pk = p | (ns << shift)
                c = res[pk] - CHILD
                if c:
                    res[pk] = c
                else:
                    del res[pk]
            if c & COPIES == 0:
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
        if c & COPIES == 0:
            orphans += c >> 32
            created += c >> 32
        key[b] = NO_KEY
        i += 1
    num = i - start
    checker.num_orphans = orphans
    checker.orphans_created = created
    checker.num_candidates -= num
    checker.num_resident -= num
    return num, i


def checker_released(checker, blocks):
    """InvariantChecker.released: each block loses a reference; one left with none is
    free (no content) or a candidate (cached)."""
    cdef int[:] ref = checker.ref
    cdef long long[:] key = checker.key
    cdef Py_ssize_t b, num_free = 0, num_cand = 0
    for b in blocks:
        ref[b] -= 1
        if ref[b] == 0:
            if key[b] == NO_KEY:
                num_free += 1
            else:
                num_cand += 1
    checker.num_resident -= num_free
    checker.num_candidates += num_cand


# -- the ledger's eviction rows (psgate/receipt/ledger.py) -----------------------------

cdef inline bint _needs_quotes(str s):
    return '"' in s or ',' in s or '\n' in s or '\r' in s


cdef str _field(object v, object csv_field):
    """csv_field(v), with a str that needs no quotes taken as it is."""
    if type(v) is str and not _needs_quotes(<str>v):
        return <str>v
    return csv_field(v)


cdef inline bint _plain_value(str v):
    """A string orjson writes as it is, with no quote to double for the CSV."""
    cdef Py_UCS4 c
    if not v.isascii():
        return False
    for c in v:
        if c < 32 or c == 34 or c == 92:
            return False
    return True


cdef object _json_fast(object obj):
    """csv_json(obj) for a dict of plain keys to ints, finite floats written without an
    exponent, booleans, None and plain ASCII strings (what orjson writes for those is
    Python's repr of the number rounded to 9 places, or the obvious literal); None for
    anything else, which the caller hands to csv_json."""
    cdef list parts
    cdef object v
    cdef str s
    if type(obj) is not dict:
        return None
    if not obj:
        return ""
    for k in <dict>obj:
        if type(k) is not str or not _plain_value(<str>k):
            return None
    parts = []
    for k in sorted(<dict>obj):
        v = (<dict>obj)[k]
        if type(v) is float:
            s = repr(round(v, 9))
            if 'e' in s or 'n' in s:
                return None
        elif type(v) is int:
            if not -0x8000000000000000 <= v <= 0xFFFFFFFFFFFFFFFF:
                return None
            s = str(v)
        elif type(v) is str:
            if not _plain_value(<str>v):
                return None
            s = f'""{v}""'
        elif v is True:
            s = "true"
        elif v is False:
            s = "false"
        elif v is None:
            s = "null"
        else:
            return None
        parts.append(f'""{k}"":{s}')
    return '"{' + ",".join(parts) + '}"'


cdef str _number(object p, object ff):
    """ff[p] (fmt_f of a debt or probability), formatted here when the cache lacks it."""
    cdef object s = (<dict>ff).get(p)
    cdef str t
    if s is not None:
        return s
    if type(p) is float:
        t = f"{p:.6f}".rstrip("0").rstrip(".")
        return "0" if t == "-0" or t == "" else t
    return ff[p]


def eviction_rows(list rows, list decisions, list blocks, list hash_names, list owners,
                  str head, Py_ssize_t seq, str lead, object q, object ff,
                  object csv_field, object csv_json):
    """LedgerWriter.eviction_batch's loop (each row as _evict_fields formats it): one
    row per victim appended to ``rows``, numbered from ``seq`` + 1; returns the last seq.
    ``q`` and ``ff`` are the writer's caches of string and number fields."""
    cdef Py_ssize_t i, num = len(decisions)
    cdef object d, block, owner, nc, pos, queue, x, p1, p2, p3, seg, rank
    cdef str f_block, f_owner, f_nc, f_pos, f_queue, f_resp, f_run, f_p1, f_p2, f_p3
    cdef object f_seg, f_rank
    if len(blocks) < num or len(hash_names) < num or len(owners) < num:
        num = min(num, len(blocks), len(hash_names), len(owners))
    for i in range(num):
        d = decisions[i]
        block = blocks[i]
        owner = owners[i]
        nc = d.num_candidates
        pos = d.position
        queue = d.queue
        f_block = str(block) if type(block) is int else csv_field(block)
        f_owner = q[owner] if type(owner) is str else csv_field(owner)
        f_nc = str(nc) if type(nc) is int else csv_field(nc)
        f_pos = str(pos) if type(pos) is int else csv_field(pos)
        f_queue = q[queue] if type(queue) is str else csv_field(queue)
        x = d.responsible
        f_resp = _field(x or '', csv_field)
        p1 = d.responsible_p_before
        p2 = d.responsible_p_after
        p3 = d.runner_up_p
        f_p1 = '' if p1 is None else _number(p1, ff)
        f_p2 = '' if p2 is None else _number(p2, ff)
        x = d.runner_up
        f_run = _field(x or '', csv_field)
        f_p3 = '' if p3 is None else _number(p3, ff)
        seg = d.segments
        f_seg = _json_fast(seg) if seg else ""
        if f_seg is None:
            f_seg = csv_json(seg)
        rank = d.rank
        f_rank = _json_fast(rank) if rank else ""
        if f_rank is None:
            f_rank = csv_json(rank)
        seq += 1
        rows.append(f"{head}{seq},{lead}{f_block},{_field(hash_names[i], csv_field)},"
                    f"{f_owner},{f_nc},{f_pos},{f_queue},{f_resp},{f_p1},{f_p2},{f_run},"
                    f"{f_p3},{f_seg},,,,{f_rank}\n")
    return seq


# -- lru's queue (psgate/policies/lru.py) ----------------------------------------------

cdef long long EXACT = 1LL << 53      # |n| up to this: n / 1e9 in doubles is Python's n / 10**9


def lru_freed(queues, long long[:] freed, list blocks, long long now_ns):
    """LRUPolicy.on_free: each block to the back of queue 0, freed at now_ns."""
    cdef int[:] nxt = queues.next
    cdef int[:] prv = queues.prev
    cdef int[:] where = queues.where
    cdef int s = queues.num_blocks
    cdef int last = prv[s]
    cdef int b
    for b in blocks:
        prv[b] = last
        nxt[last] = b
        where[b] = 0
        freed[b] = now_ns
        last = b
    nxt[last] = s
    prv[s] = last
    queues.sizes[0] += len(blocks)


def lru_take(queues, long long[:] freed, Py_ssize_t num_blocks, decisions, decision_cls):
    """LRUPolicy.evict_batch: the first num_blocks of queue 0, unlinked in one pass, each
    with its Decision when ``decisions`` is a list."""
    cdef int[:] nxt = queues.next
    cdef int[:] prv = queues.prev
    cdef int[:] where = queues.where
    cdef int s = queues.num_blocks
    cdef Py_ssize_t size = queues.sizes[0]
    cdef list victims = []
    cdef Py_ssize_t num = 0
    cdef int b = nxt[s]
    cdef long long f
    cdef bint record = decisions is not None
    while num < num_blocks and b != s:
        if record:
            f = freed[b]
            decisions.append(decision_cls(
                b, size - num, 0, "lru", None, None, None, None, None, None,
                {"freed_t": (<double>f / 1e9) if -EXACT <= f <= EXACT
                 else (<object>f) / 1000000000}))
        victims.append(b)
        where[b] = -1
        num += 1
        b = nxt[b]
    nxt[s] = b
    prv[b] = s
    queues.sizes[0] = size - num
    return victims


# -- the block pool (psgate/engines/pool.py, base.py, sim.py, sched.py) ----------------

def pool_lookup(pool, list evb, int ns, Py_ssize_t num):
    """The longest run of cached prompt blocks among the first ``num`` of ``evb`` (trace
    hash ids) in namespace ns, each the earliest copy: (hit blocks, how many of them are
    unpinned). The lookup loops of SimEngine.try_admit and StepEngine._lookup."""
    cdef int[:] slot_ns = pool.slot_ns
    cdef int[:] slot_blk = pool.slot_blk
    cdef int[:] ref = pool.ref
    cdef dict other = pool.other
    cdef long long base = (<long long>ns) << 32
    cdef list hits = []
    cdef Py_ssize_t pos, num_evictable = 0
    cdef long long h
    cdef int b
    cdef object v
    if num > len(evb):
        num = len(evb)
    for pos in range(num):
        h = evb[pos]
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


def pool_cache(pool, list blocks, list evb, Py_ssize_t start, Py_ssize_t stop, int ns,
               int block_size, list cached_now):
    """Blocks ``start``..``stop`` of a request (prompt positions) now hold their content:
    each key set and indexed, (block, key) appended to ``cached_now``; returns the tokens
    recomputed (content that had been lost). The caching loops of SimEngine.try_admit and
    StepEngine._allocate, for a policy without an on_cached hook."""
    cdef long long[:] key = pool.key
    cdef int[:] slot_ns = pool.slot_ns
    cdef int[:] slot_blk = pool.slot_blk
    cdef unsigned char[:] slot_lost = pool.slot_lost
    cdef object index_add = pool.index_add
    cdef long long base = (<long long>ns) << 32
    cdef long long h, k
    cdef int b, o
    cdef Py_ssize_t pos, recompute = 0
    for pos in range(start, stop):
        b = blocks[pos]
        h = evb[pos]
        k = base | h
        key[b] = k
        o = slot_ns[h]
        if o == ns and slot_blk[h] < 0 and not slot_lost[h]:
            slot_blk[h] = b
        elif o < 0:
            slot_ns[h] = ns
            slot_blk[h] = b
        elif index_add(k, b):
            recompute += block_size
        cached_now.append((b, k))
    return recompute


def pool_free(pool, list blocks):
    """ReplayEngine.free_blocks's walk: each block, last first, loses a reference; those
    left with none are (uncached ones, cached ones), in walk order, and the uncached are
    no longer charged: returns them with {owner group: how many}."""
    cdef int[:] ref = pool.ref
    cdef long long[:] key = pool.key
    cdef int[:] owner = pool.owner
    cdef list uncached = [], freed = []
    cdef dict num_by_owner = {}
    cdef Py_ssize_t i
    cdef int b, og
    for i in range(len(blocks) - 1, -1, -1):
        b = blocks[i]
        ref[b] -= 1
        if ref[b] == 0:
            if key[b] == NO_KEY:
                uncached.append(b)
                og = owner[b]
                num_by_owner[og] = num_by_owner.get(og, 0) + 1
                owner[b] = -1
            else:
                freed.append(b)
    return uncached, freed, num_by_owner


def pool_evicted(pool, list victims, Py_ssize_t num_valid, list hash_names, list owners,
                 list names, list gnames, dict num_by_owner):
    """ReplayEngine.evicted_batch's loop for victims that were candidates: each one's
    content dropped (its hash name and owner appended when the lists are given) and its
    count added to num_by_owner. Returns the index of the first victim it did not take
    (one that was not a candidate, or len(victims))."""
    cdef long long[:] key = pool.key
    cdef int[:] ref = pool.ref
    cdef int[:] owner = pool.owner
    cdef int[:] slot_ns = pool.slot_ns
    cdef int[:] slot_blk = pool.slot_blk
    cdef unsigned char[:] slot_lost = pool.slot_lost
    cdef dict more = pool.more
    cdef object index_drop = pool.index_drop
    cdef Py_ssize_t nb = pool.num_blocks
    cdef long long OUT = 1LL << 62
    cdef Py_ssize_t i, num = len(victims)
    cdef int v, og
    cdef long long k, h
    cdef bint named = hash_names is not None
    for i in range(num):
        v = victims[i]
        if i >= num_valid or not 0 < v < nb:
            return i
        k = key[v]
        if k == NO_KEY or ref[v] != 0:
            return i
        og = owner[v]
        if named:
            hash_names.append(names[k & 0xFFFFFFFF] if k < OUT else "")
            owners.append(gnames[og])
        h = k & 0xFFFFFFFF
        if k < OUT and slot_ns[h] == (k >> 32) and slot_blk[h] == v and (not more or k not in more):
            slot_blk[h] = -1
            slot_lost[h] = 1
        else:
            index_drop(k, v)
        key[v] = NO_KEY
        owner[v] = -1
        num_by_owner[og] = num_by_owner.get(og, 0) + 1
    return num


# The key layout these loops assume (psgate/trace/keys.py); psgate.core checks it.
KEY_SHIFT = 32
OUTPUT_KEY_BIT = 1 << 62
NO_KEY_VALUE = NO_KEY


def pool_touch(pool, list hits, queues, on_touch):
    """ReplayEngine.touch for a policy without an on_hit hook: each hit gains a
    reference, and one that was a candidate leaves the policy's queue (unlinked here
    from ``queues`` when on_touch does only that, else through on_touch)."""
    cdef int[:] ref = pool.ref
    cdef int[:] nxt
    cdef int[:] prv
    cdef int[:] where
    cdef list sizes
    cdef int b, p, n, q
    cdef bint inline = queues is not None
    if inline:
        nxt = queues.next
        prv = queues.prev
        where = queues.where
        sizes = queues.sizes
    for b in hits:
        if ref[b] == 0:
            if inline and where[b] >= 0:
                q = where[b]
                p = prv[b]
                n = nxt[b]
                nxt[p] = n
                prv[n] = p
                where[b] = -1
                sizes[q] -= 1
            else:
                on_touch(b)
        ref[b] += 1


# -- the step scheduler (psgate/engines/sched.py) --------------------------------------

def step_decodes(list running, Py_ssize_t i, long long budget, long long bs,
                 list scheduled, list num_new, list work):
    """StepSimEngine._step's decode fast path, from running[i]: each request with exactly
    one token to compute whose slot is already allocated and cached is scheduled for it
    (budget permitting). Stops at the first other request; returns (its index, budget).
    ``work`` holds [num_p, num_c, num_d, num_k], updated in place."""
    cdef Py_ssize_t num = len(running)
    cdef long long before, num_p = work[0], num_c = work[1], num_d = work[2], num_k = work[3]
    cdef object r
    while i < num and budget > 0:
        r = running[i]
        before = r.num_computed
        if r.num_tokens - before != 1:
            break
        if not (before // bs < len(r.blocks) and (before + 1) // bs <= r.num_cached_blocks):
            break
        scheduled.append(r)
        num_new.append(1)
        budget -= 1
        i += 1
        if r.num_output:
            num_d += 1
            num_k += before
        else:
            num_p += 1
            num_c += before
    work[0] = num_p
    work[1] = num_c
    work[2] = num_d
    work[3] = num_k
    return i, budget


def step_computed(list scheduled, list num_new, Py_ssize_t i):
    """StepSimEngine._step's update_from_output, from scheduled[i]: tokens computed, and a
    token sampled where they caught up, for requests that neither sample their first
    token nor finish now. Stops at the first that does; returns its index (or the end)."""
    cdef Py_ssize_t num = len(scheduled)
    cdef long long computed, out
    cdef object r
    while i < num:
        r = scheduled[i]
        computed = r.num_computed + <long long>num_new[i]
        if computed >= r.num_tokens:
            out = r.num_output + 1
            if (out == 1 and r.first_token_ns < 0) or out >= r.max_out:
                return i
            r.num_computed = computed
            r.num_output = out
            r.num_tokens = r.num_tokens + 1
        else:
            r.num_computed = computed
        i += 1
    return num
