# C declarations for step_work.py (Cython's pure-Python mode): the tally's fields and its
# add, and the types of the step's loops.

from psgate.engines.pool_work cimport cache_blocks, check_batch, get_new_blocks, take_hits
from psgate.flat cimport ints

cdef class StepTally:
    cdef public long long num_prefill_tokens
    cdef public long long num_context_tokens
    cdef public long long num_decodes
    cdef public long long num_decode_context_tokens

    cpdef bint add(self, long long num_new, long long num_before, long long num_tokens,
                   long long num_output)

cpdef long long recomputed_tokens(long long num_lost, long long num_hit)

cpdef bint allocate_slots(eng, r, long long num_new_tokens, hits) except -1
cpdef void open_batch(eng, preq) except *
cpdef object close_batch(eng, r, long long recompute)
cpdef void check_allocation(eng, r, hits, new, cached_now) except *
cpdef Py_ssize_t computed_until(list scheduled, list num_new, Py_ssize_t i) except -1
cpdef tuple schedule_running(eng, allocate, list running, long long budget, long long thr,
                             bint fast, list scheduled, list num_new, StepTally work)
