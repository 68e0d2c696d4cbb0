"""ledger.compact.csv.gz: the ledger's CSV with each row coded against the rows before it.

Ledger rows repeat themselves. A batch's rows share run, policy, time, request, group and
contract; ``seq`` counts up by one; victims' block ids, positions and free orders move by
small steps; a policy's ``rank`` object has the same keys on every row and most of its
values are the row before's. gzip sees none of that across a 300-byte row, so the compact
form removes it first and gzips what is left:

    row     -> kind, then one code per other column, then the JSON columns' codes
    code    -> ""            the field equals its prediction
               "~" + delta   both are integers: the difference
               "^" + delta   both are times (seconds, 9 decimals): the difference in ns
               "%" + delta   both are decimals with the same number of places (a
                             probability, a debt): the difference in the last place
               "=" + text    anything else, verbatim
               "#" + number  the hash column: a trace hash seen before, by its number
                             (HashIds)
    predict -> columns run..contract: the previous row; seq: the previous row's + 1;
               the rest: the previous row of the same kind
    JSON    -> "" (same keys as the prediction) or "=" + the keys as a JSON array, then a
               code per value (its JSON text); "!" + text when re-serializing would not
               give the text back (never for psgate's canonical JSON, checked per row)

Every field's exact text is kept, so :func:`decode` gives the CSV byte for byte and a
receipt's ledger digest covers the compact file as written. The compact stream itself is
CSV (csv.writer, "\\r\\n" rows, so a lone carriage return is quoted) under a gzip header with
no name and no time: its bytes, too, depend only on the rows.
"""

from __future__ import annotations

import csv
import gzip
import io
import re
from collections.abc import Iterable, Iterator
from operator import itemgetter

import orjson

from psgate import core
from psgate.errors import InputError
from psgate.receipt.ledger import GZIP_LEVEL, LEDGER_COLUMNS, fmt_t, gzip_writer

MAGIC = "psgate-compact-ledger"
VERSION = "2"
# Version 1 had no "%" code and numbered at most HashIds.V1_LIMIT hashes; its files read
# as they were written.
READS = ("1", "2")
_FIELD_LIMIT = 1 << 30
# Delta coding only for numbers a machine word holds (a 4,301-digit id would meet
# Python's int-to-str limit): bigger ones, and ids with leading zeros, are kept as text.
_INT = re.compile(r"(0|-?[1-9][0-9]{0,17})\Z")
_SECONDS = re.compile(r"(0|[1-9][0-9]{0,9})\.[0-9]{9}\Z")      # fmt_t: seconds, 9 decimals
_DELTA = re.compile(r"-?[0-9]{1,20}\Z")
# a decimal of at most 18 digits (its places as an integer fit a machine word)
_DECIMAL = re.compile(r"-?(0|[1-9][0-9]*)\.([0-9]+)\Z")
_KIND_COL = 4
REQUIRED = ("run", "policy", "seq", "t", "kind", "request", "group", "contract", "hash")
_SEQ_COL = 2
_SHARED = 8                 # columns 0..7 predicted from the previous row of any kind


def split_row(line: str) -> list[str]:
    """The fields of one CSV row (newline excluded) exactly as written, quotes included:
    a field that starts with a quote runs to its closing quote (doubled quotes inside),
    any other runs to the next comma (csv_field never leaves a comma or a quote
    unquoted)."""
    q = line.find('"')
    if q < 0:
        return line.split(",")
    if q and line[q - 1] != ",":
        raise ValueError(f"a quote inside an unquoted field at {q}")
    out = line[:q - 1].split(",") if q else []
    i, n = q, len(line)
    while True:
        if i < n and line[i] == '"':
            j = i + 1
            while True:
                j = line.index('"', j)
                if j + 1 < n and line[j + 1] == '"':
                    j += 2
                    continue
                break
            out.append(line[i:j + 1])
            i = j + 1
            if i == n:
                return out
            if line[i] != ",":
                raise ValueError(f"text after a closing quote at {i}")
            i += 1
        else:
            j = line.find(",", i)
            if j < 0:
                out.append(line[i:])
                return out
            out.append(line[i:j])
            i = j + 1


def _ns(t: str) -> int:
    return int(t.replace(".", ""))


def _places(t: str) -> tuple[int, int] | None:
    """(t without its point, as an integer; its number of places) for a decimal _DECIMAL
    takes with at most 18 digits, else None. "-0.0" is None as a value to code (its
    integer is 0, which gives "0.0" back), but reads as 0 as a prediction."""
    m = _DECIMAL.match(t)
    if m is None or len(t) - (t[0] == "-") - 1 > 18:
        return None
    return int(t.replace(".", "")), len(m.group(2))


def _code(cur: str, pred: str) -> str:
    if cur == pred:
        return ""
    if _INT.match(cur) and _INT.match(pred):
        return f"~{int(cur) - int(pred)}"
    if _SECONDS.match(cur) and _SECONDS.match(pred):
        return f"^{_ns(cur) - _ns(pred)}"
    c, p = _places(cur), _places(pred)
    if c is not None and p is not None and c[1] == p[1] and (c[0] or cur[0] != "-"):
        return f"%{c[0] - p[0]}"
    return "=" + cur


def _unplaces(v: int, places: int) -> str:
    """The decimal of integer v with ``places`` places (_places' inverse)."""
    q, r = divmod(abs(v), 10 ** places)
    return f"{'-' if v < 0 else ''}{q}.{r:0{places}d}"


def _uncode(code: str, pred: str) -> str:
    if not code:
        return pred
    if code[0] in "~^%" and not _DELTA.match(code, 1):
        raise ValueError(f"a difference that is not a whole number: {code[1:40]!r}")
    if code[0] == "~":
        if not _INT.match(pred):
            raise ValueError(f"a step from {pred[:40]!r}, which is not a number")
        return str(int(pred) + int(code[1:]))
    if code[0] == "^":
        if not _SECONDS.match(pred):
            raise ValueError(f"a time step from {pred[:40]!r}, which is not a time")
        ns = _ns(pred) + int(code[1:])
        if ns < 0:
            raise ValueError("a time step to before zero")
        return fmt_t(ns)
    if code[0] == "%":
        p = _places(pred)
        if p is None:
            raise ValueError(f"a decimal step from {pred[:40]!r}, which is not a decimal")
        return _unplaces(p[0] + int(code[1:]), p[1])
    if code[0] == "=":
        return code[1:]
    raise ValueError(f"a field code starts with {code[0]!r}")


def _json_fields(text: str) -> tuple[list[str], list[str]] | None:
    """(keys, each value's JSON text) of a quoted compact JSON object field, or None when
    the field is not one that :func:`_json_text` gives back exactly."""
    if not (text.startswith('"{') and text.endswith('}"')):
        return None
    inner = text[1:-1].replace('""', '"')
    try:
        obj = orjson.loads(inner)
    except orjson.JSONDecodeError:
        return None
    if (type(obj) is not dict or not obj or orjson.dumps(obj) != inner.encode()
            or '"' + inner.replace('"', '""') + '"' != text):
        return None
    return list(obj), [orjson.dumps(v).decode() for v in obj.values()]


def _json_text(keys: list[str], values: list[str]) -> str:
    body = ",".join(f"{orjson.dumps(k).decode()}:{v}" for k, v in zip(keys, values))
    return '"{' + body.replace('"', '""') + '}"'


class HashIds:
    """Trace hashes numbered in the order first seen, for a victim whose content was
    evicted before (the same prompt block evicted again, or in the other run): it is coded
    by that number instead of 32 hex digits. Both sides number the same hashes in the same
    order; at ``limit`` distinct hashes both start over, so memory stays bounded (up to 70
    bytes a hash while coding, the hash texts being the trace's; twice that while
    decoding). A replay's two runs evict much the same blocks, so the table holds a whole
    run of a real trace's evictions (414,592 distinct hashes in 600 Mooncake requests at
    16,384 blocks), and the other run's are numbers."""

    LIMIT = 1 << 20
    V1_LIMIT = 1 << 18          # format version 1's

    def __init__(self, limit: int | None = None) -> None:
        self.limit = self.LIMIT if limit is None else limit
        self._ids: dict[str, int] = {}
        self._names: list[str] = []

    def see(self, h: str) -> int | None:
        """The number ``h`` had, or None when it is new (it is numbered now)."""
        hid = self._ids.get(h)
        if hid is None:
            if len(self._names) >= self.limit:
                self._ids.clear()
                self._names.clear()
            self._ids[h] = len(self._names)
            self._names.append(h)
        return hid

    def name(self, hid: int) -> str:
        if not 0 <= hid < len(self._names):
            raise ValueError(f"no trace hash numbered {hid}")
        return self._names[hid]


class CompactEncoder:
    """Rows of the CSV ledger in, compact rows out (one per row, same order)."""

    def __init__(self, header: str) -> None:
        self.columns = split_row(header)
        missing = [c for c in REQUIRED if c not in self.columns]
        if missing or self.columns.index("kind") != _KIND_COL or self.columns[_SEQ_COL] != "seq":
            raise ValueError(f"not the ledger's columns (missing {missing or 'kind/seq'})")
        self.json_cols = [i for i, c in enumerate(self.columns) if c in ("segments", "rank")]
        self.plain_cols = [i for i in range(len(self.columns))
                           if i != _KIND_COL and i not in self.json_cols]
        shared = self.shared_cols = [i for i in self.plain_cols if i < _SHARED]
        own = self.own_cols = [i for i in self.plain_cols if i >= _SHARED]
        self.kind_col = _KIND_COL
        self._shared = itemgetter(*shared)
        self._own = itemgetter(*own)
        self._seq_at = shared.index(_SEQ_COL)
        self._hash_col = self.columns.index("hash")
        self._hash_at = 1 + len(shared) + own.index(self._hash_col)
        self._hashes = HashIds()
        self._last = ("",) * len(shared)
        self._blank = (("",) * len(own), {i: ("", [], [], True) for i in self.json_cols})
        # per kind: its last row's own fields, and per JSON column (text, keys, values,
        # whether it was coded by key)
        self._by_kind: dict[str, tuple[tuple, dict]] = {}

    def predict(self, last: tuple, prev_own: tuple) -> list[str]:
        """Each plain column's prediction, in plain_cols order: ``last`` is the previous
        row's shared columns (its seq plus one), ``prev_own`` the rest of the previous row
        of the same kind."""
        pred = list(last)
        seq = pred[self._seq_at]
        if _INT.match(seq):
            pred[self._seq_at] = str(int(seq) + 1)
        pred += prev_own
        return pred

    def encode(self, line: str) -> list[str]:
        fields = split_row(line)
        if len(fields) != len(self.columns):
            raise ValueError(f"{len(fields)} fields, the header has {len(self.columns)}")
        kind = fields[_KIND_COL]
        prev_own, prev_json = self._by_kind.get(kind) or self._blank
        cur = self._shared(fields)
        own = self._own(fields)
        out = [kind]
        out += ["" if c == p else _code(c, p)
                for c, p in zip(cur + own, self.predict(self._last, prev_own))]
        h = fields[self._hash_col]
        if h:
            hid = self._hashes.see(h)
            if hid is not None and out[self._hash_at]:
                out[self._hash_at] = f"#{hid}"
        json_now = dict(prev_json)
        for i in self.json_cols:
            text = fields[i]
            ptext, pkeys, pvalues, pok = prev_json[i]
            if text == ptext and pok:
                out.append("")
                out += [""] * len(pkeys)
                continue
            parsed = _json_fields(text) if text else ([], [])
            if parsed is None:
                out.append("!" + text)
                json_now[i] = (text, pkeys, pvalues, False)
                continue
            keys, values = parsed
            if keys == pkeys:
                out.append("")
                out += ["" if c == p else _code(c, p) for c, p in zip(values, pvalues)]
            else:
                out.append("=" + orjson.dumps(keys).decode())
                out += ["=" + v for v in values]
            json_now[i] = (text, keys, values, True)
        self._last = cur
        self._by_kind[kind] = (own, json_now)
        return out


class CompactDecoder:
    """Compact rows in, the CSV ledger's rows out, byte for byte."""

    def __init__(self, header: str, version: str = VERSION) -> None:
        enc = self._enc = CompactEncoder(header)       # the same columns and predictions
        self.columns, self.json_cols, self.plain_cols = enc.columns, enc.json_cols, enc.plain_cols
        self._hash_col = enc._hash_col
        self._hashes = HashIds(HashIds.V1_LIMIT if version == "1" else None)
        self._last = enc._last
        self._blank = (enc._blank[0], {i: [] for i in self.json_cols},
                       {i: [] for i in self.json_cols})
        self._by_kind: dict = {}

    def decode(self, codes: list[str]) -> str:
        kind = codes[0]
        prev_own, prev_keys, prev_values = self._by_kind.get(kind) or self._blank
        enc = self._enc
        fields = [""] * len(self.columns)
        fields[_KIND_COL] = kind
        hash_col = self._hash_col
        for k, (i, pred) in enumerate(zip(self.plain_cols, enc.predict(self._last, prev_own)),
                                      start=1):
            code = codes[k]
            if i == hash_col and code.startswith("#"):
                fields[i] = self._hashes.name(int(code[1:]))
            else:
                fields[i] = _uncode(code, pred)
        k = 1 + len(self.plain_cols)
        h = fields[hash_col]
        if h:
            self._hashes.see(h)
        keys_now, values_now = dict(prev_keys), dict(prev_values)
        for i in self.json_cols:
            mark = codes[k]
            k += 1
            if mark.startswith("!"):
                fields[i] = mark[1:]
                continue
            same = mark == ""
            keys = prev_keys.get(i) if same else orjson.loads(mark[1:])
            if keys is None:
                raise ValueError("a JSON column's keys are predicted before any were given")
            pv = prev_values.get(i) if same else None
            values = []
            for j in range(len(keys)):
                values.append(_uncode(codes[k], pv[j] if pv is not None else ""))
                k += 1
            fields[i] = _json_text(keys, values) if keys else ""
            keys_now[i], values_now[i] = keys, values
        if k != len(codes):
            raise ValueError(f"{len(codes) - k} codes left over")
        self._last = enc._shared(fields)
        self._by_kind[kind] = (enc._own(fields), keys_now, values_now)
        return ",".join(fields) + "\n"


def compiled_coder(enc: CompactEncoder):
    """The compiled form of ``enc``'s encode (psgate._core.CompactCoder), starting from
    ``enc``'s state, or None where the core is off or not built."""
    kernels = core.get()
    if kernels is None:
        return None
    return kernels.CompactCoder(enc, split_row, _json_fields, _code, orjson.dumps,
                                HashIds.LIMIT, tuple(enc.columns) == LEDGER_COLUMNS)


class CompactLedgerFile:
    """A text sink for the ledger writer: takes whole CSV rows, writes the compact gzip
    stream. The first row it is given is the header. Rows are coded by the compiled core
    where it is built (the same codes: tests/test_core_differential.py), else by
    CompactEncoder."""

    def __init__(self, path, level: int = GZIP_LEVEL) -> None:
        self._raw = open(path, "wb")
        self._fh = io.TextIOWrapper(gzip_writer(self._raw, level), encoding="utf-8",
                                    newline="")
        self._w = csv.writer(self._fh, lineterminator="\r\n")
        self._enc: CompactEncoder | None = None
        self._coder = None

    def write_rows(self, rows: Iterable[str]) -> None:
        w = self._w
        rows = iter(rows)
        if self._enc is None:
            row = next(rows, None)
            if row is None:
                return
            line = row[:-1]              # every row ends with its "\n"
            w.writerow([MAGIC, VERSION])
            w.writerow([line])
            self._enc = CompactEncoder(line)
            self._coder = compiled_coder(self._enc)
        if self._coder is not None:
            self._fh.write(self._coder.encode_text(rows))
            return
        encode = self._enc.encode
        w.writerows(encode(row[:-1]) for row in rows)

    @property
    def codes_evictions(self) -> bool:
        """Whether write_evictions may be called: the header is written and the compiled
        coder is here."""
        return self._coder is not None

    def write_evictions(self, *batch) -> int:
        """LedgerWriter.eviction_batch's rows of one batch, coded from their fields by the
        compiled coder (``batch``: encode_evictions' arguments); returns the last seq."""
        text, seq = self._coder.encode_evictions(*batch)
        self._fh.write(text)
        return seq

    def close(self) -> None:
        self._fh.close()
        self._raw.close()


def decode(stream: Iterable[str], name: str = "ledger") -> Iterator[str]:
    """The CSV ledger's lines (header first, each with its "\\n") from a compact stream's
    text. A stream that is not a compact ledger, or is cut or altered so that a row does
    not decode, is an InputError naming the row."""
    if csv.field_size_limit() < _FIELD_LIMIT:      # a 200 kB request id is a field too
        csv.field_size_limit(_FIELD_LIMIT)
    rows = csv.reader(stream)
    try:
        magic = next(rows)
        if len(magic) != 2 or magic[0] != MAGIC or magic[1] not in READS:
            raise InputError(f"expected a {MAGIC} version {' or '.join(READS)} header, found "
                             f"{','.join(magic)[:60]!r}", path=name, line=1)
        header = next(rows)
    except StopIteration:
        raise InputError("the compact ledger has no header", path=name) from None
    try:
        if len(header) != 1:
            raise ValueError(f"{len(header)} fields")
        dec = CompactDecoder(header[0], magic[1])
    except (ValueError, TypeError) as exc:
        raise InputError(f"expected the ledger's CSV header, found {header!r:.60} ({exc})",
                         path=name, line=2) from None
    yield header[0] + "\n"
    for n, codes in enumerate(rows, start=3):
        try:
            yield dec.decode(codes)
        except (ValueError, IndexError, TypeError, orjson.JSONDecodeError) as exc:
            raise InputError(f"row does not decode: {exc}", path=name, line=n) from None


def open_compact(path) -> Iterator[str]:
    """The CSV ledger's lines from a ledger.compact.csv.gz file."""
    with io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", newline="") as fh:
        yield from decode(fh, str(path))


def compact_lines(path) -> Iterator[str]:
    """The lines of the CSV a ledger.compact.csv.gz file codes, each with its "\n" (a row
    with a line break in a quoted field is more than one); a file that is cut, not gzip,
    not UTF-8 or does not decode is an InputError naming it (and the compact row, where
    one is to blame)."""
    import zlib
    try:
        for row in open_compact(path):         # every row ends with "\n"
            for line in row[:-1].split("\n"):
                yield line + "\n"
    except UnicodeDecodeError as exc:
        raise InputError(f"not UTF-8 ({exc.reason}; expected the UTF-8 compact ledger psgate "
                         f"writes)", path=str(path)) from None
    except (EOFError, zlib.error, gzip.BadGzipFile, csv.Error) as exc:
        raise InputError(f"not a complete compact ledger ({exc}; expected the gzip psgate "
                         f"writes)", path=str(path)) from None
