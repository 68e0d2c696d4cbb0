# C declarations for seq_queues.py (Cython's pure-Python mode): SeqQueues' fields, declared
# once here, and its methods, which PrefixShield's compiled paths call as C methods.

cimport cython

from psgate.flat cimport append_llong, ints, llongs, truncate_llongs

cdef int COMPACT_SLACK

cdef inline bint before(long long s1, long long b1, long long s2, long long b2) noexcept
cdef inline bint is_live(int *where, long long *sq, int q, long long s,
                        long long b) noexcept
cdef inline void put(long long *a, Py_ssize_t i, long long s, long long b) noexcept
cdef void sift_down(long long *a, Py_ssize_t n, Py_ssize_t i, long long s,
                    long long b) noexcept
cdef int heap_push(object h, long long s, long long b) except -1
cdef int heap_pop(object h) except -1
cdef void heapify(long long *a, Py_ssize_t n) noexcept


@cython.final
cdef class SeqQueues:
    cdef readonly Py_ssize_t num_blocks
    cdef readonly object where          # array('i')
    cdef readonly object seq            # array('q')
    cdef readonly object live           # array('q'), per queue
    cdef list heaps                     # per queue, an array('q') of (seq, block) entries

    cpdef Py_ssize_t add_queue(self) except -1
    cpdef void push(self, int q, int b, long long seq) except *
    cpdef void remove(self, int b) except *
    cpdef void compact(self, int q) except *
    cpdef int head(self, int q) except -2
    cpdef int first_queue(self, int q, int num) except -1
    cpdef tuple first_two_families(self, list families, int width)
    cpdef list items(self, int q)
    cpdef void gather(self, SeqQueues other, Py_ssize_t stride) except *
