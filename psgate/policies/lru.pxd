# C declarations for lru.py (Cython's pure-Python mode): its Decision's fields, which the
# compact ledger's coder reads as C fields, and the types of the queue walks.

from psgate.flat cimport ints, llongs
from psgate.policy.field_decision cimport FieldDecision

cdef long long EXACT

cpdef object freed_seconds(long long ns)

cdef class LRUDecision(FieldDecision):
    cdef readonly long long freed_ns
    cdef object rank_d
