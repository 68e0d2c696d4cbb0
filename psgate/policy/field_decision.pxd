# C declarations for field_decision.py (Cython's pure-Python mode): the fields every
# FieldDecision has, which the compact ledger's coder reads as C fields.

cdef class FieldDecision:
    cdef readonly int victim
    cdef public Py_ssize_t num_cand
