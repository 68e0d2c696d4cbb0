"""The compact ledger codes the CSV ledger losslessly: decoding gives it byte for byte,
on hand-made rows full of CSV's awkward cases, on random rows, and on every registered
policy's replay; a damaged compact file is one error naming its row."""

from __future__ import annotations

import csv
import gzip
import io
import json
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from psgate.policies import policy_names
from psgate.receipt import field_code
from psgate.receipt.compact import CompactEncoder, CompactLedgerFile, decode, open_compact
from psgate.receipt.field_code import split_row
from psgate.receipt.ledger import LEDGER_COLUMNS, open_text
from psgate.receipt.row_text import canonical, csv_field, fmt_f
from psgate.errors import InputError

from helpers import interpreted
from test_cli import GOLDEN_ARGS, assert_one_line_error, psgate

HEADER = ",".join(LEDGER_COLUMNS) + "\n"


def compact_bytes(rows: list[str], tmp_path) -> bytes:
    p = tmp_path / "l.compact.csv.gz"
    f = CompactLedgerFile(p)
    f.write_rows([HEADER] + rows)
    f.close()
    return p.read_bytes()


def roundtrip(rows: list[str], tmp_path) -> str:
    data = compact_bytes(rows, tmp_path)
    text = io.TextIOWrapper(gzip.GzipFile(fileobj=io.BytesIO(data)), encoding="utf-8",
                            newline="")
    return "".join(decode(text))


def row(**fields) -> str:
    vals = [fields.get(c, "") for c in LEDGER_COLUMNS]
    return ",".join(csv_field(v) for v in vals) + "\n"


AWKWARD = [
    row(run="baseline", policy="lru", seq=1, t="0.000000000", kind="admit", request="a,b",
        group='q"uote', contract="c\nline", hits=0, allocated=3, new_blocks=3,
        rank=canonical({"charged": 3, "balance": -1.5})),
    row(run="baseline", policy="lru", seq=2, t="0.000000000", kind="evict", request="a,b",
        group='q"uote', contract="c\nline", block=7, hash="ab" * 16, owner="g\r",
        num_candidates=9, position=0, queue="lru", rank=canonical({"freed_t": 0.25})),
    row(run="baseline", policy="lru", seq=3, t="0.000000000", kind="evict", request="a,b",
        group='q"uote', contract="c\nline", block=6, hash="cd" * 16, owner="g\r",
        num_candidates=8, position=0, queue="lru", rank=canonical({"freed_t": 0.5})),
    # keys change, a value is not a number, a float that looks like a time, -0 and 0
    row(run="candidate", policy="prefixshield", seq=1, t="12.000000001", kind="evict",
        block="-0", hash="", owner="", num_candidates=0, position=-3, queue="x/y",
        responsible="g", responsible_p_before="1.5", responsible_p_after="0",
        segments=canonical({"normal": 1, "probationary": 0}),
        rank=canonical({"class": "normal", "segment": "normal", "x": 1.000000000})),
    row(run="candidate", policy="prefixshield", seq=9, t="11.999999999", kind="hit",
        block=0, hash="ef" * 16, owner="g", rank=canonical({"pos": 0})),
    # a JSON column that is not canonical JSON (kept verbatim)
    row(run="candidate", policy="prefixshield", seq=10, t="11.999999999", kind="evict",
        block=1, rank='{"b": 1, "a": 2}'),
    row(run="candidate", policy="prefixshield", seq=11, t="11.999999999", kind="evict",
        block=2, rank="[1,2]", segments="{}"),
]


def test_awkward_rows_decode_byte_for_byte(tmp_path):
    assert roundtrip(AWKWARD, tmp_path) == HEADER + "".join(AWKWARD)
    for r in AWKWARD:
        assert ",".join(split_row(r[:-1])) == r[:-1]


text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
number = st.one_of(st.integers(-10**12, 10**12), st.floats(allow_nan=False, allow_infinity=False))
field = st.one_of(text, st.integers(-5, 10**6).map(str), st.just(""),
                  st.floats(-1e7, 1e7).map(fmt_f), st.floats(-1e7, 1e7).map(repr),
                  st.integers(0, 10**12).map(lambda ns: f"{ns // 10**9}.{ns % 10**9:09d}"),
                  st.dictionaries(st.sampled_from(["a", "b", "freed_seq", "class"]),
                                  st.one_of(number, text, st.booleans(), st.none()),
                                  max_size=4).map(canonical))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["evict", "admit", "hit", "odd,kind"]),
                          st.lists(field, min_size=len(LEDGER_COLUMNS) - 1,
                                   max_size=len(LEDGER_COLUMNS) - 1)), max_size=12))
def test_random_rows_decode_byte_for_byte(tmp_path_factory, rows):
    lines = []
    for kind, fields in rows:
        vals = fields[:4] + [kind] + fields[4:]
        lines.append(",".join(csv_field(v) for v in vals) + "\n")
    assert roundtrip(lines, tmp_path_factory.mktemp("r")) == HEADER + "".join(lines)


@pytest.mark.parametrize("policy", policy_names())
def test_every_policy_compact_ledger_is_the_csv(tmp_path, policy):
    plain, compact = tmp_path / "plain", tmp_path / "compact"
    args = ["replay", "--trace", "bundled:example", "--baseline", "lru", "--candidate",
            policy, "--quiet"]
    assert psgate(*args, "--out", plain, "--ledger-compression", "none").returncode in (0, 1)
    assert psgate(*args, "--out", compact, "--ledger-compression", "compact").returncode in (0, 1)
    got = "".join(open_compact(compact / "ledger.compact.csv.gz")).encode()
    assert got == (plain / "ledger.csv").read_bytes()
    with open_text(compact / "ledger.compact.csv.gz") as fh, \
            open_text(plain / "ledger.csv") as want:
        assert list(csv.DictReader(fh)) == list(csv.DictReader(want))
    r = json.loads((compact / "receipt.json").read_text())
    assert r["config"]["ledger"]["file"] == "ledger.compact.csv.gz"


def test_compact_cli_convert_verify_and_determinism(tmp_path):
    full, c1, c2 = tmp_path / "full", tmp_path / "c1", tmp_path / "c2"
    assert psgate("replay", *GOLDEN_ARGS, "--out", full, "--quiet", "--ledger-compression",
                  "none").returncode == 0
    for d in (c1, c2):          # the default ledger is the compact one
        assert psgate("replay", *GOLDEN_ARGS, "--out", d, "--quiet").returncode == 0
    name = "ledger.compact.csv.gz"
    assert (c1 / name).read_bytes() == (c2 / name).read_bytes()
    assert not (c1 / "ledger.csv").exists()
    size = (c1 / "ledger.compact.csv.gz").stat().st_size
    assert size < len(gzip.compress((full / "ledger.csv").read_bytes()))
    ver = psgate("verify", c1)
    assert ver.returncode == 0, ver.stdout + ver.stderr
    conv = psgate("ledger", "convert", c1)
    assert conv.returncode == 0, conv.stderr
    assert (c1 / "ledger.csv").read_bytes() == (full / "ledger.csv").read_bytes()
    assert psgate("ledger", "convert", c1 / "ledger.compact.csv.gz", "-o",
                  tmp_path / "l.csv.gz").returncode == 0
    plain = (full / "ledger.csv").read_bytes()
    assert gzip.decompress((tmp_path / "l.csv.gz").read_bytes()) == plain
    assert_one_line_error(psgate("ledger", "convert", tmp_path / "none.compact.csv.gz"), 2,
                          "no such compact ledger")
    # the default output now exists: replaced only with --force; never the source itself,
    # and never a file that is not a regular one
    assert_one_line_error(psgate("ledger", "convert", c1), 2, "already exists", "--force")
    assert psgate("ledger", "convert", c1, "--force").returncode == 0
    src = c1 / "ledger.compact.csv.gz"
    before = src.read_bytes()
    assert_one_line_error(psgate("ledger", "convert", src, "-o", src, "--force"), 2,
                          "is the compact ledger being converted")
    link = tmp_path / "link.csv"
    link.symlink_to(tmp_path / "elsewhere.csv")
    assert_one_line_error(psgate("ledger", "convert", src, "-o", link, "--force"), 2,
                          "not a regular file")
    assert src.read_bytes() == before and not (tmp_path / "elsewhere.csv").exists()


def test_damaged_compact_ledgers_are_named_errors(tmp_path):
    rows = AWKWARD[:3]
    good = compact_bytes(rows, tmp_path)
    text = gzip.decompress(good).decode()
    cases = {
        "magic": text.replace("psgate-compact-ledger", "something-else", 1),
        "code": text.replace("evict,", "evict,?", 1),
        "extra": text.rstrip("\r\n") + ",,\r\n",
    }
    lines = text.split("\r\n")
    cases.update({
        "blank-header": "\r\n".join(lines[:1] + [""] + lines[2:]),
        "short-header": "\r\n".join(lines[:1] + ["run,kind"] + lines[2:]),
        "odd-header": "\r\n".join(lines[:1] + ['"run,po""licy"'] + lines[2:]),
        "underscore-delta": text.replace(",~-1,", ",~-1_0,", 1),
    })
    assert ",~-1," in text
    for name, body in cases.items():
        p = tmp_path / f"{name}.compact.csv.gz"
        p.write_bytes(gzip.compress(body.encode()))
        with pytest.raises(InputError) as exc:
            list(open_compact(p))
        assert str(exc.value).startswith(str(p)), name
    cut = tmp_path / "cut.compact.csv.gz"
    cut.write_bytes(good[: len(good) // 2])
    assert_one_line_error(psgate("ledger", "convert", cut, "-o", tmp_path / "out.csv"), 2,
                          "cut.compact.csv.gz")
    assert not (tmp_path / "out.csv").exists()


def test_repeated_hashes_are_numbered_and_the_table_starts_over(tmp_path, monkeypatch):
    monkeypatch.setattr(field_code, "HASH_LIMIT", 3)
    hashes = ["a1" * 16, "b2" * 16, "a1" * 16, "c3" * 16, "d4" * 16, "a1" * 16, "b2" * 16,
              "", "d4" * 16, "d4" * 16]
    rows = [row(run="baseline", policy="lru", seq=i + 1, t="1.000000000", kind="evict",
                block=i, hash=h, rank=canonical({"freed_t": i})) for i, h in enumerate(hashes)]
    assert roundtrip(rows, tmp_path) == HEADER + "".join(rows)
    text = gzip.decompress(compact_bytes(rows, tmp_path)).decode()
    # a1 b2 are 0 1; a1 again is #0; c3 is 2; d4 fills the table, which starts over with
    # d4 as 0, then a1 1 and b2 2 (written out again); d4 next is #0, then predicted ("")
    codes = [line.split(",")[9] for line in text.splitlines()[2:]]
    assert codes == ["=" + hashes[0], "=" + hashes[1], "#0", "=" + hashes[3], "=" + hashes[4],
                     "=" + hashes[5], "=" + hashes[6], "=", "#0", ""]


def test_bytes_per_eviction_beat_gzip_csv(tmp_path):
    """On a flood that evicts thousands of blocks, compact is well under the gzip CSV."""
    trace = tmp_path / "flood.jsonl"
    assert psgate("trace", "gen", "tenant-flood", "-o", trace).returncode == 0
    sizes = {}
    for c in ("gzip", "compact"):
        out = tmp_path / c
        assert psgate("replay", "--trace", trace, "--baseline", "lru", "--candidate",
                      "prefixshield", "--capacity", "576", "--out", out, "--quiet",
                      "--ledger-rows", "evictions", "--ledger-compression", c).returncode == 0
        sizes[c] = sum(f.stat().st_size for f in out.glob("ledger*"))
    assert sizes["compact"] < 0.7 * sizes["gzip"], sizes


def test_decimals_are_coded_by_their_last_place(tmp_path):
    """A probability or debt that moves from row to row is coded as its step in the last
    place, and every decimal edge decodes to its text."""
    from psgate.receipt.compact import _uncode
    code = field_code.FieldCoder().code
    assert code("6817.914304", "6818.914304") == "%-1000000"
    assert code("-0.5", "0.5") == "%-10"
    assert code("0.5", "-0.0") == "%5"
    for cur, pred in [("-0.0", "0.5"), ("1.5", "1.25"), ("01.5", "1.5"), ("1.5e3", "1.5"),
                      ("123456789012345678.0", "1.0"), ("1.", "1.0")]:
        assert code(cur, pred) == "=" + cur
    for cur in DECIMAL_EDGES:
        for pred in DECIMAL_EDGES:
            if cur != pred:
                assert _uncode(code(cur, pred), pred) == cur
    rows = [row(run="candidate", policy="prefixshield", seq=i + 1, t="1.000000000",
                kind="evict", block=i, responsible="g", responsible_p_before=fmt_f(30.123456 - i),
                responsible_p_after=fmt_f(29.123456 - i)) for i in range(20)]
    assert roundtrip(rows, tmp_path) == HEADER + "".join(rows)
    text = gzip.decompress(compact_bytes(rows, tmp_path)).decode()
    codes = [line.split(",")[16] for line in text.splitlines()[3:]]
    assert codes == ["%-1000000"] * 19, codes


def test_version_1_files_still_read():
    """A compact ledger written before the "%" code (version 1) decodes as it did."""
    from pathlib import Path
    data = Path(__file__).resolve().parents[1] / "data" / "compact_v1"
    with gzip.open(data / "ledger.compact.csv.gz", "rt", encoding="utf-8", newline="") as fh:
        assert fh.readline().startswith("psgate-compact-ledger,1")
    got = "".join(open_compact(data / "ledger.compact.csv.gz"))
    assert got.encode() == (data / "ledger.csv").read_bytes()


def test_each_version_numbers_hashes_up_to_its_own_limit(tmp_path, monkeypatch):
    """A version-1 file's hash table started over at its own (smaller) limit: decoding
    numbers its hashes as it was written, not as version 2 would."""
    from psgate.receipt import compact
    monkeypatch.setattr(field_code, "HASH_LIMIT", 3)
    hashes = ["a1", "b2", "c3", "d4", "a1", "b2", "e5", "a1", "d4"] * 2
    rows = [row(run="baseline", policy="lru", seq=i + 1, t="1.000000000", kind="evict",
                block=i, hash=h * 16) for i, h in enumerate(hashes)]
    text = gzip.decompress(compact_bytes(rows, tmp_path)).decode()
    assert text.startswith("psgate-compact-ledger,2\r\n")
    assert "".join(decode(io.StringIO(text))) == HEADER + "".join(rows)
    as_v1 = "psgate-compact-ledger,1" + text[len("psgate-compact-ledger,2"):]
    monkeypatch.setattr(compact, "HASH_LIMIT_V1", 3)
    monkeypatch.setattr(field_code, "HASH_LIMIT", 5)
    assert "".join(decode(io.StringIO(as_v1))) == HEADER + "".join(rows)
    monkeypatch.setattr(compact, "HASH_LIMIT_V1", 5)   # another limit: other hashes
    assert "".join(decode(io.StringIO(as_v1))) != HEADER + "".join(rows)


def test_huge_ids_and_fields_round_trip(tmp_path):
    """Ids past Python's int-to-str limit are text, not numbers; fields past csv's default
    field size read back."""
    huge = [row(run="baseline", policy="lru", seq=1, t="0.000000000", kind="evict",
                request="1" * 4301, block=1, hash="ab" * 16),
            row(run="baseline", policy="lru", seq=2, t="0.000000000", kind="evict",
                request="2" * 4301, block=2, hash="cd" * 16),
            row(run="baseline", policy="lru", seq=3, t="0.000000000", kind="evict",
                request="r" + "x" * 200_000, block=3, hash="ef" * 16)]
    assert roundtrip(huge, tmp_path) == HEADER + "".join(huge)


# -- the encoder as installed (compiled where the install compiled field_code) against
# -- its interpreted form, written by csv.writer ------------------------------------------



def _python_text(rows: list[str]) -> str:
    """The rows' codes by the interpreted encoder's encode, written by csv.writer."""
    enc = interpreted(field_code).CompactEncoder(HEADER[:-1])
    s = io.StringIO()
    csv.writer(s, lineterminator="\r\n").writerows(enc.encode(r[:-1]) for r in rows)
    return s.getvalue()


def _compiled_text(rows: list[str], batch: int = 3) -> str:
    """The rows' compact text by the installed encoder's encode_text, ``batch`` rows a
    call."""
    if not field_code.__file__.endswith((".so", ".pyd")) and os.environ.get("CI"):
        pytest.fail("psgate.receipt.field_code is not compiled: pip install -e . must "
                    "compile it here")
    enc = CompactEncoder(HEADER[:-1])
    return "".join(enc.encode_text(rows[i:i + batch]) for i in range(0, len(rows), batch))


JSON_EDGES = [
    # what the compiled JSON path takes, and what it must hand to the Python form: floats
    # that do not read back as themselves, exponents, -0, long integers, repeated keys,
    # escapes, non-ASCII, nesting, whitespace, an empty object
    '{"a":1.5,"b":2}', '{"a":1.50,"b":2}', '{"a":1.5e3}', '{"a":1E3}', '{"a":-0}',
    '{"a":-0.0}', '{"a":0.1}', '{"a":0.30000000000000004}', '{"a":0.3000000000000000444}',
    '{"a":123456789012345678}', '{"a":1234567890123456789}', '{"a":01}', '{"a":1.}',
    '{"a":1,"a":2}', '{"a":"x\\"y"}', '{"a":"\\u00e9"}', '{"\u00e9":1}', '{"a":"\u00e9"}',
    '{"a":{"b":1}}', '{"a":[1,2]}', '{"a": 1}', '{}', '{"a":true,"b":false,"c":null}',
    '{"a":tru}', '{"a":nulls}', '{"a":"","b":""}', '{"a":1,}', '{"a"1}', '{"a":1}x',
    '{"a":1e-7}', '{"a":100000.0}', '{"a":1e16}', '{"a":-2.5,"b":"s p"}',
    # an object of integers inside one (prefixshield's new_class) and its near misses
    '{"c":1,"n":{"probationary":32,"normal":-3}}', '{"n":{"b":0}}', '{"n":{"b":01}}',
    '{"n":{"b":-0}}', '{"n":{"b":1,"b":2}}', '{"n":{}}', '{"n":{"b":1.5}}', '{"n":{"b":"x"}}',
    '{"n":{"b":1},"m":{"b":1}}', '{"n":{"b":123456789012345678}}',
    '{"n":{"b":1234567890123456789}}', '{"n":{"b" :1}}', '{"n":{"b":1}x}', '{"n":{"b":1}',
    '{"n":{"b":1,}}', '{"n":{"\u00e9":1}}', '{"n":{"b":{"c":1}}}', '{"n":{"b":-}}',
]
TIME_EDGES = ["0.000000000", "9999999999.999999999", "1000000000.000000000",
              "999999999.999999999", "01.000000000", "1.00000000", "1.0000000000", "-1.000000000"]
INT_EDGES = ["0", "-0", "00", "-1", "999999999999999999", "-999999999999999999",
             "1000000000000000000", "1" * 19, "+1", "1_0", "\u0661"]
# "%" codes: the same number of places, at most 18 digits, not a negative zero
DECIMAL_EDGES = ["6817.914304", "6818.914304", "-0.5", "0.5", "-0.0", "0.0", "1.25", "01.5",
                 "1.", ".5", "-.5", "123456789012345678.0", "12345678901234567.8",
                 "-12345678901234567.8", "-99999999999999999.9", "1.5e3", "0.000001",
                 "-0.000001", "1.0", "1.00", "-", "-.", "0.", "1.2.3", "1..2", "\u0663.5",
                 "3.\u0665", " 1.5", "1.5 "]


def test_the_installed_encoder_writes_the_interpreted_codes_at_its_edges():
    lines = list(AWKWARD)
    for i, text in enumerate(JSON_EDGES + JSON_EDGES[::-1]):
        lines.append(row(run="r", policy="p", seq=i, t="1.000000000", kind="evict", block=i,
                         hash="ab" * 16 if i % 3 else "", rank=text,
                         segments=JSON_EDGES[(i * 7) % len(JSON_EDGES)]))
    for i, (t, n) in enumerate(zip(TIME_EDGES * 3, INT_EDGES * 3)):
        lines.append(row(run="r", policy="p", seq=n, t=t, kind="admit", request=n, hits=t,
                         allocated=n, rank=canonical({"t": t, "n": n})))
    for i, x in enumerate(DECIMAL_EDGES + DECIMAL_EDGES[::2] + DECIMAL_EDGES[::-1]):
        y = DECIMAL_EDGES[(i * 5) % len(DECIMAL_EDGES)]
        lines.append(row(run="r", policy="p", seq=i, t="2.000000000", kind="evict", block=i,
                         responsible_p_before=x, responsible_p_after=y, runner_up_p=x,
                         rank=canonical({"d": float(x) if x.strip() and x[-1:].isdigit()
                                         and x.count(".") == 1 and "e" not in x
                                         and x.strip() == x and x.isascii() else x})))
    lines.append(row(run="r", policy="p", seq="x", t="1.0", kind="evict", block='q"',
                     request="a\r\nb", rank='"{""a"":1}"'))
    assert _compiled_text(lines) == _python_text(lines)
    assert _compiled_text(lines, batch=len(lines)) == _python_text(lines)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["evict", "admit", "hit", "odd,kind"]),
                          st.lists(st.one_of(field, st.sampled_from(
                              JSON_EDGES + TIME_EDGES + INT_EDGES + DECIMAL_EDGES)),
                              min_size=len(LEDGER_COLUMNS) - 1,
                              max_size=len(LEDGER_COLUMNS) - 1)), max_size=12))
def test_the_installed_encoder_writes_the_interpreted_codes(rows):
    lines = []
    for kind, fields in rows:
        vals = fields[:4] + [kind] + fields[4:]
        lines.append(",".join(csv_field(v) for v in vals) + "\n")
    assert _compiled_text(lines) == _python_text(lines)


def test_the_installed_encoder_numbers_hashes_as_the_interpreted_one(monkeypatch):
    monkeypatch.setattr(field_code, "HASH_LIMIT", 3)
    monkeypatch.setattr(interpreted(field_code), "HASH_LIMIT", 3)
    hashes = ["a1", "b2", "a1", "c3", "d4", "a1", "", "d4", "d4"] * 3
    lines = [row(run="b", policy="lru", seq=i + 1, t="1.000000000", kind="evict", block=i,
                 hash=h) for i, h in enumerate(hashes)]
    assert _compiled_text(lines) == _python_text(lines)


@pytest.mark.parametrize("compression", ["gzip", "compact"])
def test_the_zlib_level_is_recorded_and_a_receipt_without_one_still_verifies(tmp_path,
                                                                            compression):
    """New receipts record their level (1 by default, or the one asked for); one from
    before the level was recorded (no level) was written at 9, is re-written at 9 by
    verify, and verifies."""
    from psgate import api
    from psgate.report.verify import verify
    # gzip's XFL byte: 4 is zlib's fastest (1), 2 its best (9), 0 any other level
    for level, xfl in (("default", 4), (6, 0), (None, 2)):
        out = tmp_path / f"{compression}-{level}"
        asked = {} if level == "default" else {"ledger_level": level}
        res = api.replay(api.ReplayConfig(candidate="prefixshield", out=out,
                                          ledger_compression=compression, **asked))
        level = 1 if level == "default" else level
        ledger = res.receipt["config"]["ledger"]
        assert ledger.get("level") == level
        assert (out / ledger["file"]).read_bytes()[8] == xfl
        assert verify(out).identical
    with pytest.raises(InputError, match="zlib level"):
        api.replay(api.ReplayConfig(out=tmp_path / "bad", ledger_level=10))
