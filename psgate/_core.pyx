# cython: language_level=3
"""psgate's compiled core: the replay's inner loops over the flat arrays.

Each function here is the compiled form of one loop whose Python form stays in its
module as the reference (named in each docstring). A function takes the common case and
returns where it stopped; the Python form goes on from there, so anything unusual (a
violation to record, a key kept in a dict, a hook) runs the reference code. The arrays
are the modules' own ``array.array`` objects, read and written in place: ``i`` arrays
are C ints, ``q`` arrays C long longs.
"""

from cpython cimport array as carray
from libc.stdlib cimport realloc, free
from cpython.bytearray cimport PyByteArray_AS_STRING
from cpython.object cimport PyObject
from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.unicode cimport (PyUnicode_DATA, PyUnicode_GET_LENGTH, PyUnicode_KIND,
                              PyUnicode_READ, PyUnicode_READ_CHAR)

from psgate.flat cimport byte_items, doubles, ints, llongs
from psgate.policy.field_decision cimport FieldDecision
from psgate.policies.lru cimport LRUDecision, freed_seconds
from psgate.policy.history cimport PrefixHistory
from psgate.policy.leaf_tracker cimport LeafTracker
from psgate.policy.seq_queues cimport SeqQueues
from psgate.policy.buckets cimport TokenBuckets
from psgate.policy.debt_ranking cimport DebtRanking
from psgate.engines.pool_work cimport CachedHook, cache_blocks
from psgate.receipt.field_code cimport CompactEncoder, FieldCoder, Number, int_in
from psgate.receipt.row_text cimport (JsonMemo, NumberTexts, cached_field, csv_field, csv_json,
                                      json_value, memo_text, memo_update, number_text,
                                      plain_value, reads_back)

cdef class PrefixShieldView(CachedHook)   # below, with prefixshield's paths


cdef void *_grown(void *p, Py_ssize_t *cap, size_t item) except NULL:
    """p (a C array of cap[0] items of ``item`` bytes, or NULL) reallocated at twice its
    capacity (16 at first); cap[0] is updated."""
    cdef Py_ssize_t c = 2 * cap[0] if cap[0] else 16
    cdef void *q = realloc(p, c * item)
    if q == NULL:
        raise MemoryError()
    cap[0] = c
    return q

# The flat arrays' items, read and written in place through a pointer taken once per call:
# a typed memoryview would do the same, but acquiring one costs more than many of these
# loops do. The pointer lives while the array is neither resized nor dropped, so a loop
# that calls back into Python takes it again after the call (a resize there moves it).


# -- prefixshield (psgate/policies/prefixshield.py) ------------------------------------

cdef class PSDecision(FieldDecision):
    """prefixshield's Decision for a victim the compiled view chose among the groups in
    debt."""
    cdef object decision_cls
    cdef readonly object queue, responsible
    cdef readonly double responsible_p_before, responsible_p_after
    cdef readonly object runner_up              # None: no runner-up
    cdef double runner_p
    cdef long long live[3]                       # probationary, normal, reuse
    cdef object seg_name, class_name, contract_name
    cdef long long freed_seq
    cdef tuple debts                             # the owner's (raw, normalized, W_g)
    cdef object seg_d, rank_d

    def __init__(self, decision_cls, int victim, Py_ssize_t num_candidates, queue,
                 responsible, double p_before, double p_after, runner_up,
                 double runner_up_p, live, segment, cls, contract, long long freed_seq,
                 tuple debts):
        """The view makes these without this; here for a reader that makes one itself.
        ``live``: the responsible group's (probationary, normal, reuse) counts;
        ``debts``: the owner's (raw, normalized, W_g)."""
        self.decision_cls = decision_cls
        self.victim = victim
        self.num_cand = num_candidates
        self.queue = queue
        self.responsible = responsible
        self.responsible_p_before = p_before
        self.responsible_p_after = p_after
        self.runner_up = runner_up
        self.runner_p = runner_up_p
        self.live[0], self.live[1], self.live[2] = live
        self.seg_name = segment
        self.class_name = cls
        self.contract_name = contract
        self.freed_seq = freed_seq
        self.debts = debts

    @property
    def runner_up_p(self):
        return None if self.runner_up is None else self.runner_p

    @property
    def segments(self):
        if self.seg_d is None:
            self.seg_d = {"probationary": self.live[0], "normal": self.live[1],
                          "reuse": self.live[2]}
        return self.seg_d

    @property
    def rank(self):
        if self.rank_d is None:
            self.rank_d = {"segment": self.seg_name, "class": self.class_name,
                           "freed_seq": self.freed_seq, "global_fallback": False,
                           "owner_contract": self.contract_name,
                           "owner_raw_debt": self.debts[0],
                           "owner_norm_debt": self.debts[1]}
        return self.rank_d

    def decision(self):
        return self.decision_cls(
            self.victim, self.num_cand, 0, self.queue, self.responsible,
            self.responsible_p_before, self.responsible_p_after, self.runner_up,
            self.runner_up_p, self.segments, self.rank)


NS_PER_S = 1_000_000_000


cdef class PrefixShieldView(CachedHook):
    """prefixshield's per-request, per-block and per-victim paths over the policy's own
    state: its arrays are read and written in place, and its queues, buckets and ranking
    (with the batch's rank cache and runs) are the policy's SeqQueues, TokenBuckets and
    DebtRanking, called as C methods, so the Python methods and these interleave freely.
    An admission's new blocks are held here: the Python methods that read or write them
    (on_admit, end_admit), and those that change the queues (_eligible_push,
    uncandidate), call this view's forms while one is bound. What is rare (the global fallback
    when no group is in debt, a block outside the pool) calls the policy's own Python
    method. Built by PrefixShield.bind for the classes whose hooks it mirrors; a subclass
    that overrides them (prefixshield-b) runs the Python ones."""
    cdef object pol
    cdef LeafTracker tree       # the policy's, None where it is not leaf-only
    cdef SeqQueues gq           # the group queues, q = 3 * g + segment
    cdef SeqQueues gl           # the all-groups queues while has_glob
    # the policy's num_eligible, an array('q') that grows by a group at a time (read
    # through its data pointer: no buffer is held, so it can grow)
    cdef carray.array num_eligible
    cdef DebtRanking rk         # the policy's ranking of the groups in debt
    cdef int[:] owner
    cdef signed char[:] cls
    cdef long long[:] freed_seq
    cdef unsigned char[:] cand
    cdef bint segments, has_tree, has_glob
    cdef object glob_obj
    cdef double eps
    cdef Py_ssize_t n
    cdef TokenBuckets buckets   # the policy's
    cdef dict debt_cache
    cdef list qnames, gnames, contract_names
    cdef tuple seg_names, class_names
    cdef signed char[:] contract
    cdef object decision_cls
    # the policy's num_cand while a kernel runs (read on entry, written back on exit and
    # before any call into the policy's Python that could read or change it)
    cdef Py_ssize_t num_cand
    # the admission's new blocks (PrefixShield.new_blocks: blocks here, keys in nb_keys)
    # and how many of them hold generated tokens (num_new_output)
    cdef int *nb_b
    cdef Py_ssize_t nb_n, nb_cap, nb_out
    cdef list nb_keys
    cdef double now             # the policy's now_s, read once per ranking

    def __init__(self, pol, decision_cls, class_names):
        self.pol = pol
        self.buckets = pol.buckets
        self.debt_cache = pol.debt_cache
        self.qnames = pol.qnames
        self.gnames = pol.gnames
        self.contract_names = pol.contract_names
        self.seg_names = tuple(pol.seg_names)
        self.class_names = tuple(class_names)
        self.contract = pol.contract
        self.decision_cls = decision_cls
        self.gq = pol.gq
        self.num_eligible = pol.num_eligible
        self.rk = pol.ranking
        self.owner = pol.owner
        self.cls = pol.cls
        self.freed_seq = pol.freed_seq
        self.cand = pol.cand
        self.n = len(pol.cand)
        self.segments = pol.params["segments"]
        self.eps = pol.eps
        self.tree = pol.tree
        self.has_tree = self.tree is not None
        self.glob_obj = False           # never the policy's: the first use syncs
        self.has_glob = False
        self.nb_b = NULL
        self.nb_n = self.nb_cap = self.nb_out = 0
        self.nb_keys = []

    def __dealloc__(self):
        free(self.nb_b)

    cdef bint _sync_glob(self):
        """Whether the all-groups queues exist now (they are dropped and rebuilt). Only
        Python code changes them (the policy's own, and _take's drop), so a kernel syncs
        on entry and after such a call, and reads has_glob in between."""
        gl = self.pol.glob
        if gl is not self.glob_obj:
            self.glob_obj = gl
            self.has_glob = gl is not None
            self.gl = gl
        return self.has_glob

    cdef tuple _debts(self, int g):
        """PrefixShield._debts: (raw debt, normalized debt, W_g) at the batch's time, once
        per batch."""
        cdef tuple d = self.debt_cache.get(g)
        if d is None:
            d = self.buckets.debts(g, self.pol.now_s)
            self.debt_cache[g] = d
        return d

    cdef int _push(self, int b) except -1:
        """PrefixShield._eligible_push."""
        cdef int g = self.owner[b]
        cdef int s = self.cls[b] if self.segments else 0
        cdef long long sq = self.freed_seq[b]
        self.gq.push(3 * g + s, b, sq)
        if self.has_glob:
            self.gl.push(s, b, sq)
        self.num_eligible.data.as_longlongs[g] += 1
        if self.num_eligible.data.as_longlongs[g] == 1:
            self.rk.relist(g)
        return 0

    cdef int _uncandidate(self, int b) except -1:
        """PrefixShield.uncandidate."""
        cdef int g
        self.cand[b] = 0
        self.num_cand -= 1
        if ints(self.gq.where)[b] >= 0:
            g = self.owner[b]
            self.gq.remove(b)
            if self.has_glob:
                self.gl.remove(b)
            self.num_eligible.data.as_longlongs[g] -= 1
            if self.num_eligible.data.as_longlongs[g] == 0:
                self.rk.drop(g)
        return 0

    cdef int _best_of(self, int g, int *seg) except -2:
        """PrefixShield._best_of: g's best eligible block (its segment in seg), or -1."""
        cdef int q = self.gq.first_queue(3 * g, 3)
        seg[0] = q - 3 * g
        return self.gq.head(q) if seg[0] < 3 else -1

    cdef int _evicted(self, int b, int g, object p_after) except -1:
        """PrefixShield.evicted."""
        pol = self.pol
        if not 0 <= b < self.n:
            pol.num_cand = self.num_cand
            pol.evicted(b, g, p_after)     # the reference's behaviour, whatever it is
            self.num_cand = pol.num_cand
            return 0
        if g >= 0:
            self.rk.took(g, p_after)
        return self._evicted_tail(b)

    def eligible(self, int b):
        """PrefixShield._eligible_push: b (a candidate leaf) joins its queues."""
        if not 0 <= b < self.n:
            raise IndexError(f"block {b} is outside the pool")
        self._sync_glob()
        self._push(b)

    def uncandidate(self, int b):
        """PrefixShield.uncandidate."""
        if not 0 <= b < self.n:
            raise IndexError(f"block {b} is outside the pool")
        pol = self.pol
        self.num_cand = pol.num_cand
        self._sync_glob()
        try:
            self._uncandidate(b)
        finally:
            pol.num_cand = self.num_cand

    cdef int _evicted_tail(self, int b) except -1:
        """_evicted's half for the block b (0 <= b < n): it leaves the candidates and the
        leaf tracker, whose parent may become eligible."""
        cdef int p
        if not self.has_tree and not self.cand[b]:
            return 0
        self._uncandidate(b)
        if self.has_tree:
            p = self.tree.evicted(b)
            if p >= 0 and self.cand[p]:
                self._push(p)
        self.owner[b] = -1
        return 0

    cdef int block_cached(self, int block, Py_ssize_t pos, int parent, object key,
                          Py_ssize_t num_prompt_blocks) except -1:
        """PrefixShield.on_cached (its ``cached``, CachedHook's), with its request's
        prompt blocks looked up by the caller (pool_work.cache_blocks, once per batch). The admission's new blocks are kept here (the policy's
        new_blocks and num_new_output, which end_admit reads: the view's own)."""
        if not 0 <= block < self.n or parent >= self.n:
            raise IndexError(f"block {block} (parent {parent}) is outside the pool")
        if self.nb_n == self.nb_cap:
            self.nb_b = <int *>_grown(self.nb_b, &self.nb_cap, sizeof(int))
        self.nb_b[self.nb_n] = block
        self.nb_n += 1
        self.nb_keys.append(key)
        if pos >= num_prompt_blocks:
            self.nb_out += 1
        if self.has_tree:
            self.tree.cached(block, parent)

    def touched(self, list hits, ref_a, req):
        """The engine's touch loop over r's hits with on_touch and on_hit inline: each
        gains a reference; one with none leaves the candidates (PrefixShield.uncandidate),
        and one that r's group made under r's contract and prefix, not yet Reuse, is
        promoted while the group's raw debt allows it (PrefixShield.on_hit)."""
        cdef Py_ssize_t pos, num_ref = len(ref_a)
        cdef int b, g, c = -1
        cdef int *ref = ints(ref_a)
        # the group's debt is the batch's (_debts caches it), so it and the gate are read
        # once; the counts are the policy's, handed back at the end
        cdef Py_ssize_t num_promoted = 0, num_denied = 0
        cdef bint asked = False, promotes = False
        pol = self.pol
        g = pol.gids[req.group]
        cdef list lprefix = pol.lprefix
        prefix = req.prefix
        debt = top_debt = None
        self.num_cand = pol.num_cand
        self._sync_glob()
        try:
            for pos in range(len(hits)):
                b = hits[pos]
                if not 0 <= b < self.n or b >= num_ref:
                    raise IndexError(f"block {b} is outside the pool")
                if ref[b] == 0:
                    self._uncandidate(b)
                ref[b] += 1
                if self.owner[b] != g:
                    continue
                if c < 0:
                    c = pol.cidx[req.contract]
                label = lprefix[b]
                if self.contract[b] != c or (label is not prefix and label != prefix) \
                        or self.cls[b] == 2:
                    continue
                if not asked:
                    debt = (<tuple>self._debts(g))[0]
                    promotes = not pol.params["gate"] or debt <= self.eps
                    top_debt = pol.promotion_debt
                    asked = True
                    ref = ints(ref_a)
                if promotes:
                    self.cls[b] = 2
                    num_promoted += 1
                else:
                    num_denied += 1
        finally:
            pol.num_cand = self.num_cand
            if num_promoted:
                pol.promoted += num_promoted
                if debt > top_debt:
                    pol.promotion_debt = debt
            if num_denied:
                pol.denied += num_denied

    cdef double _charge(self, int g, Py_ssize_t i, double n, double t) except? -1.0:
        """PrefixShield._charge of bucket i (g's): n blocks at time t; the new balance."""
        cdef double b = self.buckets.charge(i, n, t)
        self.rk.line_moved(g)
        return b

    def on_admit(self, req, now_ns):
        """PrefixShield.on_admit: the last batch ends, buckets whose debt has cleared by
        the admission's time leave their group's kinetic sums (_advance), the group gets
        its id, and the batch's state starts afresh."""
        pol = self.pol
        t = now_ns / NS_PER_S
        self.rk.start_batch(t)                     # PrefixShield._advance
        pol.now_s = t
        if req.group not in pol.gids:
            pol.group_id(req.group)
        self.nb_n = self.nb_out = 0
        self.nb_keys = []
        pol.promoted = pol.denied = 0
        pol.promotion_debt = 0.0
        self.debt_cache.clear()

    def end_admit(self, req):
        """PrefixShield.end_admit: the batch ends, the group's bucket is charged for the
        new blocks (generated-token blocks at output_weight each), the blocks get their
        class, owner, contract and label, the admission history learns the prefix, and
        the admission's note is returned."""
        pol = self.pol
        cdef int g = pol.gids[req.group]
        cdef int c = pol.cidx[req.contract]
        cdef list keys = self.nb_keys
        cdef Py_ssize_t n = self.nb_n, j, i
        cdef double t
        cdef object n_out, ow, amount, balance, label
        self.rk.end_batch()
        t = pol.now_s
        n_out = self.nb_out
        ow = pol.output_weight
        amount = n if n_out == 0 or ow == 1.0 else ((n - n_out) + ow * n_out)
        i = pol.bucket_index(g, c)
        if n:
            balance = self._charge(g, i, amount, t)
        else:
            balance = self.buckets.bhat(i, t)
        promoted, denied = pol.promoted, pol.denied
        pol.last_audit = {"group": req.group, "contract": req.contract, "charged": n,
                          "promoted": promoted, "promotion_debt": pol.promotion_debt}
        note = {"charged": n, "balance": round(balance, 9),
                "raw_debt": round(self.buckets.raw_debt(g, t), 9),
                "promoted": promoted, "promotion_denied": denied}
        if amount != n:
            note["output_blocks"] = n_out
            note["charge"] = round(amount, 9)
        if denied:
            note["denied_reason"] = "group in debt"
        if not n:
            return note
        cdef PrefixHistory hist = pol.history
        label = req.prefix
        # "first admission" is judged against the history before this request
        first_all = label is not None and not hist.contains(g, label)
        seen = hist.contains_keys(g, keys) if label is None else None
        classes = self._classify(seen, first_all, balance < -self.eps, g, c, label)
        if label is not None:
            hist.touch(g, label)
        else:
            hist.touch_keys(g, keys)
        new_class = {}
        for j in range(3):
            if classes[j]:
                new_class[self.class_names[j]] = classes[j]
        note["new_class"] = new_class
        self.nb_n = self.nb_out = 0
        self.nb_keys = []
        return note

    cdef list _classify(self, list seen, bint first_all, bint in_debt, int g, int c, label):
        """end_admit's loop over the new blocks: each one's class (Probationary if its
        prefix is new to g, per block in ``seen`` or for all in ``first_all``, or if g is
        in debt after the charge; else Normal), owner, contract and label. Returns the
        number of blocks per class."""
        cdef Py_ssize_t i, n0 = 0, n1 = 0
        cdef int b, cl
        cdef list lprefix = self.pol.lprefix
        for i in range(self.nb_n):
            b = self.nb_b[i]
            if in_debt or (first_all if seen is None else not seen[i]):
                cl = 0
                n0 += 1
            else:
                cl = 1
                n1 += 1
            self.cls[b] = cl
            self.owner[b] = g
            self.contract[b] = c
            lprefix[b] = label
        return [n0, n1, 0]

    def freed(self, list blocks):
        """PrefixShield.on_free."""
        cdef int b
        cdef long long fs
        pol = self.pol
        fs = pol.free_seq
        self.num_cand = pol.num_cand
        self._sync_glob()
        for b in blocks:
            if not 0 <= b < self.n:
                pol.free_seq = fs
                pol.num_cand = self.num_cand
                raise IndexError(f"block {b} is outside the pool")
            fs += 1
            self.freed_seq[b] = fs
            self.cand[b] = 1
            self.num_cand += 1
            if not self.has_tree or self.tree.is_leaf(b):
                self._push(b)
        pol.free_seq = fs
        pol.num_cand = self.num_cand

    cdef object _decision(self, int b, int g, int seg, double p_before, double p_after,
                          int runner, double runner_p):
        """PrefixShield.decision for a victim of responsible group g."""
        cdef int q = 3 * g
        cdef long long *live = llongs(self.gq.live)
        cdef PSDecision d = PSDecision.__new__(PSDecision)
        d.victim = b
        d.num_cand = self.num_cand
        d.queue = self.qnames[q + seg]
        d.responsible = self.gnames[g]
        d.responsible_p_before = p_before
        d.responsible_p_after = p_after
        if runner >= 0:
            d.runner_up = self.gnames[runner]
            d.runner_p = runner_p
        d.live[0] = live[q]
        d.live[1] = live[q + 1]
        d.live[2] = live[q + 2]
        d.seg_name = self.seg_names[seg]
        d.class_name = self.class_names[self.cls[b]]
        d.contract_name = self.contract_names[self.contract[b]]
        d.freed_seq = self.freed_seq[b]
        d.debts = self._debts(self.owner[b])
        d.decision_cls = self.decision_cls
        return d

    def evict_batch(self, Py_ssize_t num_blocks, decisions=None):
        """PrefixShield.evict_batch: the victim of the groups in debt, with a warm ranking,
        is chosen here, any other through _choose (and _decision, for a recorder)."""
        cdef list victims = []
        pol = self.pol
        self.num_cand = pol.num_cand
        try:
            self._take(num_blocks, victims, decisions)
        finally:
            pol.num_cand = self.num_cand
        return victims

    cdef int _take(self, Py_ssize_t num_blocks, list victims, object decisions) except -1:
        cdef Py_ssize_t i
        cdef int g, b, seg, runner
        cdef double top_p, p_after, w, runner_p
        cdef bint alone
        cdef DebtRanking rk = self.rk
        # the policy's glob_budget, held here between calls into its Python (held true)
        cdef long long budget
        cdef bint held = False
        pol = self.pol
        self.now = pol.now_s
        self._sync_glob()
        budget = pol.glob_budget
        held = True
        try:
            for i in range(num_blocks):
                if self.num_cand == 0:
                    break
                if i == 0:
                    pol.pending = None
                if rk.run_g >= 0 and rk.run_p > self.eps:
                    # a run of one group's victims goes on (DebtRanking.run)
                    g = rk.run_g
                    top_p = rk.run_p
                    runner, runner_p = rk.run_runner, rk.run_runner_p
                    w = rk.run_w
                    alone = True
                else:
                    rk.rank_cached(self.now)
                    if not (rk.num_top and rk.top_p > self.eps):
                        pol.num_cand = self.num_cand
                        pol.glob_budget = budget
                        held = False
                        choice = pol.choose()
                        self.now = pol.now_s
                        self._sync_glob()
                        b = choice[0]
                        if decisions is not None:
                            decisions.append(pol.decision(choice))
                        budget = pol.glob_budget
                        held = True
                        self._evicted(b, choice[1], choice[3])
                        victims.append(b)
                        continue
                    alone = rk.num_top == 1
                    if alone:
                        g = rk.top_g
                        runner, runner_p = rk.runner_g, rk.runner_p
                    else:           # tied: sorted by best candidate, the second runs up
                        g, runner = self.gq.first_two_families(rk.ties, 3)
                        runner_p = rk.top_p
                    top_p = rk.top_p
                    w = rk.inv_w(g, self.now)
                b = self._best_of(g, &seg)
                if self.has_glob:
                    budget -= 1
                    if budget <= 0:
                        pol.glob = None
                        self._sync_glob()
                p_after = top_p - w
                if decisions is not None:
                    decisions.append(self._decision(b, g, seg, top_p, p_after, runner,
                                                    runner_p))
                if alone and 0 <= b < self.n:
                    rk.run(g, p_after, runner, runner_p, w)
                    self._evicted_tail(b)
                else:
                    self._evicted(b, g, p_after)
                victims.append(b)
        finally:
            if held:
                pol.glob_budget = budget
            rk.flush()
        return 0


# -- the compact ledger's coder (psgate/receipt/compact.py) ----------------------------

from libc.string cimport memcmp, memcpy
from libc.stdio cimport snprintf
from cpython.long cimport PyLong_AsLongLongAndOverflow
from cpython.unicode cimport PyUnicode_AsUTF8AndSize, PyUnicode_DecodeUTF8

cdef inline bint _region_eq_at(str line, Py_ssize_t a, Py_ssize_t b, str s, Py_ssize_t off):
    """line[a:b] == s[off:off + b - a] (s long enough), without making either."""
    cdef Py_ssize_t n = b - a, i
    cdef unsigned int lk = PyUnicode_KIND(line), sk = PyUnicode_KIND(s)
    cdef void *ld = PyUnicode_DATA(line)
    cdef void *sd = PyUnicode_DATA(s)
    if lk == sk:
        return memcmp(<char *>ld + a * lk, <char *>sd + off * sk, n * lk) == 0
    for i in range(n):
        if PyUnicode_READ(lk, ld, a + i) != PyUnicode_READ(sk, sd, off + i):
            return False
    return True


cdef struct _RowBuf:
    char *p
    Py_ssize_t n, cap


cdef long long _INT_BOUND = 100000000000000000   # 10**17: is_int takes its text


cdef int _buf_put(_RowBuf *b, const char *s, Py_ssize_t n) except -1:
    cdef Py_ssize_t c
    cdef void *grown
    if b.n + n > b.cap:
        c = max(2 * b.cap, b.n + n, 4096)
        grown = realloc(b.p, c)
        if grown == NULL:
            raise MemoryError()
        b.p = <char *>grown
        b.cap = c
    memcpy(b.p + b.n, s, n)
    b.n += n
    return 0


cdef int _buf_str(_RowBuf *b, str s) except -1:
    cdef Py_ssize_t n
    cdef const char *u = PyUnicode_AsUTF8AndSize(s, &n)
    return _buf_put(b, u, n)


cdef int _buf_code(_RowBuf *b, str code) except -1:
    """"," and one code as csv.writer writes it (CompactEncoder.encode_text)."""
    _buf_put(b, ",", 1)
    if not code:
        return 0
    return _buf_str(b, csv_field(code))


cdef int _buf_code_c(_RowBuf *b, str cur, str pred, FieldCoder coder) except -1:
    """"," and coder.code(cur, pred) (cur != pred), a step written without making its
    text."""
    cdef int mark = coder.step(cur, pred)
    cdef char head[2]
    if mark == 0:
        return _buf_code(b, coder.code(cur, pred))
    head[0] = 44
    head[1] = <char>mark
    _buf_put(b, head, 2)
    return _buf_int(b, coder.delta.value)


cdef int _buf_int(_RowBuf *b, long long v) except -1:
    cdef char tmp[24]
    cdef int n = snprintf(tmp, 24, "%lld", v)
    return _buf_put(b, tmp, n)


# _ps_row's JSON columns: their keys, sorted (as the memos order them), and the most
# values either holds
cdef list _PS_SEG_KEYS = ["normal", "probationary", "reuse"]
cdef list _LRU_RANK_KEYS = ["freed_t"]
cdef list _PS_RANK_KEYS = ["class", "freed_seq", "global_fallback", "owner_contract",
                           "owner_norm_debt", "owner_raw_debt", "segment"]
DEF _PS_JSON_MAX = 8
DEF _PS_INT = 0             # _ps_json's kinds of value
DEF _PS_NAME = 1
DEF _PS_TEXT = 2
cdef str _JSON_FALSE = "false"


cdef inline bint _quoted_eq(str p, str name):
    """p == '"' + name + '"', without making the right side."""
    cdef Py_ssize_t n = PyUnicode_GET_LENGTH(p)
    return (n == PyUnicode_GET_LENGTH(name) + 2 and PyUnicode_READ_CHAR(p, 0) == u'"'
            and PyUnicode_READ_CHAR(p, n - 1) == u'"'
            and _region_eq_at(p, 1, n - 1, name, 0))


cdef class CompactCoder:
    """The compact ledger's rows of LedgerWriter's eviction batches, coded from each row's
    fields without making the row: the codes field_code.CompactEncoder gives the rows
    eviction_rows would write, coded into that encoder's own state (its last row, its rows
    by kind and its hash numbers), so the encoder codes the rows that follow as it would
    have. Each field is coded by the encoder's FieldCoder (code, step), and a JSON
    column the memos do not give, or whose text the fields here do not say, goes to the
    encoder's own methods."""

    cdef CompactEncoder enc
    cdef FieldCoder field_coder     # the encoder's
    cdef set plain_names            # _plain_name's strings
    cdef tuple ps_debts             # the last debts _ps_codable took, and their texts
    cdef object ps_raw_t, ps_norm_t
    cdef long long lru_ns           # the last freed time _lru_codable took, and its text
    cdef object lru_t

    def __init__(self, CompactEncoder enc):
        """``enc``: an encoder of LedgerWriter's columns (compact.compiled_coder checks
        them)."""
        if enc.json_cols != [19, 23] or enc.num_cols != 24:
            raise ValueError("not LedgerWriter's columns")
        self.enc = enc
        self.field_coder = enc.field_coder
        self.plain_names = set()
        self.ps_debts = None

    def encode_evictions(self, list decisions, list blocks, list hash_names, list owners,
                         tuple lead, Py_ssize_t seq, object q, object ff, JsonMemo seg_memo,
                         JsonMemo rank_memo):
        """The encoder's encode_text of the rows eviction_rows formats for one batch,
        coded from each row's fields without making the row: the JSON columns' keys and
        value texts are the memos' (a field they do not give, or whose text the reader
        here would not take back, is coded from its text). ``lead``: the rows' run,
        policy, time, kind, request, group and contract fields. Returns (text, the last
        seq)."""
        cdef Py_ssize_t num = len(decisions)
        cdef _RowBuf buf
        if len(blocks) < num or len(hash_names) < num or len(owners) < num:
            num = min(num, len(blocks), len(hash_names), len(owners))
        if num == 0:
            return "", seq
        buf.p = NULL
        buf.n = buf.cap = 0
        try:
            seq = self._evict_rows(&buf, decisions, blocks, hash_names, owners, lead, seq,
                                   num, q, ff, seg_memo, rank_memo)
            return PyUnicode_DecodeUTF8(buf.p, buf.n, NULL), seq
        finally:
            free(buf.p)

    cdef Py_ssize_t _evict_rows(self, _RowBuf *buf, list decisions, list blocks,
                                list hash_names, list owners, tuple lead, Py_ssize_t seq,
                                Py_ssize_t num, object q, object ff, JsonMemo seg_memo,
                                JsonMemo rank_memo) except? -1:
        """encode_evictions' rows, written to buf: what the encoder's encode_fields codes
        for each row's fields, without making the fields. The rows share their run,
        policy, time, request and kind, and seq counts up, so after the first row every
        shared column is its prediction. The own columns' predictions are held here from
        row to row (an integer field as its value, a number's text beside its value), and
        the batch's last row is the encoder's prediction state afterwards, as
        encode_fields leaves it."""
        cdef Py_ssize_t i, j, k
        cdef object d, x, blk
        cdef str kind = lead[3], t, p
        cdef tuple prev, pj
        cdef dict prev_json
        cdef list ptext, shared
        cdef list jtext = [None, None], jkeys = [None, None], jvals = [None, None]
        cdef list jok = [None, None]
        cdef long long pint[3]          # block, num_candidates, position (own 0, 3, 4)
        cdef bint pint_live[3]
        cdef double pflt[3]             # p_before, p_after, runner_up_p (own 7, 8, 10)
        cdef bint pflt_live[3]
        cdef Py_ssize_t hid
        # a JSON column's integer values by place, where jvals holds their text
        # (jint_ok): set by the rows coded from fields, dropped by any other row's
        cdef long long jint[2 * _PS_JSON_MAX]
        cdef bint jint_ok[2 * _PS_JSON_MAX]
        for j in range(2 * _PS_JSON_MAX):
            jint_ok[j] = False
        prev = self.enc.by_kind.get(kind) or self.enc.blank
        ptext = list(<tuple>prev[0])
        prev_json = prev[1]
        for k in range(2):
            pj = prev_json[19 if k == 0 else 23]
            jtext[k] = pj[0]
            jkeys[k] = pj[1]
            jvals[k] = list(<list>pj[2])
            jok[k] = pj[3]
        for k in range(3):
            pint_live[k] = False
            pflt_live[k] = False
        for i in range(num):
            d = decisions[i]
            seq += 1
            _buf_str(buf, csv_field(kind))
            if i == 0:
                shared = [lead[0], lead[1], str(seq), lead[2], lead[4], lead[5], lead[6]]
                for j in range(7):
                    p = self.enc.seq_pred() if j == self.enc.seq_at else self.enc.last[j]
                    _buf_code(buf, self.field_coder.code(shared[j], p))
            else:
                _buf_put(buf, ",,,,,,,", 7)
            # own columns: block, hash, owner, num_candidates, position, queue,
            # responsible, p before, p after, runner-up, runner-up p, hits, allocated,
            # new blocks
            blk = blocks[i]
            self._int_col(buf, ptext, 0, blk, 0, pint, pint_live)
            t = csv_field(hash_names[i])
            hid = -1
            if t:
                hid = self.enc.hashes.see(t)
            p = ptext[1]
            if t is p or t == p:
                _buf_put(buf, ",", 1)
            elif hid >= 0:
                _buf_put(buf, ",#", 2)
                _buf_int(buf, hid)
            else:
                _buf_code_c(buf, t, p, self.field_coder)
            ptext[1] = t
            x = owners[i]
            self._text_col(buf, ptext, 2, cached_field(q, x))
            if type(d) is LRUDecision and self._lru_codable(<LRUDecision>d):
                self._lru_row(buf, ptext, <LRUDecision>d, pint, pint_live, pflt_live, q,
                              seg_memo, jtext, jkeys, jvals, jok, jint, jint_ok)
            elif type(d) is PSDecision and self._ps_codable(<PSDecision>d):
                self._ps_row(buf, ptext, <PSDecision>d, pint, pint_live, pflt, pflt_live, q,
                             ff, jtext, jkeys, jvals, jok, jint, jint_ok)
            else:
                self._decision_row(buf, ptext, d, pint, pint_live, pflt, pflt_live, q, ff,
                                   seg_memo, rank_memo, jtext, jkeys, jvals, jok, jint_ok)
            _buf_put(buf, "\r\n", 2)
        for k in range(3):
            if pint_live[k]:
                ptext[(0, 3, 4)[k]] = str(pint[k])
        self.enc.last = (lead[0], lead[1], str(seq), lead[2], lead[4], lead[5], lead[6])
        self.enc.by_kind[kind] = (tuple(ptext), {19: (jtext[0], jkeys[0], jvals[0], jok[0]),
                                             23: (jtext[1], jkeys[1], jvals[1], jok[1])})
        return seq

    cdef int _text_col(self, _RowBuf *buf, list ptext, Py_ssize_t j, str t) except -1:
        """Own column j's field t coded against the last row's text (then t)."""
        cdef str p = ptext[j]
        if t is p or t == p:
            _buf_put(buf, ",", 1)
        else:
            _buf_code_c(buf, t, p, self.field_coder)
            ptext[j] = t
        return 0

    cdef int _int_col(self, _RowBuf *buf, list ptext, Py_ssize_t j, object v, int k,
                      long long *pint, bint *pint_live) except -1:
        """Own column j's field for v (str(v) for an int, as _evict_texts writes it): an
        integer the compact form codes by difference is compared as a number, and its text
        is made only when the next field is not one (its value stays in pint[k])."""
        cdef long long a
        cdef int overflow = 0
        if type(v) is int:
            a = PyLong_AsLongLongAndOverflow(v, &overflow)
            if not overflow and -_INT_BOUND < a < _INT_BOUND:
                return self._int_col_c(buf, ptext, j, a, k, pint, pint_live)
        if pint_live[k]:
            ptext[j] = str(pint[k])
            pint_live[k] = False
        self._text_col(buf, ptext, j, csv_field(v))
        return 0

    cdef int _int_col_c(self, _RowBuf *buf, list ptext, Py_ssize_t j, long long a, int k,
                        long long *pint, bint *pint_live) except -1:
        """_int_col for the integer a (-_INT_BOUND < a < _INT_BOUND)."""
        cdef str p
        if pint_live[k]:
            if a == pint[k]:
                _buf_put(buf, ",", 1)
            else:
                _buf_put(buf, ",~", 2)
                _buf_int(buf, a - pint[k])
        else:
            p = ptext[j]
            if int_in(p, self.field_coder.pred):
                if a == self.field_coder.pred.value:
                    _buf_put(buf, ",", 1)
                else:
                    _buf_put(buf, ",~", 2)
                    _buf_int(buf, a - self.field_coder.pred.value)
            else:
                _buf_code_c(buf, str(a), p, self.field_coder)
        pint[k] = a
        pint_live[k] = True
        return 0

    cdef int _num_col_c(self, _RowBuf *buf, list ptext, Py_ssize_t j, double x, int k,
                        double *pflt, bint *pflt_live, NumberTexts ff) except -1:
        """_num_col for the float x."""
        if pflt_live[k] and x == pflt[k]:
            _buf_put(buf, ",", 1)
            return 0
        self._text_col(buf, ptext, j, number_text(x, ff))
        pflt_live[k] = True
        pflt[k] = x
        return 0

    cdef bint _ps_codable(self, PSDecision d) except -1:
        """d's row can be coded from its fields: its names are plain JSON strings the
        coder's reader takes, and its owner's debts have JSON texts that it reads back
        (kept in ps_raw_t and ps_norm_t for _ps_row). Any other goes by its Decision's attributes."""
        cdef tuple debts = d.debts
        cdef object raw, norm
        if not (self._plain_name(d.seg_name) and self._plain_name(d.class_name)
                and self._plain_name(d.contract_name)):
            return False
        if debts is not self.ps_debts:
            self.ps_debts = None
            raw = json_value(debts[0])
            norm = json_value(debts[1])
            if (raw is None or norm is None or not reads_back(debts[0], <str>raw)
                    or not reads_back(debts[1], <str>norm)):
                return False
            self.ps_debts = debts
            self.ps_raw_t = raw
            self.ps_norm_t = norm
        return True

    cdef int _decision_row(self, _RowBuf *buf, list ptext, object d, long long *pint,
                           bint *pint_live, double *pflt, bint *pflt_live, object q,
                           object ff, JsonMemo seg_memo, JsonMemo rank_memo, list jtext,
                           list jkeys, list jvals, list jok, bint *jint_ok) except -1:
        """_evict_rows' columns from num_candidates on for any decision, read by its
        attributes (the JSON columns through the memos)."""
        cdef Py_ssize_t j
        self._int_col(buf, ptext, 3, d.num_candidates, 1, pint, pint_live)
        self._int_col(buf, ptext, 4, d.position, 2, pint, pint_live)
        self._text_col(buf, ptext, 5, cached_field(q, d.queue))
        self._text_col(buf, ptext, 6, csv_field(d.responsible or ''))
        self._num_col(buf, ptext, 7, d.responsible_p_before, 0, pflt, pflt_live, ff)
        self._num_col(buf, ptext, 8, d.responsible_p_after, 1, pflt, pflt_live, ff)
        self._text_col(buf, ptext, 9, csv_field(d.runner_up or ''))
        self._num_col(buf, ptext, 10, d.runner_up_p, 2, pflt, pflt_live, ff)
        for j in range(11, 14):
            self._text_col(buf, ptext, j, "")
        self._json_generic(buf, 0, d.segments, seg_memo, jtext, jkeys, jvals, jok, jint_ok)
        self._json_generic(buf, 1, d.rank, rank_memo, jtext, jkeys, jvals, jok, jint_ok)
        return 0

    cdef bint _lru_codable(self, LRUDecision d) except -1:
        """d's row can be coded from its fields: its freed_t has a JSON text (kept in
        lru_t for _lru_row; a float's the coder's reader always takes)."""
        cdef object t
        if self.lru_t is not None and d.freed_ns == self.lru_ns:
            return True
        t = json_value(freed_seconds(d.freed_ns))
        if t is None:
            return False
        self.lru_ns = d.freed_ns
        self.lru_t = t
        return True

    cdef int _lru_row(self, _RowBuf *buf, list ptext, LRUDecision d, long long *pint,
                      bint *pint_live, bint *pflt_live, object q, JsonMemo seg_memo,
                      list jtext, list jkeys, list jvals, list jok, long long *jint,
                      bint *jint_ok) except -1:
        """_evict_rows' columns from num_candidates on for d (_lru_codable), as they code
        d's Decision (no responsible group, runner-up or segments; rank its freed_t)."""
        cdef long long iv[1]
        cdef PyObject *ov[1]
        cdef char kinds[1]
        cdef Py_ssize_t j
        self._int_col_c(buf, ptext, 3, d.num_cand, 1, pint, pint_live)
        self._int_col_c(buf, ptext, 4, 0, 2, pint, pint_live)
        self._text_col(buf, ptext, 5, cached_field(q, "lru"))
        for j in range(6, 14):
            self._text_col(buf, ptext, j, "")
        pflt_live[0] = pflt_live[1] = pflt_live[2] = False
        self._json_generic(buf, 0, None, seg_memo, jtext, jkeys, jvals, jok, jint_ok)
        kinds[0] = _PS_TEXT
        ov[0] = <PyObject *>self.lru_t
        self._fields_json(buf, 1, _LRU_RANK_KEYS, 1, kinds, iv, ov, jtext, jkeys, jvals,
                          jok, jint, jint_ok)
        return 0

    cdef bint _plain_name(self, object s) except -1:
        """s is a str _json_value writes as it is, whose text the coder's reader takes."""
        if type(s) is not str:
            return False
        if s in self.plain_names:
            return True
        if not plain_value(<str>s) or '\x7f' in <str>s:
            return False
        if len(self.plain_names) >= 256:
            self.plain_names.clear()
        self.plain_names.add(s)
        return True

    cdef int _ps_row(self, _RowBuf *buf, list ptext, PSDecision d, long long *pint,
                     bint *pint_live, double *pflt, bint *pflt_live, object q, NumberTexts ff,
                     list jtext, list jkeys, list jvals, list jok,
                     long long *jint, bint *jint_ok) except -1:
        """_evict_rows' columns from num_candidates on for d (_ps_codable), as they code
        d's Decision: the same texts, compared with the last row's as numbers where
        they are numbers, and the JSON columns' values as the memos would give them."""
        cdef long long iv[_PS_JSON_MAX]
        cdef PyObject *ov[_PS_JSON_MAX]
        cdef char kinds[_PS_JSON_MAX]
        self._int_col_c(buf, ptext, 3, d.num_cand, 1, pint, pint_live)
        self._int_col_c(buf, ptext, 4, 0, 2, pint, pint_live)
        self._text_col(buf, ptext, 5, cached_field(q, d.queue))
        self._text_col(buf, ptext, 6, csv_field(d.responsible or ''))
        self._num_col_c(buf, ptext, 7, d.responsible_p_before, 0, pflt, pflt_live, ff)
        self._num_col_c(buf, ptext, 8, d.responsible_p_after, 1, pflt, pflt_live, ff)
        if d.runner_up is None:
            self._text_col(buf, ptext, 9, "")
            self._text_col(buf, ptext, 10, "")
            pflt_live[2] = False
        else:
            self._text_col(buf, ptext, 9, csv_field(d.runner_up or ''))
            self._num_col_c(buf, ptext, 10, d.runner_p, 2, pflt, pflt_live, ff)
        for j in range(11, 14):
            self._text_col(buf, ptext, j, "")
        # segments, by sorted key: normal, probationary, reuse
        kinds[0] = kinds[1] = kinds[2] = _PS_INT
        iv[0] = d.live[1]
        iv[1] = d.live[0]
        iv[2] = d.live[2]
        self._fields_json(buf, 0, _PS_SEG_KEYS, 3, kinds, iv, ov, jtext, jkeys, jvals, jok,
                          jint, jint_ok)
        # rank: class, freed_seq, global_fallback, owner_contract, owner_norm_debt,
        # owner_raw_debt, segment
        kinds[0] = kinds[3] = kinds[6] = _PS_NAME
        kinds[1] = _PS_INT
        kinds[2] = kinds[4] = kinds[5] = _PS_TEXT
        ov[0] = <PyObject *>d.class_name
        iv[1] = d.freed_seq
        ov[2] = <PyObject *>_JSON_FALSE
        ov[3] = <PyObject *>d.contract_name
        ov[4] = <PyObject *>self.ps_norm_t
        ov[5] = <PyObject *>self.ps_raw_t
        ov[6] = <PyObject *>d.seg_name
        self._fields_json(buf, 1, _PS_RANK_KEYS, 7, kinds, iv, ov, jtext, jkeys, jvals, jok,
                          jint, jint_ok)
        return 0

    cdef int _fields_json(self, _RowBuf *buf, int k, list keys, Py_ssize_t n, char *kinds,
                          long long *iv, PyObject **ov, list jtext, list jkeys, list jvals,
                          list jok, long long *jint, bint *jint_ok) except -1:
        """JSON column k of a row coded from its fields (_ps_row, _lru_row): the keys
        given (sorted, as the memos order them) and n values, value j an integer iv[j],
        a name ov[j] (its text is it quoted) or a text ov[j], by kinds[j]; coded against
        the last row's as the memo's texts would be."""
        cdef str c, v
        cdef list vals, texts
        cdef Py_ssize_t j, at
        if jkeys[k] is keys or jkeys[k] == keys:
            _buf_put(buf, ",", 1)           # the keys: as the last row's
            vals = jvals[k]
            for j in range(n):
                at = k * _PS_JSON_MAX + j
                if kinds[j] == _PS_INT:
                    if jint_ok[at] and jint[at] == iv[j]:
                        _buf_put(buf, ",", 1)
                        continue
                    c = str(iv[j])
                    jint[at] = iv[j]
                    jint_ok[at] = True
                elif kinds[j] == _PS_NAME:
                    v = <str>ov[j]
                    if _quoted_eq(vals[j], v):
                        _buf_put(buf, ",", 1)
                        continue
                    c = '"' + v + '"'
                else:
                    c = <str>ov[j]
                self._text_col(buf, vals, j, c)
        else:
            texts = []
            for j in range(n):
                at = k * _PS_JSON_MAX + j
                if kinds[j] == _PS_INT:
                    texts.append(str(iv[j]))
                    jint[at] = iv[j]
                    jint_ok[at] = True
                elif kinds[j] == _PS_NAME:
                    texts.append('"' + <str>ov[j] + '"')
                else:
                    texts.append(<str>ov[j])
            tmp = []
            self.enc.known_codes(tmp, (jtext[k], jkeys[k], jvals[k], jok[k]), keys, texts)
            for c in tmp:
                _buf_code(buf, c)
            jvals[k] = texts
        jkeys[k] = keys
        jtext[k] = None
        jok[k] = True
        return 0

    cdef int _num_col(self, _RowBuf *buf, list ptext, Py_ssize_t j, object x, int k,
                      double *pflt, bint *pflt_live, object ff) except -1:
        """Own column j's field for the number x (_number's text, '' for None): a float
        equal to the last row's is its text (the text is a function of the value)."""
        if type(x) is float and pflt_live[k] and <double>x == pflt[k]:
            _buf_put(buf, ",", 1)
            return 0
        self._text_col(buf, ptext, j, '' if x is None else number_text(x, ff))
        pflt_live[k] = type(x) is float
        if pflt_live[k]:
            pflt[k] = <double>x
        return 0

    cdef int _json_generic(self, _RowBuf *buf, int k, object x, JsonMemo m, list jtext,
                           list jkeys, list jvals, list jok, bint *jint_ok) except -1:
        """JSON column k (0: segments, 1: rank) of an eviction row for the value x, its
        keys and value texts through the memo m (the text path where m does not take
        x), coded against the last row's (jtext, jkeys, jvals, jok at k)."""
        cdef Py_ssize_t j
        cdef object t = None
        cdef str c
        cdef list mv, vals, tmp
        cdef tuple pj
        cdef dict json_now
        for j in range(_PS_JSON_MAX):
            jint_ok[k * _PS_JSON_MAX + j] = False
        if not x:
            t = ""
        elif type(x) is dict and memo_update(m, <dict>x):
            if m.num_odd:
                t = memo_text(m)
        else:
            t = csv_json(x)
        if t is None and (m.order is jkeys[k] or m.order == jkeys[k]):
            # coded by key, against the last row's values
            _buf_put(buf, ",", 1)
            mv = m.vtexts
            vals = jvals[k]
            for j in range(len(mv)):
                self._text_col(buf, vals, j, mv[j])
            jkeys[k] = m.order
            jtext[k] = None
            jok[k] = True
            return 0
        pj = (jtext[k], jkeys[k], jvals[k], jok[k])
        tmp = []
        if t is None:
            self.enc.known_codes(tmp, pj, m.order, m.vtexts)
            jtext[k], jkeys[k], jvals[k], jok[k] = None, m.order, list(m.vtexts), True
        elif jok[k] and jtext[k] is not None and t == jtext[k]:
            tmp.append("")
            tmp.extend([""] * len(jkeys[k]))
        else:
            json_now = {}
            self.enc.json_codes(tmp, 19 if k == 0 else 23, pj, t, json_now)
            pj = json_now[19 if k == 0 else 23]
            jtext[k], jkeys[k], jvals[k], jok[k] = pj[0], pj[1], list(<list>pj[2]), pj[3]
        for c in tmp:
            _buf_code(buf, c)
        return 0
