"""Loops written once, in Cython's pure-Python mode, to measure the layout with.

Interpreted, this is plain Python (the ``cython`` names come from Cython's shadow module,
or from ``psgate.cython_shadow`` where Cython is not installed); compiled with ``cythonize``, the
annotations type the locals, the arrays are typed memoryviews and ``Req`` is an extension
type whose fields are C integers. ``tools/core_layout/measure.py`` times both forms against
the hand-written kernels of ``psgate/_core.pyx``. (lru's walks, measured here first, now
live in ``psgate/policies/lru.py`` and are timed from there.)
"""

try:
    import cython
except ImportError:
    from psgate import cython_shadow as cython


@cython.cclass
class Req:
    """A running request's token counts, as the step scheduler keeps them."""

    num_computed = cython.declare(cython.longlong, visibility="public")
    num_tokens = cython.declare(cython.longlong, visibility="public")
    num_output = cython.declare(cython.longlong, visibility="public")
    max_out = cython.declare(cython.longlong, visibility="public")
    first_token_ns = cython.declare(cython.longlong, visibility="public")

    def __init__(self, num_tokens, max_out):
        self.num_computed = 0
        self.num_tokens = num_tokens
        self.num_output = 1
        self.max_out = max_out
        self.first_token_ns = 0


def step_computed(scheduled: list, num_new: list, i: cython.Py_ssize_t) -> cython.Py_ssize_t:
    """update_from_output over typed requests: tokens computed, one sampled where they
    caught up; stops at a request that samples its first token or finishes."""
    num: cython.Py_ssize_t = len(scheduled)
    r: Req
    computed: cython.longlong
    out: cython.longlong
    while i < num:
        r = scheduled[i]
        computed = r.num_computed + cython.cast(cython.longlong, num_new[i])
        if computed >= r.num_tokens:
            out = r.num_output + 1
            if (out == 1 and r.first_token_ns < 0) or out >= r.max_out:
                return i
            r.num_computed = computed
            r.num_output = out
            r.num_tokens = r.num_tokens + 1
        else:
            r.num_computed = computed
        i += 1
    return num


def queue_append(q, keys: list) -> None:
    """A history queue grown one entry at a time (``array.append``)."""
    k: cython.longlong
    for k in keys:
        q.append(k)


def queue_write(q: cython.longlong[::1], start: cython.Py_ssize_t,
                keys: list) -> cython.Py_ssize_t:
    """The same entries written into room made beforehand; returns the new length."""
    i: cython.Py_ssize_t = start
    k: cython.longlong
    for k in keys:
        q[i] = k
        i += 1
    return i
