# C declarations for buckets.py (Cython's pure-Python mode): TokenBuckets' fields, declared
# once here, and its methods, which PrefixShield's compiled paths call as C methods.

from psgate.flat cimport doubles, ints, llongs


cdef class TokenBuckets:
    cdef readonly object B, t0, zero_t, rho, beta, w     # array('d'), per bucket
    cdef readonly object version                          # array('q'), per bucket
    cdef readonly object group                            # array('i'), per bucket
    cdef readonly dict index                              # (group, contract): bucket
    cdef readonly object S                                # array('d'), per group
    cdef readonly object k                                # array('q'), per group
    cdef readonly list group_buckets                      # per group, its buckets
    cdef readonly list zheap                              # (zero_t, bucket, version)

    cpdef Py_ssize_t add_group(self) except -1
    cpdef Py_ssize_t add(self, int g, int c, double rho, double beta, double w,
                         double t) except -1
    cpdef double bhat(self, Py_ssize_t i, double t) except? -1.0
    cpdef double charge(self, Py_ssize_t i, double n, double t) except? -1.0
    cpdef int clear_next(self, double t) except -2
    cpdef tuple debts(self, Py_ssize_t g, double t)
    cpdef double weight(self, Py_ssize_t g, double t) except? -1.0
    cpdef object raw_debt(self, Py_ssize_t g, double t)
    cpdef object norm_debt(self, Py_ssize_t g, double t)
