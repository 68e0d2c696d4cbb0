"""The compact ledger's codes: a row of the CSV ledger coded against the rows before it.

    FieldCoder.code(cur, pred) -> ""            cur == pred
                                  "~" + delta   both integers (INT): the difference
                                  "^" + delta   both times as fmt_t writes them (TIME):
                                                the difference in ns
                                  "%" + delta   both decimals with the same number of
                                                places (DECIMAL): the difference in the
                                                last place
                                  "=" + cur     anything else, verbatim
    split_row(line) -> the fields of one CSV row exactly as written, quotes included
    HashIds.see(h)  -> the number trace hash h was given when first seen, or -1
    CompactEncoder.encode(line) -> the row's codes (compact.py's table): its kind, each
                                   plain column's code against its prediction, the
                                   JSON columns' codes

The compact ledger's writer and reader (``compact.py``) and the compiled coder of
``psgate._core``, which codes eviction batches from their fields into the encoder's
state, all code through these, so a row is coded one way whichever writes it.

The module is written in Cython's pure-Python mode and is their only source: ``pip
install`` compiles it (``field_code.pxd`` gives the types), and without a compiler it runs
as written. A number's form is read by one loop over its characters (scan) rather than by
regular expressions: compiled, the loop reads the string in place and the value comes out
of the same pass (tests/receipt/test_field_code.py holds it to the grammar written as
regular expressions, and the encoder as installed to its interpreted form).
"""

from orjson import JSONDecodeError, dumps, loads

from psgate.receipt.row_text import csv_field

try:
    import cython
except ImportError:
    from psgate import cython_shadow as cython

# The ledger's layout as the encoder needs it
REQUIRED = ("run", "policy", "seq", "t", "kind", "request", "group", "contract", "hash")
JSON_COLUMNS = ("segments", "rank")
KIND_COL = 4
SEQ_COL = 2
SHARED = 8                  # columns 0..7 predicted from the previous row of any kind
# Hashes numbered before HashIds starts over. A replay's two runs evict much the same
# blocks, so the table holds a whole run of a real trace's evictions (414,592 distinct
# hashes in 600 Mooncake requests at 16,384 blocks), and the other run's are numbers.
HASH_LIMIT = 1 << 20


# scan()'s forms of a number, as bits (C constants where compiled: field_code.pxd)
INT = 1             # "0", or an optional minus, a digit 1-9 and at most 17 digits more
TIME = 2            # as fmt_t writes a time: 0 or 1-10 digits without a leading zero, a
                    # point, nine digits
BIG_TIME = 4        # with TIME: ten digits before the point (the difference of two may
                    # not fit a machine word: FieldCoder.code takes Python integers)
DECIMAL = 8         # an optional minus, 0 or digits without a leading zero, a point, at
                    # least one digit; at most 18 digits in all


@cython.cclass
class Number:
    """What scan() read of a text: its digits as one integer, its point and sign left
    out and signed ("-0.0" is 0; a time's ns, a decimal's steps in its last place), and
    its number of places after the point."""

    def __init__(self) -> None:
        self.value = 0
        self.places = 0


@cython.boundscheck(False)
@cython.wraparound(False)
def scan(s: str, num: Number) -> cython.int:
    """The forms of a number that s is, as INT | TIME | BIG_TIME | DECIMAL bits (0 for
    none), in one pass over its characters; ``num`` takes its value and places where it
    is one. At most 18 digits are a value, so a machine word holds any difference of two
    (a longer id, or one with leading zeros, is kept as text)."""
    n: cython.Py_ssize_t = len(s)
    neg: cython.bint
    k: cython.Py_ssize_t = 0
    point: cython.Py_ssize_t = -1
    lead: cython.Py_ssize_t
    trail: cython.Py_ssize_t = 0
    nd: cython.int = 0
    v: cython.longlong = 0
    c: cython.Py_UCS4
    forms: cython.int = 0
    if n == 0 or n > 21:
        return 0
    neg = s[0] == "-"
    for c in s:
        if "0" <= c <= "9":
            if nd < 18:
                v = v * 10 + (ord(c) - 48)
                nd += 1
        elif c == ".":
            if point >= 0:
                return 0
            point = k
        elif k or not neg:
            return 0
        k += 1
    lead = (n if point < 0 else point) - neg
    if lead == 0 or (lead > 1 and s[neg] == "0"):
        return 0
    if point < 0:
        if lead > 18 or (neg and v == 0):
            return 0
        forms = INT
    else:
        trail = n - 1 - point
        if trail == 0:
            return 0
        if not neg and trail == 9 and lead <= 10:
            forms = TIME | (BIG_TIME if lead == 10 else 0)
        if lead + trail <= 18:
            forms |= DECIMAL
    num.value = -v if neg else v
    num.places = trail
    return forms


def is_int(s: str) -> cython.bint:
    """s is an integer the "~" code takes (INT)."""
    return scan(s, Number()) & INT != 0


def int_in(s: str, num: Number) -> cython.bint:
    """is_int(s), with its value in ``num.value`` where it is one."""
    return scan(s, num) & INT != 0


def is_time(s: str) -> cython.bint:
    """s is a time as fmt_t writes it (TIME)."""
    return scan(s, Number()) & TIME != 0


def time_ns(t: str):
    """A TIME's ns as a Python integer, whatever its number of digits (a BIG_TIME's too)."""
    return int(t.replace(".", ""))


def decimal_in(s: str, num: Number) -> cython.bint:
    """s is a decimal the "%" code takes (DECIMAL), with its digits as an integer in
    ``num.value`` and its number of places in ``num.places`` where it is one."""
    return scan(s, num) & DECIMAL != 0


@cython.cclass
class FieldCoder:
    """A field's code against its prediction (the module's table), with the Numbers its
    scans write: each encoder holds its own, so two never share them."""

    def __init__(self) -> None:
        self.cur = Number()
        self.pred = Number()
        self.delta = Number()

    def step(self, cur: str, pred: str) -> cython.int:
        """The code of cur against its prediction pred, cur != pred, where it is a step:
        its mark ("~", "^" or "%", as a character code) with the difference in
        ``delta.value``; 0 for any other code (verbatim, or a time step from or to a
        BIG_TIME, whose difference may not fit a machine word). The compiled coder writes
        a step's mark and difference without making its text."""
        a: cython.int
        b: cython.int
        c: Number = self.cur
        p: Number = self.pred
        a = scan(cur, c)
        if a == 0:
            return 0
        b = scan(pred, p)
        if a & b & INT:
            self.delta.value = c.value - p.value
            return 126                                  # "~"
        if a & b & TIME:
            if (a | b) & BIG_TIME:
                return 0
            self.delta.value = c.value - p.value
            return 94                                   # "^"
        if (a & b & DECIMAL and c.places == p.places
                and (c.value != 0 or cur[0] != "-")):
            self.delta.value = c.value - p.value
            return 37                                   # "%"
        return 0

    def code(self, cur: str, pred: str) -> str:
        """cur's code against its prediction pred. A negative zero decimal ("-0.0") is
        kept verbatim: its digits read back as "0.0"."""
        mark: cython.int
        if cur == pred:
            return ""
        mark = self.step(cur, pred)
        if mark:
            return chr(mark) + str(self.delta.value)
        if scan(cur, self.cur) & scan(pred, self.pred) & TIME:    # from or to a BIG_TIME
            return "^" + str(time_ns(cur) - time_ns(pred))
        return "=" + cur


def split_row(line: str) -> list:
    """The fields of one CSV row (newline excluded) exactly as written, quotes included:
    a field that starts with a quote runs to its closing quote (doubled quotes inside),
    any other runs to the next comma (csv_field never leaves a comma or a quote
    unquoted). ValueError for a row that breaks this."""
    n: cython.Py_ssize_t = len(line)
    q: cython.Py_ssize_t = line.find('"')
    i: cython.Py_ssize_t
    j: cython.Py_ssize_t
    out: list
    if q < 0:
        return line.split(",")
    if q and line[q - 1] != ",":
        raise ValueError(f"a quote inside an unquoted field at {q}")
    out = line[:q - 1].split(",") if q else []
    i = q
    while True:
        if i < n and line[i] == '"':
            j = i + 1
            while True:
                j = line.find('"', j)
                if j < 0:
                    raise ValueError(f"a quote opened at {i} is not closed")
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


@cython.cclass
class HashIds:
    """Trace hashes numbered in the order first seen, for a victim whose content was
    evicted before (the same prompt block evicted again, or in the other run): it is coded
    by that number instead of 32 hex digits. Both sides number the same hashes in the same
    order; at ``limit`` distinct hashes both start over, so memory stays bounded (up to 70
    bytes a hash while coding, the hash texts being the trace's; twice that while
    decoding)."""

    def __init__(self, limit: cython.Py_ssize_t) -> None:
        self.limit = limit
        self.ids = {}
        self.names = []

    def see(self, h: str) -> cython.Py_ssize_t:
        """The number ``h`` had, or -1 when it is new (it is numbered now)."""
        hid = self.ids.get(h)
        if hid is not None:
            return hid
        if len(self.names) >= self.limit:
            self.ids.clear()
            self.names.clear()
        self.ids[h] = len(self.names)
        self.names.append(h)
        return -1

    def name(self, hid) -> str:
        """The hash numbered ``hid`` (ValueError for a number not given)."""
        if not 0 <= hid < len(self.names):
            raise ValueError(f"no trace hash numbered {hid}")
        return self.names[hid]


def json_fields(text: str):
    """(keys, each value's JSON text) of a quoted compact JSON object field, or None when
    the field is not one that :func:`json_text` gives back exactly."""
    if not (text.startswith('"{') and text.endswith('}"')):
        return None
    inner = text[1:-1].replace('""', '"')
    try:
        obj = loads(inner)
    except JSONDecodeError:
        return None
    if (type(obj) is not dict or not obj or dumps(obj) != inner.encode()
            or '"' + inner.replace('"', '""') + '"' != text):
        return None
    return list(obj), [dumps(v).decode() for v in obj.values()]


def json_text(keys: list, values: list) -> str:
    """The quoted JSON object field of these keys and value texts (json_fields' inverse)."""
    body = ",".join([dumps(k).decode() + ":" + v for k, v in zip(keys, values)])
    return '"{' + body.replace('"', '""') + '}"'


@cython.cclass
class CompactEncoder:
    """Rows of the CSV ledger in, compact rows out (one per row, same order).

    State, from row to row: ``last`` (the previous row's shared columns), ``by_kind``
    (per kind: its last row's own fields, and per JSON column its text, keys, value texts
    and whether it was coded by key; ``blank`` before a kind's first row) and ``hashes``.
    The compiled coder of ``psgate._core`` reads and writes the same state."""

    def __init__(self, header: str) -> None:
        columns = split_row(header)
        missing = [c for c in REQUIRED if c not in columns]
        if missing or columns.index("kind") != KIND_COL or columns[SEQ_COL] != "seq":
            raise ValueError(f"not the ledger's columns (missing {missing or 'kind/seq'})")
        self.columns = columns
        self.json_cols = [i for i in range(len(columns)) if columns[i] in JSON_COLUMNS]
        plain = [i for i in range(len(columns))
                 if i != KIND_COL and i not in self.json_cols]
        self.shared_cols = [i for i in plain if i < SHARED]
        self.own_cols = [i for i in plain if i >= SHARED]
        self.num_cols = len(columns)
        self.kind_col = KIND_COL
        self.seq_at = self.shared_cols.index(SEQ_COL)
        self.hash_col = columns.index("hash")
        self.hash_at = 1 + len(self.shared_cols) + self.own_cols.index(self.hash_col)
        self.hashes = HashIds(HASH_LIMIT)
        self.last = ("",) * len(self.shared_cols)
        self.blank = (("",) * len(self.own_cols),
                      {i: ("", [], [], True) for i in self.json_cols})
        self.by_kind = {}
        self.field_coder = FieldCoder()

    def encode(self, line: str) -> list:
        """The codes of one CSV row (its newline left out)."""
        return self.encode_fields(split_row(line))

    def encode_text(self, rows) -> str:
        """The compact stream's text for these CSV rows (each ending in its "\\n"): each
        row's codes as csv.writer(lineterminator="\\r\\n") writes a row of two or more
        fields (csv_field's quoting)."""
        row: str
        line: str
        codes: list
        lines: list = []
        for row in rows:
            codes = self.encode_fields(split_row(row[:len(row) - 1]))
            line = ",".join(codes)
            # a code that holds a comma, a quote or a line break is quoted (most hold none)
            if (line.count(",") != len(codes) - 1 or '"' in line or "\r" in line
                    or "\n" in line):
                line = ",".join([csv_field(c) for c in codes])
            lines.append(line)
        if not lines:
            return ""
        lines.append("")
        return "\r\n".join(lines)

    def encode_fields(self, fields: list) -> list:
        """The codes of one row split into its fields."""
        j: cython.Py_ssize_t
        i: cython.Py_ssize_t
        hid: cython.Py_ssize_t
        prev: tuple
        prev_own: tuple
        last: tuple = self.last
        pj: tuple
        kind: str
        c: str
        p: str
        h: str
        text: str
        if len(fields) != self.num_cols:
            raise ValueError(f"{len(fields)} fields, the header has {self.num_cols}")
        kind = fields[self.kind_col]
        prev = self.by_kind.get(kind) or self.blank
        prev_own = prev[0]
        prev_json: dict = prev[1]
        out: list = [kind]
        cur: list = []
        for j in range(len(self.shared_cols)):
            i = self.shared_cols[j]
            c = fields[i]
            p = self.seq_pred() if j == self.seq_at else last[j]
            out.append("" if c == p else self.field_coder.code(c, p))
            cur.append(c)
        own: list = []
        for j in range(len(self.own_cols)):
            i = self.own_cols[j]
            c = fields[i]
            p = prev_own[j]
            out.append("" if c == p else self.field_coder.code(c, p))
            own.append(c)
        h = fields[self.hash_col]
        if h:
            hid = self.hashes.see(h)
            if hid >= 0 and out[self.hash_at]:
                out[self.hash_at] = "#" + str(hid)
        json_now: dict = dict(prev_json)
        for j in range(len(self.json_cols)):
            i = self.json_cols[j]
            pj = prev_json[i]
            text = fields[i]
            if pj[3] and text == pj[0]:
                out.append("")
                out.extend([""] * len(pj[1]))
            else:
                self.json_codes(out, i, pj, text, json_now)
        self.last = tuple(cur)
        self.by_kind[kind] = (tuple(own), json_now)
        return out

    def seq_pred(self) -> str:
        """The seq column's prediction: the previous row's plus one, where it is an
        integer."""
        p: str = self.last[self.seq_at]
        num: Number = self.field_coder.pred
        if int_in(p, num):
            return str(num.value + 1)
        return p

    def json_codes(self, out: list, i: cython.Py_ssize_t, pj: tuple, text: str,
                   json_now: dict) -> cython.int:
        """The codes of JSON column i, whose text is not its prediction's (pj: the column's
        last text, keys, value texts and whether it was coded by key), appended to out;
        json_now[i] takes the column's state after this row. A text json_fields does not
        give back exactly is kept verbatim ("!")."""
        parsed = json_fields(text) if text else ([], [])
        if parsed is None:
            out.append("!" + text)
            json_now[i] = (text, pj[1], pj[2], False)
            return 0
        self.known_codes(out, pj, parsed[0], parsed[1])
        json_now[i] = (text, parsed[0], parsed[1], True)
        return 0

    def known_codes(self, out: list, pj: tuple, keys: list, values: list) -> cython.int:
        """The codes of a JSON column read as ``keys`` and their value texts, against its
        prediction pj: "" and each value's code against the last row's where the keys are
        the last row's, else "=" and the keys as a JSON array, then each value verbatim."""
        j: cython.Py_ssize_t
        pvalues: list = pj[2]
        if keys == pj[1]:
            out.append("")
            for j in range(len(values)):
                out.append(self.field_coder.code(values[j], pvalues[j]))
        else:
            out.append("=" + dumps(keys).decode())
            for j in range(len(values)):
                out.append("=" + values[j])
        return 0
