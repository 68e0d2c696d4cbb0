# C declarations for field_code.py (Cython's pure-Python mode): the compact ledger's field
# codes, which the compiled coder of psgate._core cimports.

cdef class Number:
    cdef public long long value
    cdef public int places


cdef int INT, TIME, BIG_TIME, DECIMAL
cdef Number SCRATCH, CUR, PRED, DELTA

cpdef int scan(str s, Number num) except -1
cpdef bint is_int(str s) except -1
cpdef bint int_in(str s, Number num) except -1
cpdef bint is_time(str s) except -1
cpdef bint decimal_in(str s, Number num) except -1
cpdef long long int_of(str s) except? -1
cpdef int step(str cur, str pred, Number delta) except -1
cpdef str code(str cur, str pred)
cpdef list split_row(str line)


cdef class HashIds:
    cdef readonly Py_ssize_t limit
    cdef dict ids
    cdef list names

    cpdef Py_ssize_t see(self, str h) except -2
    cpdef str name(self, hid)
