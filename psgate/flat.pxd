# What compiled callers of flat.py take: pointers to the items of an array('i'), an
# array('q'), an array('d') and a bytearray, each checked for its item type; and an
# array('q') grown by one or cut.

from cpython cimport array as carray
from cpython.bytearray cimport PyByteArray_AS_STRING


# The common case (an array.array itself, of the right item type) is a type and a code
# compared, small enough for the C compiler to inline into each loop; anything else (a
# subclass of array, another item type, None) goes through items_of, out of line.

cdef inline char *items_of(object a, char code) except NULL:
    """The items of ``a``, an array (or a subclass) of item type ``code``, else TypeError."""
    cdef str name = {"i": "C ints", "q": "C long longs", "d": "C doubles"}[chr(code)]
    if isinstance(a, carray.array) and (<carray.array>a).ob_descr.typecode == code:
        return (<carray.array>a).data.as_chars
    found = "None" if a is None else (f"'{a.typecode}'" if isinstance(a, carray.array)
                                      else type(a).__name__)
    raise TypeError(f"expected an array of {name} ('{chr(code)}'), found {found}")


cdef inline int *ints(object a) except? NULL:
    if type(a) is carray.array and (<carray.array>a).ob_descr.typecode == c'i':
        return (<carray.array>a).data.as_ints
    return <int *>items_of(a, c'i')


cdef inline long long *llongs(object a) except? NULL:
    if type(a) is carray.array and (<carray.array>a).ob_descr.typecode == c'q':
        return (<carray.array>a).data.as_longlongs
    return <long long *>items_of(a, c'q')


cdef inline double *doubles(object a) except? NULL:
    if type(a) is carray.array and (<carray.array>a).ob_descr.typecode == c'd':
        return (<carray.array>a).data.as_doubles
    return <double *>items_of(a, c'd')


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
