"""The text of the ledger's eviction rows and of requests.csv's rows, field by field.

    eviction_rows(decisions, ...):  one ledger row per victim, numbered on from seq
    request_line(o):                requests.csv's row of one outcome
    json_memo(m, d):                a JSON column's text, canonical JSON quoted for CSV,
                                    with only the values that changed since the last
                                    row formatted again

A row is written as csv.writer would write it (:func:`csv_field`) and its JSON
columns as :func:`csv_json` writes them (orjson, keys sorted, floats rounded to 9
places). The paths for the common values (a str that needs no quotes as it is, an int by
``str``, a float of a flat dict by ``repr``) give the same text, and anything else goes
to those two, so the bytes are theirs whatever the value (tests/receipt/test_row_text.py
holds both to csv.writer and orjson).

Rows of one policy carry the same keys in the same order and mostly the same values
(a segment's counts, an owner's debt), so a :class:`JsonMemo` kept per column checks a
row's keys against the last one's instead of sorting and vetting them (compiled only:
interpreted, orjson is faster, see MEMO_PAYS). The compact ledger's compiled coder reads
the memo too: ``vtexts`` holds each value's JSON text as a
JSON reader gives it back, and ``num_odd`` counts the values (and keys) its own reader
would not take.

The module is written in Cython's pure-Python mode and is the only source of these rows:
``pip install`` compiles it (``row_text.pxd`` gives the types), and without a compiler
it runs as written.
"""

from typing import Optional

import orjson

try:
    import cython
except ImportError:
    from psgate import cython_shadow as cython


def fmt_t(ns) -> str:
    """A time in ns (an integer) as seconds with nine places ("" for None), by floor
    division."""
    if ns is None:
        return ""
    if not isinstance(ns, int):
        raise TypeError(f"a time in ns is an integer, found {type(ns).__name__} {ns!r}")
    frac: cython.longlong = ns % 1_000_000_000
    return f"{ns // 1_000_000_000}.{frac:09d}"


_PLACES = tuple(f".{nd}f" for nd in range(10))      # format specs, made once


def fmt_f(x, nd: cython.int = 6) -> str:
    """A number to ``nd`` places without trailing zeros (nor a trailing point); "0" for
    a zero of either sign, "" for None."""
    if x is None:
        return ""
    s: str = format(x, _PLACES[nd] if 0 <= nd < 10 else f".{nd}f")
    n: cython.Py_ssize_t = len(s)
    while n and s[n - 1] == '0':
        n -= 1
    if n and s[n - 1] == '.':
        n -= 1
    if n == 0 or (n == 2 and s[0] == '-' and s[1] == '0'):
        return "0"
    return s if n == len(s) else s[:n]


def csv_field(v) -> str:
    """One CSV field as ``csv.writer`` writes it (the default dialect: QUOTE_MINIMAL,
    doubled quotes), quoted when it holds a comma, a quote, a line feed or a carriage
    return (RFC 4180), None as nothing, floats by repr. (csv.writer with a "\\n" line
    terminator leaves a lone carriage return unquoted, and every csv reader then takes it
    for the end of the row; with "\\r\\n" it quotes it, as here.)"""
    t = type(v)
    if t is not str:
        if t is int:
            return str(v)
        if v is None:
            return ""
        v = repr(v) if t is float else str(v)
    if needs_quotes(v):
        return '"' + v.replace('"', '""') + '"'
    return v


def canonical(obj) -> str:
    """Canonical JSON of a flat dict of ranking fields; floats rounded to 9 decimals
    so a value reads the same whatever arithmetic path produced it."""
    if not obj:
        return ""
    for v in obj.values():
        if type(v) is float:
            obj = {k: round9(v) if type(v) is float else v for k, v in obj.items()}
            break
    return orjson.dumps(obj, option=orjson.OPT_SORT_KEYS).decode()


_ROUNDED: dict = {}


def round9(v):
    """round(v, 9), remembered for the values rows repeat (a group's debt is on every
    row of its batch). Two non-zero floats equal as keys are the same number; zeros are
    never stored (0.0 == -0.0 as keys, and round keeps the sign), so a hit is exact."""
    r = _ROUNDED.get(v)
    if r is None:
        r = round(v, 9)
        if v:
            if len(_ROUNDED) >= 4096:
                _ROUNDED.clear()
            _ROUNDED[v] = r
    return r


def csv_json(obj) -> str:
    """``csv_field(canonical(obj))``: orjson escapes every line break, so a non-empty
    object's JSON is always quoted (it holds quotes) and never needs csv itself."""
    if not obj:
        return ""
    return '"' + canonical(obj).replace('"', '""') + '"'


def needs_quotes(s: str) -> cython.bint:
    """A CSV field s must be quoted (a quote, a comma or a line break in it)."""
    return '"' in s or ',' in s or '\n' in s or '\r' in s


CACHE_LIMIT = 4096          # the most entries a writer's field or number cache holds


def cached_field(q: dict, v) -> str:
    """csv_field(v), through q, the writer's cache of the fields of the strings its rows
    repeat (groups, queues, owners), which stops growing at CACHE_LIMIT."""
    if type(v) is not str:
        return csv_field(v)
    t = q.get(v)
    if t is None:
        t = csv_field(v)
        if len(q) < CACHE_LIMIT:
            q[v] = t
    return t


def plain_value(v: str) -> cython.bint:
    """A string orjson writes as it is, with no quote to double for the CSV."""
    c: cython.Py_UCS4
    if not v.isascii():
        return False
    for c in v:
        if ord(c) < 32 or ord(c) == 34 or ord(c) == 92:
            return False
    return True


def json_value(v):
    """What orjson writes for one value of a flat dict, or None where the value is not
    one written here (the caller then hands the dict to csv_json): an int of 64 bits, a
    float rounded to 9 places whose repr has no exponent, a boolean, None, a plain ASCII
    string (its quotes doubled for the CSV)."""
    if type(v) is float:
        s = repr(round(v, 9))
        if 'e' in s or 'n' in s:
            return None
        return s
    if type(v) is int:
        if not -0x8000000000000000 <= v <= 0xFFFFFFFFFFFFFFFF:
            return None
        return str(v)
    if type(v) is str:
        if not plain_value(v):
            return None
        return f'""{v}""'
    if v is True:
        return "true"
    if v is False:
        return "false"
    if v is None:
        return "null"
    return None


_UNSET = object()          # a memo's value before any row set it

# Whether a JsonMemo pays: compiled it writes a row's JSON columns several times faster
# than orjson does through csv_json; interpreted its Python is slower than orjson's C, so
# a writer then passes no memos and eviction_rows writes the columns by csv_json.
MEMO_PAYS = cython.compiled


@cython.cclass
class JsonMemo:
    """The last dict :func:`memo_update` wrote for one ledger column: its keys as they
    came, the same sorted, each value with its text (``parts``, the field's pieces;
    ``vtexts``, as a JSON reader gives it back, a string's quotes not doubled), and the
    whole field (``text``, made when asked for). ``odd`` marks the values whose text the
    compact coder's reader would not take, ``num_odd`` counts them and such keys."""

    def __init__(self):
        self.keys = None
        self.order = self.values = self.parts = self.vtexts = None
        self.odd = bytearray()
        self.num_odd = 0
        self.text = None


def same_value(v, pv) -> cython.bint:
    """v would be written as pv was: the same type and value (for a float, not a zero of
    the other sign, which repr tells apart)."""
    if type(v) is not type(pv):
        return False
    if v is pv:
        return True
    if type(v) is float:
        a: cython.double = v
        b: cython.double = pv
        return a == b and a != 0.0
    if type(v) is int or type(v) is str:
        return v == pv
    return False                        # True, False, None: only themselves


def reads_back(v, s: str) -> cython.bint:
    """The compact coder's JSON reader takes s, the text json_value gave for v: a
    string without DEL, an integer of at most 18 digits (floats, booleans and null
    always)."""
    if type(v) is str:
        return '\x7f' not in v
    if type(v) is int:
        return len(s) - (1 if s[0] == '-' else 0) <= 18
    return True


def memo_update(m: JsonMemo, d: dict) -> cython.int:
    """m brought to d (not empty): 1, or 0 where a key or value is not one json_value
    writes (m then holds nothing, and the next row starts afresh). The field's text is
    not built here (memo_text builds it)."""
    i: cython.Py_ssize_t
    n: cython.Py_ssize_t = len(d)
    changed: cython.bint = m.keys is None or len(m.keys) != n
    if not changed:
        i = 0
        for k in d:
            pk = m.keys[i]
            if k is not pk and not (type(k) is str and k == pk):
                changed = True
                break
            i += 1
    if changed:
        for k in d:
            if type(k) is not str or not plain_value(k):
                m.keys = None
                return 0
        m.keys = list(d)
        m.order = sorted(d)
        m.values = [_UNSET] * n
        m.parts = [None] * n
        m.vtexts = [None] * n
        m.odd = bytearray(n)
        m.num_odd = 0
        for k in d:
            if '\x7f' in k:
                m.num_odd += 1              # a key the coder's reader would not take
        m.text = None
    odd: bytearray = m.odd
    order: list = m.order
    values: list = m.values
    for i in range(n):
        k = order[i]
        v = d[k]
        if same_value(v, values[i]):
            continue
        m.text = None
        s = json_value(v)
        if s is None:
            m.keys = None
            return 0
        values[i] = v
        m.parts[i] = f'""{k}"":{s}'
        m.vtexts[i] = '"' + v + '"' if type(v) is str else s
        m.num_odd -= odd[i]
        odd[i] = 0 if reads_back(v, s) else 1
        m.num_odd += odd[i]
    return 1


def memo_text(m: JsonMemo) -> str:
    """The field of the dict m was last brought to (memo_update gave 1)."""
    if m.text is None:
        m.text = '"{' + ",".join(m.parts) + '}"'
    return m.text


def json_memo(m: JsonMemo, obj):
    """csv_json(obj) for a flat dict of the values json_value writes, through m; ""
    for an empty or missing one; None for anything else (the caller hands it to
    csv_json)."""
    if not obj:
        return ""
    if type(obj) is not dict or not memo_update(m, obj):
        return None
    return memo_text(m)


@cython.cclass
class NumberTexts:
    """A writer's cache of the texts fmt_f gives the numbers its rows repeat: the last
    four floats (a row's P before is the row before's P after, and the runner-up's P
    repeats down a run) in a ring, any other number in a dict emptied at CACHE_LIMIT.
    A float's text is a function of its value (both zeros give "0"; a NaN never equals
    itself, so is never found), and numbers equal as dict keys (3 and 3.0) have the same
    text, so a hit is exact."""

    def __init__(self):
        self.values = [0.0, 0.0, 0.0, 0.0]
        self.texts = [None, None, None, None]
        self.next = 0
        self.others = {}


def number_text(p, ff: NumberTexts) -> str:
    """fmt_f(p) for a debt or probability, through the writer's cache ff."""
    j: cython.int
    if type(p) is float:
        v: cython.double = p
        for j in range(4):
            if ff.values[j] == v and ff.texts[j] is not None:
                return ff.texts[j]
        t: str = fmt_f(p)
        ff.values[ff.next] = v
        ff.texts[ff.next] = t
        ff.next = (ff.next + 1) & 3
        return t
    others: dict = ff.others
    s = others.get(p)
    if s is None:
        s = fmt_f(p)
        if len(others) >= CACHE_LIMIT:
            others.clear()
        others[p] = s
    return s


def evict_texts(f: list, d, block, hash_name, owner, q: dict, ff: NumberTexts) -> cython.int:
    """An eviction row's fields from block to runner_up_p, into f[8:19] (the ledger's
    columns)."""
    nc = d.num_candidates
    pos = d.position
    queue = d.queue
    f[8] = csv_field(block)
    f[9] = csv_field(hash_name)
    f[10] = cached_field(q, owner)
    f[11] = csv_field(nc)
    f[12] = csv_field(pos)
    f[13] = cached_field(q, queue)
    f[14] = csv_field(d.responsible or '')
    x = d.responsible_p_before
    f[15] = '' if x is None else number_text(x, ff)
    x = d.responsible_p_after
    f[16] = '' if x is None else number_text(x, ff)
    f[17] = csv_field(d.runner_up or '')
    x = d.runner_up_p
    f[18] = '' if x is None else number_text(x, ff)
    return 0


def eviction_rows(rows: list, decisions, blocks, hash_names, owners, head: str,
                  seq: cython.Py_ssize_t, lead: str, q: dict, ff: NumberTexts,
                  seg_memo: Optional[JsonMemo],
                  rank_memo: Optional[JsonMemo]) -> cython.Py_ssize_t:
    """LedgerWriter.eviction_batch's rows: one per victim (the shortest of the four
    sequences), appended to ``rows`` and numbered from ``seq`` + 1; returns the last seq.
    ``head`` is the run's "run,policy," and ``lead`` the batch's "t,kind,request,group,
    contract,"; ``q`` and ``ff`` are the writer's caches of string and number fields, and
    the memos, kept by the writer from batch to batch, the last segments and rank
    written (None: the columns go straight to csv_json)."""
    i: cython.Py_ssize_t
    num: cython.Py_ssize_t = min(len(decisions), len(blocks), len(hash_names), len(owners))
    f: list = [None] * 19
    for i in range(num):
        d = decisions[i]
        evict_texts(f, d, blocks[i], hash_names[i], owners[i], q, ff)
        seg = d.segments
        f_seg = None if seg_memo is None else json_memo(seg_memo, seg)
        if f_seg is None:
            f_seg = csv_json(seg)
        rank = d.rank
        f_rank = None if rank_memo is None else json_memo(rank_memo, rank)
        if f_rank is None:
            f_rank = csv_json(rank)
        seq += 1
        rows.append(f"{head}{seq},{lead}{f[8]},{f[9]},{f[10]},{f[11]},{f[12]},{f[13]},"
                    f"{f[14]},{f[15]},{f[16]},{f[17]},{f[18]},{f_seg},,,,{f_rank}\n")
    return seq


def request_line(head: bytes, o) -> bytes:
    """requests.csv's row of the outcome o: ``head`` (the run's label and policy fields,
    each with its comma), then the outcome's fields as csv_field writes them (times by
    fmt_t, the millisecond fields by fmt_f to 3 places), and a line feed."""
    line: str = ",".join([
        csv_field(o.id), csv_field(o.group), csv_field(o.contract), csv_field(o.role or ""),
        str(int(o.measure)), csv_field(o.state), csv_field(fmt_t(o.t_ns)),
        csv_field(o.prompt_tokens), csv_field(o.cached_tokens), csv_field(o.new_blocks),
        csv_field(o.recompute_tokens), str(int(o.waited)),
        csv_field(fmt_f(o.wait_ms, 3)), csv_field(fmt_f(o.queue_ms, 3)),
        csv_field(fmt_f(o.prefill_ms, 3)), csv_field(fmt_f(o.ttft_ms, 3)),
        csv_field(fmt_t(o.release_ns)),
        csv_field(o.preemptions), csv_field(o.preempt_recompute_tokens)])
    return head + line.encode() + b"\n"
