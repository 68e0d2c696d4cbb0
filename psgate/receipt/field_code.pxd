# C declarations for field_code.py (Cython's pure-Python mode): the compact ledger's
# codes, which the compiled coder of psgate._core cimports.

from psgate.receipt.row_text cimport csv_field


cdef class Number:
    cdef public long long value
    cdef public int places


cdef int INT, TIME, BIG_TIME, DECIMAL

cpdef int scan(str s, Number num) except -1
cpdef bint is_int(str s) except -1
cpdef bint int_in(str s, Number num) except -1
cpdef bint is_time(str s) except -1
cpdef bint decimal_in(str s, Number num) except -1


cdef class FieldCoder:
    cdef readonly Number cur, pred, delta

    cpdef int step(self, str cur, str pred) except -1
    cpdef str code(self, str cur, str pred)


cpdef list split_row(str line)


cdef class HashIds:
    cdef readonly Py_ssize_t limit
    cdef dict ids
    cdef list names

    cpdef Py_ssize_t see(self, str h) except -2
    cpdef str name(self, hid)


cdef class CompactEncoder:
    cdef readonly list columns, shared_cols, own_cols, json_cols
    cdef readonly Py_ssize_t num_cols, kind_col, seq_at, hash_col, hash_at
    cdef readonly HashIds hashes
    cdef public tuple last, blank
    cdef public dict by_kind
    cdef readonly FieldCoder field_coder

    cpdef list encode(self, str line)
    cpdef str encode_text(self, rows)
    cpdef list encode_fields(self, list fields)
    cpdef str seq_pred(self)
    cpdef int json_codes(self, list out, Py_ssize_t i, tuple pj, str text,
                         dict json_now) except -1
    cpdef int known_codes(self, list out, tuple pj, list keys, list values) except -1
