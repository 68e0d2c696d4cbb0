# C declarations for hashes.py (Cython's pure-Python mode): the per-block loops of
# reading a trace.

cpdef Py_ssize_t first_bad_hash(list blocks) except -2
cpdef tuple intern_run(table, list hashes, long long parent)
cpdef tuple block_ids(dict ids, list names, list hashes, Py_ssize_t cursor)
