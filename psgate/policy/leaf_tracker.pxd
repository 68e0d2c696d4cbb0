# C declarations for leaf_tracker.py (Cython's pure-Python mode): LeafTracker's fields,
# declared once here, and its methods, which PrefixShield's compiled paths call as C
# methods.

cimport cython

from psgate.flat cimport ints


@cython.final
cdef class LeafTracker:
    cdef readonly Py_ssize_t num_blocks
    cdef readonly object parent             # array('i'), per block: -1 for none
    cdef readonly object parent_gen         # array('i'): the parent's gen when linked
    cdef readonly object gen                # array('i'), per block
    cdef readonly object children           # array('i'): resident children
    cdef int *c_parent                      # the arrays' items (they never grow)
    cdef int *c_parent_gen
    cdef int *c_gen
    cdef int *c_children

    cdef inline int _check(self, Py_ssize_t b, Py_ssize_t parent) except -1
    cpdef void cached(self, int b, int parent) except *
    cpdef bint is_leaf(self, int b) except -1
    cpdef int evicted(self, int b) except -2
