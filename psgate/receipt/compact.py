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
                             (field_code.HashIds)
    predict -> columns run..contract: the previous row; seq: the previous row's + 1;
               the rest: the previous row of the same kind
    JSON    -> "" (same keys as the prediction) or "=" + the keys as a JSON array, then a
               code per value (its JSON text); "!" + text when re-serializing would not
               give the text back (never for psgate's canonical JSON, checked per row)

Every field's exact text is kept, so :func:`decode` gives the CSV byte for byte and a
receipt's ledger digest covers the compact file as written. The compact stream itself is
CSV (csv.writer, "\\r\\n" rows, so a lone carriage return is quoted) under a gzip header with
no name and no time: its bytes, too, depend only on the rows.

The coding is field_code's (``CompactEncoder``, compiled where the install compiled it;
the compiled core codes eviction batches from their fields into the same encoder); this
module holds the file and its reader.
"""

from __future__ import annotations

import csv
import gzip
import io
import re
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from itertools import compress

import orjson

from psgate import core
from psgate.errors import InputError
from psgate.inputs import open_input
from psgate.receipt import field_code
from psgate.receipt.field_code import (KIND_COL, CompactEncoder, HashIds, Number,
                                       decimal_in, is_int, is_time, json_text, time_ns)
from psgate.receipt.ledger import GZIP_LEVEL, LEDGER_COLUMNS, fmt_t, gzip_writer

MAGIC = "psgate-compact-ledger"
VERSION = "2"
# Version 1 had no "%" code and numbered at most HASH_LIMIT_V1 hashes; its files read
# as they were written.
READS = ("1", "2")
HASH_LIMIT_V1 = 1 << 18
_FIELD_LIMIT = 1 << 30
_DELTA = re.compile(r"-?[0-9]{1,20}\Z")


def _unplaces(v: int, places: int) -> str:
    """The decimal of integer v with ``places`` places (the inverse of the value and
    places field_code.decimal_in reads)."""
    q, r = divmod(abs(v), 10 ** places)
    return f"{'-' if v < 0 else ''}{q}.{r:0{places}d}"


def _uncode(code: str, pred: str) -> str:
    if not code:
        return pred
    if code[0] in "~^%" and not _DELTA.match(code, 1):
        raise ValueError(f"a difference that is not a whole number: {code[1:40]!r}")
    if code[0] == "~":
        if not is_int(pred):
            raise ValueError(f"a step from {pred[:40]!r}, which is not a number")
        return str(int(pred) + int(code[1:]))
    if code[0] == "^":
        if not is_time(pred):
            raise ValueError(f"a time step from {pred[:40]!r}, which is not a time")
        ns = time_ns(pred) + int(code[1:])
        if ns < 0:
            raise ValueError("a time step to before zero")
        return fmt_t(ns)
    if code[0] == "%":
        num = Number()
        if not decimal_in(pred, num):
            raise ValueError(f"a decimal step from {pred[:40]!r}, which is not a decimal")
        return _unplaces(num.value + int(code[1:]), num.places)
    if code[0] == "=":
        return code[1:]
    raise ValueError(f"a field code starts with {code[0]!r}")


def compiled_coder(enc: CompactEncoder):
    """The compiled coder of eviction batches from their fields (psgate._core.CompactCoder),
    coding into ``enc``'s state, or None where the core is off or not built or the
    columns are not LedgerWriter's."""
    kernels = core.get()
    if kernels is None or tuple(enc.columns) != LEDGER_COLUMNS:
        return None
    return kernels.CompactCoder(enc)


class CompactLedgerFile:
    """A text sink for the ledger writer: takes whole CSV rows, writes the compact gzip
    stream. The first row it is given is the header. Rows are coded by CompactEncoder
    (compiled where the install compiled field_code), and eviction batches, where the
    compiled core is built, from their fields by its coder (the same codes:
    tests/test_core_differential.py)."""

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
        self._fh.write(self._enc.encode_text(rows))

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


_ODD = re.compile(r'[",\r\n]')       # a field text csv would not read back as itself


class CompactReader:
    """A compact ledger's rows for a reader that wants a few of them (``psgate explain``):
    each row is decoded into the decoder's state code by code, nothing done for a field
    that equals its prediction, and no CSV row is made until one is asked for
    (:meth:`line`, the CSV ledger's line, byte for byte). :meth:`text`
    is one field's text in the current row. ``simple`` says that every plain field of the
    row is read back by csv as its own text (no quote, comma or line break) and no JSON
    column was kept verbatim, so a field's text is its value."""

    def __init__(self, header: str, version: str = VERSION) -> None:
        enc = CompactEncoder(header)
        self.columns = enc.columns
        self._shared_cols, self._own_cols, self._json_cols = (enc.shared_cols, enc.own_cols,
                                                              enc.json_cols)
        self._ns, self._no = len(enc.shared_cols), len(enc.own_cols)
        self._seq_at = enc.seq_at
        self._hash_at = enc.own_cols.index(enc.hash_col)
        self._hashes = HashIds(HASH_LIMIT_V1 if version == "1" else field_code.HASH_LIMIT)
        self._where = {}                # column name -> (0 shared / 1 own / 2 JSON, index)
        for j, i in enumerate(enc.shared_cols):
            self._where[self.columns[i]] = (0, j)
        for j, i in enumerate(enc.own_cols):
            self._where[self.columns[i]] = (1, j)
        for i in enc.json_cols:
            self._where[self.columns[i]] = (2, i)
        self._where["kind"] = (3, KIND_COL)
        self._last = [""] * self._ns
        self._seq: int | None = None    # the seq column as a number while it is one
        self._by_kind: dict[str, list] = {}
        self._odd: set = set()          # state slots whose text is not its csv value
        self._raw: dict[int, str] = {}  # JSON columns kept verbatim ("!") in this row
        self.kind = ""
        self._own: list[str] = []
        self._keys: dict = {}
        self._values: dict = {}

    def _set(self, slot, value: str) -> str:
        if _ODD.search(value):
            self._odd.add(slot)
        elif self._odd:
            self._odd.discard(slot)
        return value

    def advance(self, codes: list[str]) -> None:
        """Decode the next compact row into the state (ValueError, IndexError, TypeError or
        orjson.JSONDecodeError where it does not decode)."""
        kind = codes[0]
        st = self._by_kind.get(kind)
        if st is None:
            st = [[""] * self._no, {i: [] for i in self._json_cols},
                  {i: [] for i in self._json_cols}, None]
        own, keys_of, values_of = st[0], st[1], st[2]
        ns, no = self._ns, self._no
        last, seq_at = self._last, self._seq_at
        nz = [k for k in compress(range(1, 1 + ns + no), codes[1:1 + ns + no])]
        seq_done = False
        for k in nz:
            code = codes[k]
            if k <= ns:
                j = k - 1
                if j == seq_at:
                    seq_done = True
                    pred = self.seq_pred()
                    text = _uncode(code, pred)
                    self._seq = int(text) if is_int(text) else None
                    last[j] = self._set((0, j), text)
                else:
                    last[j] = self._set((0, j), _uncode(code, last[j]))
            else:
                j = k - 1 - ns
                if j == self._hash_at and code.startswith("#"):
                    own[j] = self._set((1, kind, j), self._hashes.name(int(code[1:])))
                else:
                    own[j] = self._set((1, kind, j), _uncode(code, own[j]))
        if not seq_done and self._seq is not None:
            s = self._seq + 1
            if -10 ** 18 < s < 10 ** 18:
                self._seq = s
            else:                        # beyond a machine word: kept as text from here
                last[seq_at] = str(s)
                self._seq = None
        h = own[self._hash_at]
        if h:
            self._hashes.see(h)
        if self._raw:
            self._raw = {}
        k = 1 + ns + no
        n = len(codes)
        if st[3] is not None and st[3] == n and not any(codes[k:]):
            pass                         # every JSON column as predicted
        else:
            keys_now, values_now = dict(keys_of), dict(values_of)
            for i in self._json_cols:
                mark = codes[k]
                k += 1
                if mark.startswith("!"):
                    self._raw[i] = mark[1:]
                    continue
                same = mark == ""
                keys = keys_of.get(i) if same else orjson.loads(mark[1:])
                if keys is None:
                    raise ValueError("a JSON column's keys are predicted before any were given")
                pv = values_of.get(i) if same else None
                values = []
                for j in range(len(keys)):
                    values.append(_uncode(codes[k], pv[j] if pv is not None else ""))
                    k += 1
                keys_now[i], values_now[i] = keys, values
            if k != n:
                raise ValueError(f"{n - k} codes left over")
            st[1], st[2] = keys_now, values_now
            # the length of a row whose JSON columns are all as predicted
            st[3] = (1 + ns + no + sum(1 + len(keys_now[i]) for i in self._json_cols)
                     if not self._raw else None)
        self._by_kind[kind] = st
        self.kind, self._own, self._keys, self._values = kind, own, st[1], st[2]

    def seq_pred(self) -> str:
        return str(self._seq + 1) if self._seq is not None else self._pred_text()

    def _pred_text(self) -> str:
        seq = self._last[self._seq_at]
        return str(int(seq) + 1) if is_int(seq) else seq

    @property
    def simple(self) -> bool:
        if self._raw or _ODD.search(self.kind):
            return False
        if not self._odd:
            return True
        kind = self.kind
        return not any(s[0] == 0 or s[1] == kind for s in self._odd)

    def text(self, name: str) -> str:
        """The current row's field ``name`` as the CSV row has it."""
        where, j = self._where[name]
        if where == 0:
            if j == self._seq_at and self._seq is not None:
                return str(self._seq)
            return self._last[j]
        if where == 1:
            return self._own[j]
        if where == 3:
            return self.kind
        if j in self._raw:
            return self._raw[j]
        keys = self._keys[j]
        return json_text(keys, self._values[j]) if keys else ""

    def value(self, name: str) -> str:
        """The current row's field ``name`` as csv reads it, in a ``simple`` row."""
        text = self.text(name)
        if self._where[name][0] == 2 and text:
            return text[1:-1].replace('""', '"')
        return text

    def json_keys(self, name: str) -> list[str] | None:
        """The keys of a JSON column of the current row (None where it was kept verbatim)."""
        j = self._where[name][1]
        return None if j in self._raw else self._keys[j]

    def line(self) -> str:
        """The current row as the CSV ledger has it."""
        fields = [""] * len(self.columns)
        fields[KIND_COL] = self.kind
        last = self._last
        for j, i in enumerate(self._shared_cols):
            fields[i] = last[j]
        if self._seq is not None:
            fields[self._shared_cols[self._seq_at]] = str(self._seq)
        for j, i in enumerate(self._own_cols):
            fields[i] = self._own[j]
        for i in self._json_cols:
            if i in self._raw:
                fields[i] = self._raw[i]
            else:
                keys = self._keys[i]
                fields[i] = json_text(keys, self._values[i]) if keys else ""
        return ",".join(fields) + "\n"


def _compact_header(rows: Iterator[list[str]], name: str) -> tuple[str, CompactReader]:
    """The ledger's CSV header and a reader for the rows after it, from a compact stream's
    first two rows (an InputError where they are not a compact ledger's)."""
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
        return header[0], CompactReader(header[0], magic[1])
    except (ValueError, TypeError) as exc:
        raise InputError(f"expected the ledger's CSV header, found {header!r:.60} ({exc})",
                         path=name, line=2) from None


def _compact_rows(stream: Iterable[str], name: str
                  ) -> tuple[str, Iterator[tuple[int, CompactReader]]]:
    """The CSV header, and (compact row number, the reader holding that row) for each row:
    the same reader each time, so read what a row is asked for before taking the next. A
    row that does not decode (a file cut or altered) is an InputError naming it."""
    if csv.field_size_limit() < _FIELD_LIMIT:      # a 200 kB request id is a field too
        csv.field_size_limit(_FIELD_LIMIT)
    rows = csv.reader(stream)
    header, reader = _compact_header(rows, name)

    def each() -> Iterator[tuple[int, CompactReader]]:
        advance = reader.advance
        for n, codes in enumerate(rows, start=3):
            try:
                advance(codes)
            except (ValueError, IndexError, TypeError, orjson.JSONDecodeError) as exc:
                raise InputError(f"row does not decode: {exc}", path=name, line=n) from None
            yield n, reader
    return header, each()


def decode(stream: Iterable[str], name: str = "ledger") -> Iterator[str]:
    """The CSV ledger's lines (header first, each with its "\\n") from a compact stream's
    text. A stream that is not a compact ledger, or is cut or altered so that a row does
    not decode, is an InputError naming the row."""
    header, rows = _compact_rows(stream, name)
    yield header + "\n"
    for _, reader in rows:
        yield reader.line()


@contextmanager
def _compact_file(path) -> Iterator[io.TextIOWrapper]:
    """A ledger.compact.csv.gz file's text; a file that is cut, not gzip or not UTF-8 is an
    InputError naming it."""
    import zlib
    try:
        with open_input(path, "ledger") as raw, \
                io.TextIOWrapper(gzip.open(raw, "rb"), encoding="utf-8", newline="") as fh:
            yield fh
    except UnicodeDecodeError as exc:
        raise InputError(f"not UTF-8 ({exc.reason}; expected the UTF-8 compact ledger psgate "
                         f"writes)", path=str(path)) from None
    except (EOFError, zlib.error, gzip.BadGzipFile, csv.Error) as exc:
        raise InputError(f"not a complete compact ledger ({exc}; expected the gzip psgate "
                         f"writes)", path=str(path)) from None


def open_compact(path) -> Iterator[str]:
    """The CSV ledger's lines from a ledger.compact.csv.gz file (errors as compact_lines')."""
    with _compact_file(path) as fh:
        yield from decode(fh, str(path))


def compact_lines(path) -> Iterator[str]:
    """The lines of the CSV a ledger.compact.csv.gz file codes, each with its "\\n" (a row
    with a line break in a quoted field is more than one); a file that is cut, not gzip,
    not UTF-8 or does not decode is an InputError naming it (and the compact row, where
    one is to blame)."""
    for row in open_compact(path):         # every row ends with "\n"
        for line in row[:-1].split("\n"):
            yield line + "\n"


def read_compact(path) -> Iterator[tuple[int, CompactReader]]:
    """(compact row number, the reader holding that row) for each row of a
    ledger.compact.csv.gz file (see _compact_rows); errors as :func:`compact_lines`'."""
    with _compact_file(path) as fh:
        yield from _compact_rows(fh, str(path))[1]
