"""The ledger's and requests.csv's rows (psgate/receipt/row_text.py) against csv.writer
and orjson, in both of the module's forms: as installed (compiled where the install
compiled it) and interpreted from its source. The rows' fast paths (a plain str as it
is, an int by str, a flat dict's JSON from a memo of the last row) must give the bytes
the standard writers give, whatever the value."""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import both_forms, close_ranks, csv_texts, decisions, interpreted
from psgate.engines.results import RequestOutcome
from psgate.policy.base import Decision
from psgate.receipt import row_text

form = both_forms(row_text, scope="function")


def csv_row(fields: list) -> str:
    """fields as csv.writer writes a row (quoting a lone carriage return too), ending
    in a line feed."""
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\r\n").writerow(fields)
    return buf.getvalue()[:-2] + "\n"


def places(x, nd: int = 6) -> str:
    if x is None:
        return ""
    s = f"{x:.{nd}f}".rstrip("0").rstrip(".")
    return "0" if s in ("-0", "") else s


def seconds(ns) -> str:
    return "" if ns is None else f"{ns // 10**9}.{ns % 10**9:09d}"


def json_text(obj) -> str:
    if not obj:
        return ""
    obj = {k: round(v, 9) if type(v) is float else v for k, v in obj.items()}
    return orjson.dumps(obj, option=orjson.OPT_SORT_KEYS).decode()


class Req:
    id, group, contract = "r,1", "g", "standard"


def expected_rows(ds, blocks, names, owners, seq: int = 0) -> str:
    """Each victim's ledger row (LEDGER_COLUMNS) by csv.writer and orjson; an orjson
    refusal as its exception's name."""
    out = []
    try:
        for d, block, name, owner in zip(ds, blocks, names, owners):
            seq += 1
            out.append(csv_row([
                "baseline", "lru", seq, seconds(5_000_000), "evict", Req.id, Req.group,
                Req.contract, block, name, owner, d.num_candidates, d.position, d.queue,
                d.responsible or "", places(d.responsible_p_before),
                places(d.responsible_p_after), d.runner_up or "", places(d.runner_up_p),
                json_text(d.segments), "", "", "", json_text(d.rank)]))
    except TypeError as exc:
        return type(exc).__name__
    return "".join(out)


class Writer:
    """What LedgerWriter keeps from batch to batch for eviction_rows: its field caches,
    the column memos (or none: the columns by csv_json) and seq."""

    def __init__(self, mod, memo: bool = True) -> None:
        self.mod = mod
        self.q, self.ff = {}, mod.NumberTexts()
        self.memos = (mod.JsonMemo(), mod.JsonMemo()) if memo else (None, None)
        self.seq = 0

    def rows(self, ds, blocks, names, owners) -> str:
        mod = self.mod
        out: list[str] = []
        try:
            self.seq = mod.eviction_rows(
                out, ds, blocks, names, owners,
                f"{mod.csv_field('baseline')},{mod.csv_field('lru')},", self.seq,
                f"{mod.fmt_t(5_000_000)},evict,{mod.csv_field(Req.id)},g,standard,",
                self.q, self.ff, *self.memos)
        except TypeError as exc:
            return type(exc).__name__
        return "".join(out)


@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ds=st.lists(decisions(), max_size=6), memo=st.booleans(), data=st.data())
def test_eviction_rows_are_what_csv_and_orjson_write(form, ds, memo, data):
    n = len(ds)
    blocks = data.draw(st.lists(st.one_of(st.integers(1, 99), csv_texts), min_size=n,
                                max_size=n))
    names = data.draw(st.lists(csv_texts, min_size=n, max_size=n))
    owners = data.draw(st.lists(st.one_of(csv_texts, st.none()), min_size=n, max_size=n))
    assert Writer(form, memo).rows(ds, blocks, names, owners) == \
        expected_rows(ds, blocks, names, owners)


def test_a_writer_keeps_memos_where_they_pay():
    """Compiled, the memos write the JSON columns; interpreted, orjson does (faster there)."""
    from psgate.receipt.ledger import LedgerWriter
    w = LedgerWriter(Path("/dev/null"))
    try:
        assert row_text.MEMO_PAYS == row_text.__file__.endswith((".so", ".pyd"))
        assert all((m is not None) == row_text.MEMO_PAYS for m in w._memos)
        assert interpreted(row_text).MEMO_PAYS is False
    finally:
        w.close()


def test_fmt_t_refuses_a_time_that_is_not_an_integer(form):
    assert form.fmt_t(True) == "0.000000001"
    with pytest.raises(TypeError, match="found float 5.0"):
        form.fmt_t(5.0)


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches=st.lists(st.lists(st.tuples(close_ranks(), st.booleans()), max_size=5),
                        max_size=5))
def test_rows_of_repeating_ranks_keep_their_text(form, batches):
    """Batches whose ranks repeat the last one (a copy, equal) or change a few values:
    the memo carried from batch to batch writes what a fresh write would."""
    w = Writer(form)
    last = {"seg": 1}
    for batch in batches:
        ds = []
        for rank, repeat in batch:
            rank = dict(last) if repeat else rank
            last = rank
            ds.append(Decision(victim=1, num_candidates=1, position=0, queue="lru",
                               segments={"hot": len(rank)}, rank=rank))
        k = len(ds)
        want = expected_rows(ds, [1] * k, ["h"] * k, ["g"] * k, w.seq)
        assert w.rows(ds, [1] * k, ["h"] * k, ["g"] * k) == want


def test_rows_alternating_between_look_alike_values(form):
    """Every ordered pair of values that compare equal but are written apart (0, False,
    0.0, -0.0; 1, True, 1.0), or that csv_json must write (1e-7, a backslash), in
    consecutive rows of the same keys: the memo must not reuse the first one's text."""
    look_alike = [0, False, 0.0, -0.0, 1, True, 1.0, 1e-7, "a\\b", None, "0"]
    ds = [Decision(victim=1, num_candidates=1, position=0, queue="lru",
                   segments={"hot": 1}, rank={"n": 2, "debt": a, "seg": "p"})
          for a in look_alike for b in look_alike for a in (a, b, a)]
    w = Writer(form)
    got = "".join(w.rows(ds[i:i + 3], [1] * 3, ["h"] * 3, ["g"] * 3)
                  for i in range(0, len(ds), 3))
    assert got == expected_rows(ds, [1] * len(ds), ["h"] * len(ds), ["g"] * len(ds))
    assert '""debt"":-0.0' in got


def test_json_values_at_the_edges_of_the_fast_path(form):
    """Floats near an exponent, 64-bit bounds, booleans, non-ASCII and quoted keys: the
    memo's text or orjson's, the same bytes."""
    edges = [0.0, -0.0, 1e-4, 9.999e-5, 1e15, 9999999999999998.0, 1e16, 0.1 + 0.2,
             123456789.1234567891, -2.5, math.inf, -math.inf, 2**63, -2**63, 2**64,
             2**64 - 1, -2**63 - 1, True, False, 7, 1.0000000005, 1.0000000004999]
    num_checked = 0
    for v in edges:
        for key in ("freed_t", "\u00e9", 'a"b'):
            ds = [Decision(victim=1, num_candidates=1, position=0, queue="lru",
                           rank={key: v, "b": 1})]
            want = expected_rows(ds, [1], ["h"], ["g"])
            assert Writer(form).rows(ds, [1], ["h"], ["g"]) == want, (key, v)
            num_checked += want != "TypeError"
    assert num_checked >= 3 * (len(edges) - 2)      # orjson refuses 2**64 and -2**63 - 1


def test_the_memo_tells_the_compact_coder_which_texts_its_reader_takes(form):
    """vtexts are the values' JSON texts unquoted for CSV; num_odd counts the values
    (19-digit integers, DEL in a string) and keys (DEL) its reader would hand back."""
    m = form.JsonMemo()
    assert form.json_memo(m, {"a": 1, "b": "x"}) == '"{""a"":1,""b"":""x""}"'
    if not form.__file__.endswith(".py"):
        return                    # compiled, the memo's fields are C fields, for the coder
    assert m.vtexts == ["1", '"x"'] and m.num_odd == 0
    form.json_memo(m, {"a": 10**18, "b": "x\x7f"})
    assert m.num_odd == 2
    form.json_memo(m, {"a": 1, "b": "x\x7f"})
    assert m.num_odd == 1
    form.json_memo(m, {"k\x7f": 1})
    assert m.num_odd == 1 and m.order == ["k\x7f"]


_ms = st.one_of(st.none(), st.floats(), st.sampled_from([0.0, -0.0, 0.0004, 0.0005, 71.92,
                                                         1e300, 2.5e-7]), st.integers(-5, 5))
_ns = st.one_of(st.none(), st.integers(-3 * 10**9, 3 * 10**9), st.integers(-2**70, 2**70),
                st.sampled_from([0, -1, 999_999_999, -1_000_000_000, 2**63 - 1, -2**63]))


@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(o=st.builds(RequestOutcome, id=csv_texts, group=csv_texts, contract=csv_texts,
                   role=st.one_of(st.none(), csv_texts), measure=st.booleans(),
                   state=st.sampled_from(["completed", "a,b"]), t_ns=_ns,
                   prompt_tokens=st.one_of(st.integers(0, 2**70), st.floats(0, 9)),
                   cached_tokens=st.integers(-2**64, 2**64), new_blocks=st.booleans(),
                   recompute_tokens=st.integers(0, 9), queue_ms=_ms, prefill_ms=_ms,
                   ttft_ms=_ms, release_ns=_ns, waited=st.booleans(), wait_ms=_ms,
                   preemptions=st.integers(0, 2**70),
                   preempt_recompute_tokens=st.one_of(st.integers(-2**70, 2**70),
                                                      st.floats(0, 9))),
       label=csv_texts)
def test_request_lines_are_what_csv_writes(form, o, label):
    """requests.csv's row of an outcome: its fields by csv.writer, times as seconds by
    floor division, the millisecond fields to three places."""
    head = f"{form.csv_field(label)},{form.csv_field('lru')},".encode()
    want = csv_row([label, "lru", o.id, o.group, o.contract, o.role or "", int(o.measure),
                    o.state, seconds(o.t_ns), o.prompt_tokens, o.cached_tokens, o.new_blocks,
                    o.recompute_tokens, int(o.waited), places(o.wait_ms, 3),
                    places(o.queue_ms, 3), places(o.prefill_ms, 3), places(o.ttft_ms, 3),
                    seconds(o.release_ns), o.preemptions, o.preempt_recompute_tokens])
    assert form.request_line(head, o) == want.encode()
