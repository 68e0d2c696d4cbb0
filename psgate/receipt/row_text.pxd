# C declarations for row_text.py (Cython's pure-Python mode): the fields of the ledger's
# and requests.csv's rows, and the JSON column memo that the compact coder reads.

cpdef str fmt_t(ns)
cpdef str fmt_f(x, int nd=*)
cpdef str csv_field(v)
cpdef str canonical(obj)
cpdef object round9(v)
cpdef str csv_json(obj)
cpdef bint needs_quotes(str s) except -1
cpdef str cached_field(dict q, v)
cpdef bint plain_value(str v) except -1
cpdef object json_value(v)


cdef class JsonMemo:
    cdef list keys, order, values, parts, vtexts
    cdef bytearray odd
    cdef Py_ssize_t num_odd
    cdef object text


cpdef bint same_value(v, pv) except -1
cpdef bint reads_back(v, str s) except -1
cpdef int memo_update(JsonMemo m, dict d) except -2
cpdef str memo_text(JsonMemo m)
cpdef object json_memo(JsonMemo m, obj)


cdef class NumberTexts:
    cdef double values[4]
    cdef list texts
    cdef int next
    cdef dict others


cpdef str number_text(p, NumberTexts ff)
cpdef int evict_texts(list f, d, block, hash_name, owner, dict q, NumberTexts ff) except -1
cpdef Py_ssize_t eviction_rows(list rows, decisions, blocks, hash_names, owners, str head,
                               Py_ssize_t seq, str lead, dict q, NumberTexts ff,
                               JsonMemo seg_memo,
                               JsonMemo rank_memo) except -1
cpdef bytes request_line(bytes head, o)
