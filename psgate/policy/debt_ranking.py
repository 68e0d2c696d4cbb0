"""The ranking of groups by projected debt: which group PrefixShield takes its next victim
from, in O(log groups) per victim.

    P_g(t) = min_rho (S_g - k_g t)        g's normalized debt (buckets.py): a line in t
    relist(g)            g's line moved (a charge, a debt cleared) or g gained its first
                         eligible block: its older entries go stale, a fresh one is pushed
    rank(t)              the groups tied at the largest P_g, that P, the runner-up and its P
    responsible(g, p, n) g gave n victims in this batch and is now projected at p
    end_batch()          the groups the batch moved go back to their lines

    The batch's ranking, kept between victims (PrefixShield takes victims one at a time):
    start_batch(t)       end_batch(), the debts cleared by t off their lines, no ranking kept
    rank_cached(t)       rank(t) where nothing has moved the ranking since the last one
    took(g, p)           g gave a victim: while g stays alone above the runner-up, the
                         ranking holds with g at p and needs no new rank
    run(g, p, ...)       the same for victim after victim of one group, written once
                         (flush) when the run ends or before anything reads the ranking

Groups with the same k_g have parallel lines and keep their order as time passes, so one
heap per k, keyed by -S_g, holds them, and the best group outside the batch is the best of
the heads. A group the batch has looked at or taken victims from leaves its line for a
fixed P (``moved``), in the batch heap. ``rank`` pulls groups from the per-k heaps into
the batch heap until no group left outside could tie the top or beat the runner-up.

An entry is (key, group, version), key being -P (batch heap) or -S_g (per-k heaps). It is
live while its version is its group's current one, the group has eligible blocks, and the
group is moved exactly when the entry is in the batch heap; anything else is stale for
good (versions only grow) and is dropped where it is met. A version is pushed once, so no
two entries are equal, the order is total, and every answer (the least entry, the least of
the root's children, the order of pops) is the same whatever the heap's layout. A per-k
heap with more than twice as many entries as there are groups, plus ``KHEAP_SLACK``, keeps
its live ones only (with many groups relisted per batch, stale entries grew with the trace).

Each heap is an ``array('d')`` holding entry i as items 3i (key), 3i + 1 (group) and
3i + 2 (version), exact as doubles below 2**53; ``hlen[s]`` is heap s's number of entries
(its array has room for more). Slot 0 is the batch heap, slot 1 a scratch heap for
``rank``'s ties, and slot s >= 2 the per-k heap of ``kval[s - 2]``, in the order the k
values were first met (which decides between per-k heads tied on P). The module is written
in Cython's pure-Python mode and is its own source: ``pip install`` compiles it
(``debt_ranking.pxd`` declares :class:`DebtRanking`'s fields and methods, which
PrefixShield's compiled paths call as C methods), and without a compiler it runs as written.
"""

try:
    import cython
except ImportError:
    from psgate import cython_shadow as cython

from array import array

if not cython.compiled:     # compiled, debt_ranking.pxd cimports them
    from psgate.flat import doubles, ints, llongs

# A per-k heap with more entries than twice the groups plus this is compacted.
KHEAP_SLACK = 32
# The heaps' slots: the batch heap, rank's scratch heap, then the per-k heaps.
BATCH, TAKEN, FIRST_K = 0, 1, 2


def before(k1, g1, v1, k2, g2, v2):
    """Whether entry (k1, g1, v1) comes before (k2, g2, v2)."""
    return k1 < k2 or (k1 == k2 and (g1 < g2 or (g1 == g2 and v1 < v2)))


def put(a, i, k, g, v):
    """Entry i of a becomes (k, g, v)."""
    a[3 * i] = k
    a[3 * i + 1] = g
    a[3 * i + 2] = v


@cython.boundscheck(False)
@cython.wraparound(False)
def sift_down(a, n, i, k, g, v):
    """Entry (k, g, v) placed in the heap of the n entries of a from entry i down (entry i
    is a hole)."""
    c: cython.Py_ssize_t
    while True:
        c = 2 * i + 1
        if c >= n:
            break
        if c + 1 < n and before(a[3 * c + 3], a[3 * c + 4], a[3 * c + 5],
                                a[3 * c], a[3 * c + 1], a[3 * c + 2]):
            c += 1
        if not before(a[3 * c], a[3 * c + 1], a[3 * c + 2], k, g, v):
            break
        put(a, i, a[3 * c], a[3 * c + 1], a[3 * c + 2])
        i = c
    put(a, i, k, g, v)


@cython.boundscheck(False)
@cython.wraparound(False)
def sift_up(a, i, k, g, v):
    """Entry (k, g, v) placed in the heap of a's first i + 1 entries from entry i (a hole)
    up."""
    p: cython.Py_ssize_t
    while i > 0:
        p = (i - 1) >> 1
        if not before(k, g, v, a[3 * p], a[3 * p + 1], a[3 * p + 2]):
            break
        put(a, i, a[3 * p], a[3 * p + 1], a[3 * p + 2])
        i = p
    put(a, i, k, g, v)


def pop_top(a, n):
    """The heap of a's n entries (n >= 1) loses its least entry; its new number."""
    n -= 1
    if n:
        sift_down(a, n, 0, a[3 * n], a[3 * n + 1], a[3 * n + 2])
    return n


@cython.boundscheck(False)
@cython.wraparound(False)
def live(a, i, gver, moved, elig, in_batch):
    """Whether entry i of a is live (over the ranking's gver, moved and num_eligible),
    in_batch for the batch heap."""
    g: cython.int = int(a[3 * i + 1])
    return a[3 * i + 2] == gver[g] and (moved[g] != 0) == in_batch and elig[g] > 0


@cython.cclass
class DebtRanking:
    """The groups ranked by P_g over ``buckets``' kinetic sums (the module docstring has
    the structure). ``num_eligible[g]`` (the policy's ``array('q')``) is how many eligible
    blocks g has: a group without any is never ranked. Per group: ``gver`` (its version),
    ``moved`` and ``moved_p`` (whether the batch moved it, and its P there). After
    ``rank``: ``num_top`` groups tied at ``top_p`` (``top_g`` the least of them, ``ties``
    all of them when more than one), ``runner_g`` (-1: none) at ``runner_p``."""

    def __init__(self, buckets, num_eligible, min_rho):
        self.buckets = buckets
        self.num_eligible = num_eligible
        self.min_rho = min_rho
        self.num_groups = 0
        self.gver = array("q")
        self.moved = array("i")
        self.moved_p = array("d")
        self.moved_order = array("i")       # the moved groups, in the order they moved
        self.num_moved = 0
        self.heaps = [array("d"), array("d")]
        self.hlen = array("q", [0, 0])
        self.kval = array("q")
        self.num_compactions = 0
        self.num_top = 0
        self.top_g = self.runner_g = -1
        self.top_p = self.runner_p = self.front_p = 0.0
        self.ties = []
        self.valid = False
        self.run_g = self.run_runner = -1
        self.run_p = self.run_runner_p = self.run_w = 0.0
        self.run_n = 0
        self.iw = array("d")
        self.iw_ok = array("i")

    def add_group(self):
        """A group, not ranked until it is relisted; its index."""
        self.gver.append(0)
        self.moved.append(0)
        self.moved_p.append(0.0)
        self.moved_order.append(0)
        self.iw.append(1.0)
        self.iw_ok.append(0)
        self.num_groups += 1
        return self.num_groups - 1

    def _check(self, g):
        if not 0 <= g < self.num_groups:
            raise IndexError(f"group {g} out of range (there are {self.num_groups})")
        return 0

    def p(self, g, t):
        """g's P at time t: where the batch moved it, or on its line."""
        self._check(g)
        if ints(self.moved)[g]:
            return doubles(self.moved_p)[g]
        return self.min_rho * (doubles(self.buckets.S)[g] - llongs(self.buckets.k)[g] * t)

    def drop(self, g):
        """g's entries go stale (it has no eligible block left)."""
        self._check(g)
        self.flush()
        llongs(self.gver)[g] += 1
        self.valid = False

    def inv_w(self, g, t):
        """1 / W_g at t (TokenBuckets.weight), kept until g's line moves (line_moved):
        W_g changes only where one of g's buckets enters or leaves debt, a charge or a
        debt that clears, and both move the line. With many groups in debt each victim
        comes from another group, and W_g per victim was a walk over g's buckets."""
        self._check(g)
        if ints(self.iw_ok)[g]:
            return doubles(self.iw)[g]
        v: cython.double = 1.0 / self.buckets.weight(g, t)
        doubles(self.iw)[g] = v
        ints(self.iw_ok)[g] = 1
        return v

    # -- the heaps ---------------------------------------------------------------
    def _push(self, s, k, g, v):
        """Entry (k, g, v) into heap s."""
        hlen: cython.p_longlong = llongs(self.hlen)
        n: cython.Py_ssize_t = hlen[s]
        h = self.heaps[s]
        if 3 * n + 3 > len(h):          # room for as many entries again (16 at first)
            h.frombytes(bytes(8 * max(len(h), 48)))
        sift_up(doubles(h), n, k, g, v)
        hlen[s] = n + 1
        return 0

    def _kslot(self, k):
        """The slot of k's heap, made empty on first use."""
        kval: cython.p_longlong = llongs(self.kval)
        j: cython.Py_ssize_t
        for j in range(len(self.kval)):
            if kval[j] == k:
                return FIRST_K + j
        self.kval.append(k)
        self.heaps.append(array("d"))
        self.hlen.append(0)
        return len(self.heaps) - 1

    @cython.boundscheck(False)
    @cython.wraparound(False)
    def _compact(self, s):
        """Per-k heap s keeps the entries of current versions of groups with eligible
        blocks (the rest are stale for good); its heads do not change."""
        a: cython.p_double = doubles(self.heaps[s])
        gver: cython.p_longlong = llongs(self.gver)
        elig: cython.p_longlong = llongs(self.num_eligible)
        n: cython.Py_ssize_t = llongs(self.hlen)[s]
        i: cython.Py_ssize_t
        m: cython.Py_ssize_t = 0
        g: cython.int
        for i in range(n):
            g = int(a[3 * i + 1])
            if a[3 * i + 2] == gver[g] and elig[g] > 0:
                put(a, m, a[3 * i], a[3 * i + 1], a[3 * i + 2])
                m += 1
        i = m // 2 - 1
        while i >= 0:
            sift_down(a, m, i, a[3 * i], a[3 * i + 1], a[3 * i + 2])
            i -= 1
        llongs(self.hlen)[s] = m
        self.num_compactions += 1
        return 0

    def heap_sizes(self):
        """The per-k heaps' numbers of entries, live or stale, by k."""
        return {self.kval[j]: self.hlen[FIRST_K + j] for j in range(len(self.kval))}

    # -- the groups -------------------------------------------------------------
    def _set_moved(self, g, p):
        """The batch holds g at P = p."""
        moved: cython.p_int = ints(self.moved)
        if not moved[g]:
            moved[g] = 1
            ints(self.moved_order)[self.num_moved] = g
            self.num_moved += 1
        doubles(self.moved_p)[g] = p
        return 0

    def relist(self, g):
        """g gained eligible blocks (or its line moved): a fresh entry where it ranks now."""
        self._check(g)
        self.flush()
        self.valid = False
        gver: cython.p_longlong = llongs(self.gver)
        k: cython.longlong
        s: cython.Py_ssize_t
        gver[g] += 1
        if llongs(self.num_eligible)[g] == 0:
            return
        if ints(self.moved)[g]:
            self._push(BATCH, -doubles(self.moved_p)[g], g, gver[g])
            return
        k = llongs(self.buckets.k)[g]
        if k > 0:
            s = self._kslot(k)
            if llongs(self.hlen)[s] > 2 * self.num_groups + KHEAP_SLACK:
                self._compact(s)
            self._push(s, -doubles(self.buckets.S)[g], g, gver[g])

    def line_moved(self, g):
        """g's buckets moved (a charge, a debt that cleared): relisted, its W_g again."""
        self._check(g)
        ints(self.iw_ok)[g] = 0
        self.relist(g)

    def responsible(self, g, p_after, num):
        """g gave ``num`` victims since its P was last written and is now at p_after."""
        self._check(g)
        self._set_moved(g, p_after)
        gver: cython.p_longlong = llongs(self.gver)
        gver[g] += num
        n: cython.Py_ssize_t = llongs(self.hlen)[BATCH]
        a: cython.p_double = doubles(self.heaps[BATCH])
        if n and a[1] == g:             # g's entry on top: replaced in place
            sift_down(a, n, 0, -p_after, g, gver[g])
        else:
            self._push(BATCH, -p_after, g, gver[g])

    def end_batch(self):
        """The moved groups back on their lines (relisted in the order they moved); how
        many there were. A ranking holds only where none moved."""
        self.flush()
        llongs(self.hlen)[BATCH] = 0
        num: cython.Py_ssize_t = self.num_moved
        order: cython.p_int = ints(self.moved_order)
        moved: cython.p_int = ints(self.moved)
        j: cython.Py_ssize_t
        for j in range(num):
            moved[order[j]] = 0
        self.num_moved = 0
        for j in range(num):
            self.relist(ints(self.moved_order)[j])
        return num

    # -- the ranking ------------------------------------------------------------
    def _scan(self, hlen, gver, moved, elig):
        """The top groups, their P, the runner-up and its P, among the batch heap only
        (the arrays' items as rank took them)."""
        a: cython.p_double
        c: cython.Py_ssize_t
        self.num_top = 0
        self.top_g = self.runner_g = -1
        self.top_p = self.runner_p = 0.0
        # Fast path, the same answer as the scan below: stale entries at the top are
        # dropped as the scan would drop them; after a live top the entries pop in heap
        # order, so the next one is the lesser of its children, and when that one is
        # live and not tied with the top, the scan would look no further. (A pop does
        # not move a heap's items; a push into the scratch heap moves only its own.)
        a = doubles(self.heaps[BATCH])
        while hlen[BATCH]:
            if live(a, 0, gver, moved, elig, True):
                self.num_top = 1
                self.top_g = int(a[1])
                self.top_p = -a[0]
                if hlen[BATCH] == 1:
                    return 0
                c = 1
                if hlen[BATCH] > 2 and not before(a[3], a[4], a[5], a[6], a[7], a[8]):
                    c = 2
                if live(a, c, gver, moved, elig, True) and a[3 * c] != a[0]:
                    self.runner_g = int(a[3 * c + 1])
                    self.runner_p = -a[3 * c]
                    return 0
                break
            hlen[BATCH] = pop_top(a, hlen[BATCH])
        # Live entries pop in order until one below the top; all of them go back.
        ties = []
        top_key: cython.double = 0.0
        key: cython.double
        g: cython.double
        v: cython.double
        hlen[TAKEN] = 0
        self.num_top = 0
        while hlen[BATCH]:
            key, g, v = a[0], a[1], a[2]
            if not live(a, 0, gver, moved, elig, True):
                hlen[BATCH] = pop_top(a, hlen[BATCH])       # stale: dropped for good
                continue
            hlen[BATCH] = pop_top(a, hlen[BATCH])
            self._push(TAKEN, key, g, v)  # in order: each lands at the end
            if not ties or key == top_key:
                ties.append(int(g))
                top_key = key
            else:
                self.runner_g = int(g)
                self.runner_p = -key
                break
        i: cython.Py_ssize_t
        for i in range(hlen[TAKEN]):
            a = doubles(self.heaps[TAKEN])
            self._push(BATCH, a[3 * i], a[3 * i + 1], a[3 * i + 2])
        ties.sort()
        self.ties = ties
        self.num_top = len(ties)
        if ties:
            self.top_g = ties[0]
            self.top_p = -top_key
        return 0

    def _frontier(self, t, hlen, gver, moved, elig):
        """The slot of the per-k heap whose head is the best group at time t (its P in
        front_p), or -1."""
        kval: cython.p_longlong = llongs(self.kval)
        a: cython.p_double
        best: cython.Py_ssize_t = -1
        best_p: cython.double = 0.0
        p: cython.double
        s: cython.Py_ssize_t
        for s in range(FIRST_K, len(self.heaps)):
            a = doubles(self.heaps[s])
            while hlen[s]:
                if live(a, 0, gver, moved, elig, False):
                    p = self.min_rho * (-a[0] - kval[s - FIRST_K] * t)
                    if best < 0 or p > best_p:
                        best = s
                        best_p = p
                    break
                hlen[s] = pop_top(a, hlen[s])
        self.front_p = best_p
        return best

    def rank(self, t):
        """The ranking at time t into num_top, top_g, top_p, ties, runner_g, runner_p.
        Groups move from the per-k heaps into the batch heap as the ranking reaches them,
        until none left outside could tie the top or beat the runner-up; so a call costs
        O(log groups) amortized."""
        s: cython.Py_ssize_t
        g: cython.int
        p: cython.double
        a: cython.p_double
        self.flush()
        self.valid = True
        # none of these arrays moves in a ranking (a push moves only its heap's items)
        hlen: cython.p_longlong = llongs(self.hlen)
        gver: cython.p_longlong = llongs(self.gver)
        moved: cython.p_int = ints(self.moved)
        elig: cython.p_longlong = llongs(self.num_eligible)
        while True:
            self._scan(hlen, gver, moved, elig)
            s = self._frontier(t, hlen, gver, moved, elig)
            if s < 0 or (self.num_top and self.front_p < self.top_p and self.runner_g >= 0
                         and self.front_p <= self.runner_p):
                return 0
            a = doubles(self.heaps[s])
            g = int(a[1])
            hlen[s] = pop_top(a, hlen[s])
            p = self.p(g, t)
            self._set_moved(g, p)
            gver[g] += 1
            self._push(BATCH, -p, g, gver[g])

    def ranked(self, t):
        """rank(t) as (top groups sorted, their P, runner-up or -1, its P)."""
        self.rank(t)
        top = [self.top_g] if self.num_top == 1 else list(self.ties) if self.num_top else []
        return top, self.top_p, self.runner_g, self.runner_p

    # -- the batch's ranking between victims ----------------------------------------
    def start_batch(self, t):
        """A batch at time t begins: the groups the last one moved go back to their lines
        (end_batch; a peek outside a batch may have moved some), buckets whose debt
        cleared by t leave their groups' lines (line_moved), and the next ranking is made
        afresh."""
        self.end_batch()
        g: cython.int = self.buckets.clear_next(t)
        while g >= 0:
            self.line_moved(g)
            g = self.buckets.clear_next(t)
        self.valid = False
        return 0

    def forget(self):
        """The next rank_cached ranks afresh (the batch's time moved)."""
        self.valid = False

    def rank_cached(self, t):
        """The ranking at t in the result fields: the last one where it still holds."""
        self.flush()
        if not self.valid:
            self.rank(t)
        return 0

    def cached(self, t):
        """rank_cached(t) as ranked's tuple."""
        self.rank_cached(t)
        top = [self.top_g] if self.num_top == 1 else list(self.ties) if self.num_top else []
        return top, self.top_p, self.runner_g, self.runner_p

    def _settle(self, g, p_after, num, keep, runner, runner_p):
        """g gave num victims and is at p_after; the ranking, where keep says g topped it
        alone ahead of runner at runner_p, holds while g stays above runner_p."""
        self.responsible(g, p_after, num)
        if keep and p_after > runner_p:
            self.num_top = 1
            self.top_g = g
            self.top_p = p_after
            self.runner_g = runner
            self.runner_p = runner_p
            self.valid = True
        else:
            self.valid = False
        return 0

    def took(self, g, p_after):
        """g gave one victim and is now projected at p_after."""
        self._check(g)
        self.flush()
        if self.valid and self.num_top == 1 and self.top_g == g:
            self._settle(g, p_after, 1, True, self.runner_g, self.runner_p)
        else:
            self._settle(g, p_after, 1, False, -1, 0.0)

    def run(self, g, p_after, runner, runner_p, w):
        """g, alone at the top ahead of runner at runner_p, gave a victim and is at
        p_after; a run of g's victims starts or goes on (w: what one victim takes off
        its P), and ends where g meets the runner-up."""
        self._check(g)
        if self.run_g != g:
            self.flush()
            self.run_g = g
            self.run_n = 0
            self.run_runner = runner
            self.run_runner_p = runner_p
            self.run_w = w
        self.run_n += 1
        self.run_p = p_after
        if not p_after > self.run_runner_p:
            self.flush()

    def flush(self):
        """The run, if any, ends: the ranking as took would have left it after each of
        its victims."""
        g: cython.int = self.run_g
        if g >= 0:
            self.run_g = -1
            self._settle(g, self.run_p, self.run_n, True, self.run_runner, self.run_runner_p)
