# C declarations for pool_work.py (Cython's pure-Python mode): the pool's loops, and the
# hook through which they call a compiled policy's on_cached as a C method.

from psgate.flat cimport byte_items, ints, llongs
from psgate.invariants.checker cimport InvariantChecker


cdef class CachedHook:
    cdef int block_cached(self, int block, Py_ssize_t pos, int parent, object key,
                          Py_ssize_t num_prompt) except -1

cimport cython


@cython.no_gc      # held only while a check runs: never part of a cycle
cdef class Where:
    cdef object eng
    cdef object r

cpdef void free_in_order(eng, list blocks) except *
cpdef void take_hits(eng, r, list hits) except *
cpdef list get_new_blocks(eng, r, Py_ssize_t num_new)
cpdef void evicted_batch(eng, r, victims, decisions, Py_ssize_t num_asked) except *
cpdef void check_batch(eng, r, keys, hits, Py_ssize_t max_hits, new, cached_now,
                       Py_ssize_t num_new_full, more_groups=*) except *
cpdef tuple lookup(pool, list evb, int ns, Py_ssize_t num)
cpdef long long cache_blocks(pool, list blocks, list evb, Py_ssize_t start, Py_ssize_t stop,
                             int ns, long long block_size, list cached_now, on_cached,
                             preq) except? -1
cpdef void touch(pool, list hits, queues, on_touch, on_hit, preq) except *
cpdef list take_free(pool, Py_ssize_t num)
cpdef void pin_allocated(pool, list new, int g) except *
cpdef tuple release(pool, list blocks)
cpdef Py_ssize_t drop_evicted(pool, list victims, Py_ssize_t num_valid, hash_names, owners,
                              list names, list gnames, dict num_by_owner,
                              on_row=*) except -1
