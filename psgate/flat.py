"""The items of psgate's flat arrays, for a loop compiled from Python.

The pool, the checker and the policies keep per-block state in ``array.array`` objects
(``'i'``: int32, ``'q'``: int64) and in ``bytearray``. A loop in a module written in
Cython's pure-Python mode reads them as ``p = ints(a)`` and indexes ``p[b]``: interpreted,
these functions give the array itself; compiled, ``flat.pxd`` gives a pointer to its
items (refused, with what was found, where the array's item type is not the one asked
for), so the loop pays no buffer acquisition per call. A pointer is not bounds checked:
the loop checks its indices itself, and takes the pointer again after any call that may
resize or replace the array. ``append_llong`` grows an ``array('q')`` by one item and
``truncate_llongs`` cuts one to its first items; compiled, they do so without a Python
method call.

This module is not compiled itself; its ``.pxd`` is what compiled callers ``cimport``.
"""


def ints(a):
    """The items of an ``array('i')``."""
    return a


def llongs(a):
    """The items of an ``array('q')``."""
    return a


def doubles(a):
    """The items of an ``array('d')``."""
    return a


def byte_items(a):
    """The bytes of a ``bytearray``."""
    return a


def append_llong(a, v) -> None:
    """``a.append(v)`` for an ``array('q')``: compiled, a resize in place (the array's own
    spare room, grown as ``append`` grows it) and one store, not a method call."""
    a.append(v)


def truncate_llongs(a, n) -> None:
    """``del a[n:]`` for an ``array('q')`` (``0 <= n <= len(a)``): compiled, a resize in
    place (the array keeps its room unless it shrinks to a quarter)."""
    if not 0 <= n <= len(a):
        raise IndexError(f"cannot cut an array of {len(a)} items to {n}")
    del a[n:]
