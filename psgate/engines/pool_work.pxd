# C declarations for pool_work.py (Cython's pure-Python mode): the pool's loops, and the
# hook through which they call a compiled policy's on_cached as a C method.

from psgate.flat cimport byte_items, ints, llongs


cdef class CachedHook:
    cdef int block_cached(self, int block, Py_ssize_t pos, int parent, object key,
                          Py_ssize_t num_prompt) except -1

cpdef tuple lookup(pool, list evb, int ns, Py_ssize_t num)
cpdef long long cache_blocks(pool, list blocks, list evb, Py_ssize_t start, Py_ssize_t stop,
                             int ns, long long block_size, list cached_now, on_cached,
                             preq) except? -1
cpdef void touch(pool, list hits, queues, on_touch, on_hit, preq) except *
cpdef list take_free(pool, Py_ssize_t num)
cpdef void pin_allocated(pool, list new, int g) except *
cpdef tuple release(pool, list blocks)
cpdef Py_ssize_t drop_evicted(pool, list victims, Py_ssize_t num_valid, hash_names, owners,
                              list names, list gnames,
                              dict num_by_owner) except -1
