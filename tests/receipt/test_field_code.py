"""The compact ledger's field codes (psgate/receipt/field_code.py) against their grammar,
written here as regular expressions, in both of the module's forms: as installed
(compiled where the install compiled it) and interpreted from its source."""

from __future__ import annotations

import csv
import io
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import both_forms
from psgate.receipt import field_code

form = both_forms(field_code)

INT = re.compile(r"(0|-?[1-9][0-9]{0,17})\Z")
SECONDS = re.compile(r"(0|[1-9][0-9]{0,9})\.[0-9]{9}\Z")
DECIMAL = re.compile(r"-?(0|[1-9][0-9]*)\.([0-9]+)\Z")


def decimal(t: str):
    """(digits as an integer, places) of a decimal the "%" code takes, else None."""
    m = DECIMAL.match(t)
    if m is None or len(t) - (t[0] == "-") - 1 > 18:
        return None
    return int(t.replace(".", "")), len(m.group(2))


def oracle_code(cur: str, pred: str) -> str:
    if cur == pred:
        return ""
    if INT.match(cur) and INT.match(pred):
        return f"~{int(cur) - int(pred)}"
    if SECONDS.match(cur) and SECONDS.match(pred):
        return f"^{int(cur.replace('.', '')) - int(pred.replace('.', ''))}"
    c, p = decimal(cur), decimal(pred)
    if c is not None and p is not None and c[1] == p[1] and (c[0] or cur[0] != "-"):
        return f"%{c[0] - p[0]}"
    return "=" + cur


# texts near the grammar's edges: digits, signs, points, a non-ASCII digit, a letter
near_numbers = st.text(alphabet="0123456789-.\u0663e", max_size=24)
times = st.builds(lambda s, ns: f"{s}.{ns:09d}", st.integers(0, 10**10 - 1),
                  st.integers(0, 10**9 - 1))
ints = st.integers(-10**19, 10**19).map(str)
decimals = st.builds(lambda v, k: f"{v / 10**k:.{k}f}", st.integers(-10**19, 10**19),
                     st.integers(1, 12))
fields = st.one_of(near_numbers, times, ints, decimals)
EDGES = ["", "0", "-0", "00", "-", ".", "0.", ".0", "0.0", "-0.0", "1.", "-1.5", "01.5",
         "999999999999999999", "-999999999999999999", "1000000000000000000",
         "9999999999.999999999", "10000000000.000000000", "0.000000000", "00.000000000",
         "1.0000000000", "12345678901234567.8", "1234567890123456789.0", "\u0663", "1e5"]


@settings(max_examples=400, deadline=None)
@given(st.lists(fields, min_size=1, max_size=4))
def test_field_texts_are_read_as_the_grammar_reads_them(form, texts):
    for s in texts + EDGES:
        num = form.Number()
        assert form.is_int(s) == form.int_in(s, num) == bool(INT.match(s)), s
        if INT.match(s):
            assert num.value == int(s)
        assert form.is_time(s) == bool(SECONDS.match(s)), s
        d = decimal(s)
        assert form.decimal_in(s, num) == (d is not None), s
        if d is not None:
            assert (num.value, num.places) == d, s


@settings(max_examples=400, deadline=None)
@given(fields, fields)
def test_codes_are_the_grammar_codes(form, cur, pred):
    fields = form.FieldCoder()
    assert fields.code(cur, pred) == oracle_code(cur, pred)
    assert fields.code(pred, pred) == ""
    assert_step(fields, cur, pred)


def assert_step(fields, cur, pred):
    """step() gives code()'s steps as a mark and a number, and 0 for the rest: verbatim
    codes and time steps from or to a time of ten digits before the point."""
    if cur == pred:
        return
    mark = fields.step(cur, pred)
    want = oracle_code(cur, pred)
    if mark:
        assert chr(mark) + str(fields.delta.value) == want
    else:
        big = [t for t in (cur, pred) if SECONDS.match(t) and t.index(".") == 10]
        assert want[0] == "=" or (want[0] == "^" and big), want


def test_codes_at_the_edges(form):
    fields = form.FieldCoder()
    for cur in EDGES:
        for pred in EDGES:
            assert fields.code(cur, pred) == oracle_code(cur, pred), (cur, pred)
            assert_step(fields, cur, pred)
    assert fields.code("-0.0", "0.5") == "=-0.0"          # its digits would read "0.0"
    assert fields.code("0.5", "-0.0") == "%5"
    assert fields.code("9999999999.999999999", "0.000000000") == "^9999999999999999999"


def test_two_coders_keep_their_own_numbers(form):
    """Each FieldCoder scans into Numbers of its own: a step's difference stays in its
    coder while another codes (two encoders, two threads)."""
    one, two = form.FieldCoder(), form.FieldCoder()
    assert chr(one.step("15", "10")) == "~"
    assert two.code("7", "9") == "~-2"
    assert one.delta.value == 5 and two.delta.value == -2


def csv_line(values: list[str]) -> str:
    """values as csv.writer writes a row (a lone carriage return quoted too)."""
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\r\n").writerow(values)
    return buf.getvalue()[:-2]


def unquoted(field: str) -> str:
    return field[1:-1].replace('""', '"') if field.startswith('"') else field


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(alphabet='ab,"\r\n ', max_size=6), min_size=2, max_size=8))
def test_a_row_splits_into_the_fields_csv_wrote(form, values):
    line = csv_line(values)
    got = form.split_row(line)
    assert ",".join(got) == line
    assert [unquoted(f) for f in got] == values


@pytest.mark.parametrize("line", ['a,b"c', 'a,"b', '"a"b,c', 'a,"b""'])
def test_a_row_csv_did_not_write_is_refused(form, line):
    with pytest.raises(ValueError):
        form.split_row(line)


def test_hashes_are_numbered_as_first_seen_and_the_table_starts_over(form):
    ids = form.HashIds(3)
    assert [ids.see(h) for h in ["a", "b", "a", "c", "d", "a", "d"]] == [-1, -1, 0, -1, -1,
                                                                         -1, 0]
    # "d" filled the table past three: it started over with "d" as 0, then "a" as 1
    assert ids.name(0) == "d" and ids.name(1) == "a"
    for bad in (2, -1, 10**30):
        with pytest.raises(ValueError, match="no trace hash numbered"):
            ids.name(bad)
