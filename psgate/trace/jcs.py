"""RFC 8785 (JCS) canonical JSON bytes, the trace's canonical digest input.

``dumps(obj)`` returns exactly ``rfc8785.dumps(obj)`` (and raises what it raises),
at a fraction of the cost: for a parsed JSON line, orjson writes the bytes whenever
they are provably JCS's, and the pure-Python ``rfc8785`` does the rest.

Why orjson's bytes are JCS's on the fast path:
- strings: orjson escapes exactly what JCS escapes (``"``, ``\\``, control characters,
  with the same short forms and lowercase ``\\u00xx``) and writes everything else as
  UTF-8; checked for every code point in tests/trace/test_reader.py;
- object keys: OPT_SORT_KEYS orders by code point, which is JCS's UTF-16 order unless
  a key holds a character above U+FFFF (such an object takes the slow path);
- integers: written as decimal digits, as JCS does inside +-(2**53 - 1) (outside it
  rfc8785 raises, so those take the slow path);
- floats: written as pre-formatted fragments, JCS's rules applied here: zero is
  ``0``, a repr without an exponent loses a trailing ``.0``; one with an exponent
  is formatted by rfc8785 itself (inf and nan take the slow path, which raises).
"""

from __future__ import annotations

import orjson
import rfc8785

_INT_MAX = 2**53 - 1
_SORT = orjson.OPT_SORT_KEYS
_Fragment = getattr(orjson, "Fragment", None)      # orjson >= 3.9.15
_PLAIN = frozenset((str, bool, type(None)))


class _Slow(Exception):
    """The fast path cannot prove its bytes equal rfc8785's for this value."""


def _float(f: float) -> bytes | str:
    if f == 0:
        return "0"
    r = repr(f)
    if "n" in r:                      # inf or nan: rfc8785 raises, in its own order
        raise _Slow
    if "e" in r:                      # exponent form: rfc8785's own rules
        return rfc8785.dumps(f)
    return r[:-2] if r.endswith(".0") else r


def _prep(v):
    """v with floats as orjson fragments; raises _Slow where orjson could differ."""
    t = type(v)
    if t is str or t is bool or v is None:
        return v
    if t is int:
        if -_INT_MAX <= v <= _INT_MAX:
            return v
        raise _Slow
    if t is float:
        return _Fragment(_float(v))
    if t is list:
        if not v or set(map(type, v)) <= _PLAIN:
            return v
        return [_prep(x) for x in v]
    if t is dict:
        out = {}
        for k, x in v.items():
            if type(k) is not str or (not k.isascii() and k and max(k) > "\uffff"):
                raise _Slow
            out[k] = _prep(x)
        return out
    raise _Slow


def dumps(obj) -> bytes:
    """``rfc8785.dumps(obj)``, byte for byte."""
    if _Fragment is not None:
        try:
            return orjson.dumps(_prep(obj), option=_SORT)
        except (_Slow, orjson.JSONEncodeError, RecursionError):
            pass
    return rfc8785.dumps(obj)
