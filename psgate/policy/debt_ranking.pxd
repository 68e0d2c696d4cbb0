# C declarations for debt_ranking.py (Cython's pure-Python mode): DebtRanking's fields,
# declared once here, and its methods, which PrefixShield's compiled paths call as C
# methods.

cimport cython

from psgate.flat cimport doubles, ints, llongs
from psgate.policy.buckets cimport TokenBuckets

cdef int KHEAP_SLACK
cdef int BATCH, TAKEN, FIRST_K

cdef inline bint before(double k1, double g1, double v1, double k2, double g2,
                        double v2) noexcept
cdef inline void put(double *a, Py_ssize_t i, double k, double g, double v) noexcept
cdef void sift_down(double *a, Py_ssize_t n, Py_ssize_t i, double k, double g,
                    double v) noexcept
cdef void sift_up(double *a, Py_ssize_t i, double k, double g, double v) noexcept
cdef Py_ssize_t pop_top(double *a, Py_ssize_t n) noexcept
cdef inline bint live(double *a, Py_ssize_t i, long long *gver, int *moved,
                      long long *elig, bint in_batch) noexcept


@cython.final
cdef class DebtRanking:
    cdef readonly TokenBuckets buckets
    cdef readonly object num_eligible       # array('q'), per group (the policy's)
    cdef readonly double min_rho
    cdef readonly Py_ssize_t num_groups
    cdef readonly object gver               # array('q'), per group
    cdef readonly object moved              # array('i'), per group: 1 or 0
    cdef readonly object moved_p            # array('d'), per group
    cdef object moved_order                 # array('i'), its first num_moved items
    cdef readonly Py_ssize_t num_moved
    cdef list heaps                         # per slot, an array('d') of entries
    cdef object hlen                        # array('q'), per slot
    cdef readonly object kval               # array('q'), per per-k heap
    cdef readonly Py_ssize_t num_compactions
    cdef readonly int num_top, top_g, runner_g
    cdef readonly double top_p, runner_p
    cdef double front_p                     # _frontier's best P
    cdef readonly list ties
    cdef readonly bint valid                # the result fields hold the batch's ranking
    cdef readonly int run_g, run_runner     # the run of victims of run_g (-1: none)
    cdef readonly double run_p, run_runner_p, run_w
    cdef readonly Py_ssize_t run_n
    cdef object iw                          # array('d'), per group: 1 / W_g
    cdef object iw_ok                       # array('i'), per group: iw holds it

    cpdef Py_ssize_t add_group(self) except -1
    cdef inline int _check(self, Py_ssize_t g) except -1
    cpdef double p(self, int g, double t) except? -1.0
    cpdef void drop(self, int g) except *
    cpdef double inv_w(self, int g, double t) except? -1.0
    cdef int _push(self, Py_ssize_t s, double k, double g, double v) except -1
    cdef Py_ssize_t _kslot(self, long long k) except -1
    cdef int _compact(self, Py_ssize_t s) except -1
    cpdef dict heap_sizes(self)
    cdef int _set_moved(self, int g, double p) except -1
    cpdef void relist(self, int g) except *
    cpdef void line_moved(self, int g) except *
    cpdef void responsible(self, int g, double p_after, long long num) except *
    cpdef Py_ssize_t end_batch(self) except -1
    cdef int _scan(self, long long *hlen, long long *gver, int *moved,
                   long long *elig) except -1
    cdef Py_ssize_t _frontier(self, double t, long long *hlen, long long *gver, int *moved,
                              long long *elig) except -2
    cpdef int rank(self, double t) except -1
    cpdef tuple ranked(self, double t)
    cpdef int start_batch(self, double t) except -1
    cpdef void forget(self) noexcept
    cpdef int rank_cached(self, double t) except -1
    cpdef tuple cached(self, double t)
    cdef int _settle(self, int g, double p_after, long long num, bint keep, int runner,
                     double runner_p) except -1
    cpdef void took(self, int g, double p_after) except *
    cpdef void run(self, int g, double p_after, int runner, double runner_p,
                   double w) except *
    cpdef void flush(self) except *
