# What compiled callers of flat.py take: pointers to the items of an array('i'), an
# array('q') and a bytearray, each checked for its item type; and an array('q') grown by one.

from cpython cimport array as carray
from cpython.bytearray cimport PyByteArray_AS_STRING


cdef inline int *ints(object a) except? NULL:
    if a is None:
        raise TypeError("expected an array of C ints ('i'), found None")
    cdef carray.array x = <carray.array?>a
    if x.ob_descr.typecode != c'i':
        raise TypeError(f"expected an array of C ints ('i'), found '{a.typecode}'")
    return x.data.as_ints


cdef inline long long *llongs(object a) except? NULL:
    if a is None:
        raise TypeError("expected an array of C long longs ('q'), found None")
    cdef carray.array x = <carray.array?>a
    if x.ob_descr.typecode != c'q':
        raise TypeError(f"expected an array of C long longs ('q'), found '{a.typecode}'")
    return x.data.as_longlongs


cdef inline unsigned char *byte_items(object a) except? NULL:
    return <unsigned char *>PyByteArray_AS_STRING(<bytearray?>a)


cdef inline int append_llong(object a, long long v) except -1:
    cdef long long *items = llongs(a)      # checks the item type
    cdef carray.array x = <carray.array>a
    cdef Py_ssize_t n = len(x)
    carray.resize_smart(x, n + 1)
    x.data.as_longlongs[n] = v
    return 0


cdef inline int truncate_llongs(object a, Py_ssize_t n) except -1:
    llongs(a)                              # checks the item type
    cdef carray.array x = <carray.array>a
    if not 0 <= n <= len(x):
        raise IndexError(f"cannot cut an array of {len(x)} items to {n}")
    carray.resize_smart(x, n)
    return 0
