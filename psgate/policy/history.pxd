# C declarations for history.py (Cython's pure-Python mode): PrefixHistory's fields, declared
# once here, and the C types of its methods, which the compiled core calls as C methods.

from psgate.flat cimport append_llong, ints, llongs


cdef class PrefixHistory:
    cdef public long long bound
    cdef public object shift            # key_shift, or None: every key in the dict
    cdef public long long mask
    cdef public long long slotted_below  # keys in [0, this) may have a slot
    cdef public object slot_ns          # array('i')
    cdef public object slot_stamp       # array('q')
    cdef public dict other
    cdef public long long clock
    cdef public dict label_ids
    cdef public list label_names
    cdef public list keys
    cdef public list stamps
    cdef public list head
    cdef public list num_live
    cdef public Py_ssize_t compact_min
    cdef dict __dict__                  # a policy may keep its own attributes on it

    cpdef Py_ssize_t add_group(self)
    cpdef long long key_of(self, object prefix) except? -1
    cdef Py_ssize_t _slot(self, long long key) except -2
    cpdef void grow_slots(self, Py_ssize_t h) except *
    cpdef long long stamp(self, Py_ssize_t g, long long key) except? -2
    cpdef void set_stamp(self, Py_ssize_t g, long long key, long long stamp) except *
    cpdef bint contains(self, Py_ssize_t g, object prefix) except -1
    cpdef void touch(self, Py_ssize_t g, object prefix) except *
    cpdef list contains_keys(self, Py_ssize_t g, keys)
    cpdef void touch_keys(self, Py_ssize_t g, keys) except *
    cdef void _drop_oldest(self, Py_ssize_t g) except *
    cpdef void compact(self, Py_ssize_t g) except *
    cpdef list items(self, Py_ssize_t g)


cdef long long _slot_stamp(PrefixHistory hist, long long k) except *
