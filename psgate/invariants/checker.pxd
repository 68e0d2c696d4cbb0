# C declarations for checker.py (Cython's pure-Python mode): its per-block loops, which
# the compiled engine calls as C functions.

from psgate.flat cimport ints, llongs

cpdef tuple pin_hits(checker, list ns_keys, list hits)
cpdef tuple pin_new(checker, list new_blocks)
cpdef void cache_keys(checker, list cached) except *
cpdef tuple evict_run(checker, list blocks, Py_ssize_t start)
cpdef void release(checker, list blocks) except *
