# C declarations for checker.py (Cython's pure-Python mode): InvariantChecker's fields,
# declared once here (a cdef class), and its per-block loops, which the compiled engine
# calls as C functions and which read the fields as C fields.

from psgate.flat cimport ints, llongs


cdef class InvariantChecker:
    cdef public Py_ssize_t num_blocks
    cdef public Py_ssize_t num_usable
    cdef public bint paranoid
    cdef object _parent_of
    cdef public object parent_table        # array('q'), or None
    cdef public int key_shift
    cdef public object opaque_keys_from    # up to 1 << 63: a Python int
    cdef public object ref                 # array('i')
    cdef public object key                 # array('q')
    cdef public Py_ssize_t num_resident
    cdef public Py_ssize_t num_candidates
    cdef public dict res
    cdef public object res_ns              # array('i')
    cdef public object res_cnt             # array('q')
    cdef public Py_ssize_t num_orphans
    cdef public Py_ssize_t max_orphans
    cdef public Py_ssize_t orphans_created
    cdef public dict verdicts

    cpdef admitted(self, where, ns_keys, hits, max_hits, new_blocks, cached)
    cpdef evicted_many(self, where, blocks)
    cpdef check_accounting(self, where, num_truly_free, num_candidates, engine=*, policy=*)


cpdef tuple pin_hits(InvariantChecker checker, list ns_keys, list hits)
cpdef tuple pin_new(InvariantChecker checker, list new_blocks)
cpdef void cache_keys(InvariantChecker checker, list cached) except *
cpdef tuple evict_run(InvariantChecker checker, list blocks, Py_ssize_t start)
cpdef void release(InvariantChecker checker, list blocks) except *
cpdef Py_ssize_t num_keys_from(list cached, long long first) except -1
