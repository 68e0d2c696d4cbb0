"""Creation debt as token buckets: one bucket per (group, contract), and per group the
kinetic sums of its buckets in debt, which PrefixShield ranks groups by.

    bhat(i, t)       = min(beta_i, B_i + rho_i (t - t0_i))     bucket i's balance at t
    charge(i, n, t):   B_i = bhat(i, t) - n, t0_i = t; in debt (B_i < 0) until
                       zero_t_i = t - B_i / rho_i
    S_g, k_g         = the sum of zero_t and the number of g's buckets in debt

A group's debt at time t is then a line in t (the policy's P_g = min_rho (S_g - k_g t)),
which stays valid until one of its buckets clears: ``clear_next(t)`` takes the next bucket
whose zero_t has passed out of its group's sums. The clearing times wait in a heap of
``(zero_t, bucket, version)``; a charge bumps the bucket's version, so its older entry
goes stale and is skipped, and the heap is compacted when its stale entries outnumber the
buckets (a tenant deep in debt is charged by every request long before time reaches its
zero_t: uncompacted, the heap grew with the trace). Entries are distinct tuples, so the
order they leave in does not depend on the heap's layout.

The module is written in Cython's pure-Python mode and is its own source: ``pip install``
compiles it (``buckets.pxd`` declares :class:`TokenBuckets`' fields and methods, which
PrefixShield's compiled paths call as C methods), and without a compiler it runs as written.
The invariant auditor (``psgate.invariants.prefixshield.BucketAudit``) keeps its own
refill on purpose: it checks this one.
"""

try:
    import cython
except ImportError:
    from psgate import cython_shadow as cython

from array import array
from heapq import heapify, heappop, heappush

if not cython.compiled:     # compiled, buckets.pxd cimports them
    from psgate.flat import doubles, ints, llongs

# Stale clearing-time entries tolerated beyond two per bucket before a compaction.
ZHEAP_SLACK = 64


@cython.cclass
class TokenBuckets:
    """The buckets (indices from 0, in the order they were made) and the groups' kinetic
    sums (the module docstring has the arithmetic). Per bucket i: ``B``, ``t0``,
    ``zero_t`` (-inf while not in debt), ``rho``, ``beta`` and ``w`` (its contract's
    weight) are ``array('d')``s, ``version`` an ``array('q')``, ``group`` an
    ``array('i')``; ``index[(g, c)]`` is g's bucket for contract c. Per
    group g: ``S[g]``, ``k[g]`` and ``group_buckets[g]``, its buckets in order."""

    def __init__(self):
        self.B = array("d")
        self.t0 = array("d")
        self.zero_t = array("d")
        self.rho = array("d")
        self.beta = array("d")
        self.w = array("d")
        self.version = array("q")
        self.group = array("i")
        self.index = {}
        self.S = array("d")
        self.k = array("q")
        self.group_buckets = []
        self.zheap = []

    def add_group(self):
        """A group with no bucket yet; its index."""
        self.S.append(0.0)
        self.k.append(0)
        self.group_buckets.append([])
        return len(self.group_buckets) - 1

    def add(self, g, c, rho, beta, w, t):
        """Group g's bucket for contract c (which refills at rho blocks/s up to beta, and
        weighs w), full at time t; its index."""
        i: cython.Py_ssize_t = len(self.B)
        self.index[(g, c)] = i
        self.B.append(beta)
        self.t0.append(t)
        self.zero_t.append(float("-inf"))
        self.rho.append(rho)
        self.beta.append(beta)
        self.w.append(w)
        self.version.append(0)
        self.group.append(g)
        self.group_buckets[g].append(i)
        return i

    @cython.boundscheck(False)
    @cython.wraparound(False)
    def bhat(self, i, t):
        """Bucket i's balance at t: min(beta, B + rho (t - t0)), as Python's min picks."""
        if not 0 <= i < len(self.B):
            raise IndexError(f"bucket {i} out of range")
        x: cython.double = doubles(self.B)[i] + doubles(self.rho)[i] * (t - doubles(self.t0)[i])
        beta: cython.double = doubles(self.beta)[i]
        return x if x < beta else beta

    @cython.boundscheck(False)
    @cython.wraparound(False)
    def charge(self, i, n, t):
        """Bucket i is charged n blocks at time t; its new balance. Its group's sums follow
        it into or out of debt."""
        if not 0 <= i < len(self.B):
            raise IndexError(f"bucket {i} out of range")
        old_z: cython.double = doubles(self.zero_t)[i]
        b: cython.double = self.bhat(i, t) - n
        z: cython.double
        g: cython.Py_ssize_t = ints(self.group)[i]
        S: cython.p_double = doubles(self.S)
        k: cython.p_longlong = llongs(self.k)
        ver: cython.p_longlong = llongs(self.version)
        doubles(self.B)[i] = b
        doubles(self.t0)[i] = t
        z = t - b / doubles(self.rho)[i] if b < 0 else float("-inf")
        doubles(self.zero_t)[i] = z
        ver[i] += 1
        if old_z > t:                # was counted in S_g / k_g
            S[g] -= old_z
            k[g] -= 1
        if z > t:
            S[g] += z
            k[g] += 1
            zh = self.zheap
            heappush(zh, (z, i, ver[i]))
            if len(zh) > 2 * len(self.B) + ZHEAP_SLACK:
                zh[:] = [e for e in zh if e[2] == self.version[e[1]]]
                heapify(zh)
        if k[g] == 0:
            S[g] = 0.0
        return b

    def clear_next(self, t):
        """The next bucket whose debt has cleared by t leaves its group's sums; that
        group, or -1 when none is left to clear."""
        zh = self.zheap
        ver: cython.p_longlong = llongs(self.version)
        i: cython.Py_ssize_t
        g: cython.Py_ssize_t
        while zh and zh[0][0] <= t:
            z, i, v = heappop(zh)
            if v != ver[i]:
                continue
            g = ints(self.group)[i]
            doubles(self.S)[g] -= z
            llongs(self.k)[g] -= 1
            if llongs(self.k)[g] == 0:
                doubles(self.S)[g] = 0.0
            ver[i] += 1
            return g
        return -1

    def debts(self, g, t):
        """(raw debt, normalized debt, W_g) of group g at t: the sums over its buckets, in
        their order, of max(0, -bhat) and of that over the bucket's weight, each from the
        int 0 as ``sum()`` starts; W_g, the largest weight among its buckets in debt at t
        (the first of equals), else 1.0."""
        buckets: list = self.group_buckets[g]
        if not buckets:
            return 0, 0, 1.0
        raw: cython.double = 0.0        # 0 + owed is owed, as from the int 0
        norm: cython.double = 0.0
        owed: cython.double
        i: cython.Py_ssize_t
        for i in buckets:
            owed = -self.bhat(i, t)
            if not owed > 0.0:
                owed = 0.0
            raw += owed
            norm += owed / doubles(self.w)[i]
        return raw, norm, self.weight(g, t)

    def weight(self, g, t):
        """W_g at t (see debts), without the sums."""
        w: cython.double = 1.0
        found: cython.bint = False
        i: cython.Py_ssize_t
        for i in self.group_buckets[g]:
            if doubles(self.zero_t)[i] > t and (not found or doubles(self.w)[i] > w):
                w = doubles(self.w)[i]
                found = True
        return w

    def raw_debt(self, g, t):
        """Group g's debt at t in blocks: debts' first."""
        return self.debts(g, t)[0]

    def norm_debt(self, g, t):
        """Group g's debt at t in weighted blocks: debts' second."""
        return self.debts(g, t)[1]
