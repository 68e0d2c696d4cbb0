# C declarations for prefixshield.py (Cython's pure-Python mode): BucketAudit's fields,
# declared once here (a cdef class), and the C types of its per-admission check.

cdef class BucketAudit:
    cdef public double output_weight
    cdef public dict rho
    cdef public dict beta
    cdef public double eps
    cdef public dict buckets
    cdef public dict group_contracts
    cdef public dict materialized
    cdef public dict charged
    cdef public dict verdicts
    cdef dict __dict__                  # a policy may keep its own attributes on it

    cpdef double _bhat(self, g, c, double t) except *
    cpdef double raw_debt(self, g, double t) except *
    cpdef void admitted(self, where, group, contract, double t, num_materialized, audit,
                        num_output=*) except *
