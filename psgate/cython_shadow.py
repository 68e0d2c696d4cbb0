"""The names of Cython's pure-Python mode that psgate's compiled modules use, for an
interpreter where Cython is not installed.

A module such as ``psgate/engines/step_work.py`` is its own source of truth: ``pip install``
compiles it with Cython (its ``.pxd`` beside it gives the C types), and where no compiler
was there it runs as the Python it is. Interpreted, its annotations and decorators must
cost nothing and change nothing; Cython ships such a module (``cython``, its "shadow"), but
only with the compiler, so a plain install imports this one instead::

    try:
        import cython
    except ImportError:
        from psgate import cython_shadow as cython
"""

from __future__ import annotations

compiled = False


class _CType:
    """A C type's name in an annotation: ``cython.int``, ``cython.int[::1]``, ``cython.int(v)``."""

    def __getitem__(self, dims):
        return self

    def __call__(self, value):
        return value


int = longlong = Py_ssize_t = bint = double = void = Py_UCS4 = _CType()   # noqa: A001 - Cython names
p_int = p_longlong = p_double = p_uchar = _CType()      # pointers (psgate.flat gives the arrays themselves)
NULL = None


def _same(obj):
    return obj


cclass = ccall = cfunc = final = inline = _same


def annotation_typing(flag):
    """``@cython.annotation_typing(False)``: the class's annotations type nothing."""
    return _same


def boundscheck(flag):
    """``@cython.boundscheck(False)``: compiled, indexing is not checked (the function keeps
    its indices in range itself); interpreted, nothing."""
    return _same


wraparound = boundscheck


def cast(ctype, value):
    return value


def declare(ctype=None, value=None, **kwargs):
    return value
