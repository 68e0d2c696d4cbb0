"""The fast formatters write exactly the bytes of the slow references they replace:
psgate.trace.jcs.dumps is rfc8785.dumps, the ledger's fields are csv.writer's, and
LedgerWriter's rows are those of a csv.writer-based writer on the same calls."""

from __future__ import annotations

import csv
import io
import random
import struct
from types import SimpleNamespace

import orjson
import pytest
import rfc8785

from psgate.policy.base import Decision
from psgate.receipt.ledger import LEDGER_COLUMNS, LedgerWriter, open_text
from psgate.receipt.row_text import canonical, csv_field, csv_json, fmt_f, fmt_t
from psgate.trace import jcs


def _outcome(fn, v):
    try:
        return fn(v), None
    except Exception as exc:  # noqa: BLE001 - the error itself is what is compared
        return None, (type(exc), str(exc))


def test_jcs_every_code_point_as_string_and_key():
    for cp in range(0x110000):
        if 0xD800 <= cp <= 0xDFFF:
            continue
        s = chr(cp)
        assert jcs.dumps(s) == rfc8785.dumps(s), hex(cp)
    keys = {chr(cp): cp for cp in (0x41, 0x7F, 0xE9, 0xD7FF, 0xE000, 0xFFFF, 0x10000, 0x1F600)}
    assert jcs.dumps(keys) == rfc8785.dumps(keys)


def _rng_value(rng: random.Random, depth: int = 0):
    def rfloat():
        k = rng.random()
        if k < 0.3:
            return struct.unpack("d", struct.pack("Q", rng.getrandbits(64)))[0]
        if k < 0.6:
            return round(rng.uniform(-1e6, 1e6), rng.randrange(10))
        if k < 0.8:
            return float(rng.randrange(-10**22, 10**22)) * 10.0 ** rng.randrange(-30, 30)
        return rng.choice([0.0, -0.0, 1e16, 1e21, 1e-7, 1e-6, 1e15, 5e-324, 0.1, 1.0, -1.0,
                           1.7976931348623157e308, 123456789012345680.0])

    def rstr():
        ranges = [(0, 128), (0, 0xD800), (0xE000, 0x10000), (0x10000, 0x110000)]
        return "".join(chr(rng.randrange(*ranges[rng.randrange(4)]))
                       for _ in range(rng.randrange(8)))

    def rint():
        return rng.choice([rng.randrange(-100, 100), rng.randrange(-2**53 + 1, 2**53),
                           2**53 - 1, -(2**53 - 1), 2**53, -(2**53), 2**64])

    k = rng.random()
    if depth > 4 or k < 0.5:
        return rng.choice([rfloat, rstr, rint, lambda: None, lambda: True, lambda: False])()
    if k < 0.75:
        return [_rng_value(rng, depth + 1) for _ in range(rng.randrange(5))]
    return {rstr(): _rng_value(rng, depth + 1) for _ in range(rng.randrange(5))}


@pytest.mark.parametrize("seed", [0, 1])
def test_jcs_equals_rfc8785_on_random_values(seed):
    rng = random.Random(seed)
    for _ in range(20000):
        v = _rng_value(rng)
        if rng.random() < 0.5:     # as the trace reader sees it: parsed by orjson
            try:
                v = orjson.loads(orjson.dumps(v))
            except orjson.JSONEncodeError:
                continue
        assert _outcome(jcs.dumps, v) == _outcome(rfc8785.dumps, v), v


def _csv_ref(v) -> str:
    # "\r\n" as terminator, so that csv.writer quotes a lone carriage return too
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\r\n").writerow([v, ""])
    return buf.getvalue()[:-3]


class _RowsLF:
    """csv.writer's fields (quoting CR as well as LF, as with "\r\n"), rows ended by "\n"."""

    def __init__(self, fh) -> None:
        self._fh = fh

    def writerow(self, row) -> None:
        buf = io.StringIO()
        csv.writer(buf, lineterminator="\r\n").writerow(row)
        self._fh.write(buf.getvalue()[:-2] + "\n")


def test_csv_field_equals_csv_writer():
    rng = random.Random(3)
    alphabet = ['"', ",", "\n", "\r", " ", "a", "é", "\t", "'", ";", "\x00", "z"]
    values = ["", "plain", 0, -7, 12345678901234567890, None, 1.5, -0.0, 1e300, True]
    values += ["".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 7)))
               for _ in range(5000)]
    for v in values:
        assert csv_field(v) == _csv_ref(v), repr(v)
    for obj in ({}, None, {"a": 1}, {"b": 0.1 + 0.2, "a": [1, ","], "c": 'q"uote\r\n'}):
        assert csv_json(obj) == csv_field(canonical(obj))


class _RefWriter:
    """The ledger as csv.writer writes it, one call per row."""

    def __init__(self, fh, hits):
        self._w = _RowsLF(fh)
        self._w.writerow(LEDGER_COLUMNS)
        self.hits, self.run, self.policy, self.seq = hits, "", "", 0

    def start_run(self, run, policy):
        self.run, self.policy, self.seq = run, policy, 0

    def _row(self, now_ns, kind, req, block="", hash_name="", owner="", decision=None,
             hits="", allocated="", new_blocks="", note=None):
        self.seq += 1
        if decision is not None:
            d = decision
            core = [d.num_candidates, d.position, d.queue, d.responsible or "",
                    fmt_f(d.responsible_p_before), fmt_f(d.responsible_p_after),
                    d.runner_up or "", fmt_f(d.runner_up_p), canonical(d.segments)]
            rank = canonical(d.rank)
        else:
            core = [""] * 9
            rank = canonical(note)
        self._w.writerow([self.run, self.policy, self.seq, fmt_t(now_ns), kind, req.id,
                          req.group, req.contract, block, hash_name, owner, *core, hits,
                          allocated, new_blocks, rank])

    def eviction(self, now_ns, req, decision, block, hash_name, owner):
        self._row(now_ns, "evict", req, block, hash_name, owner, decision=decision)

    def admission(self, now_ns, req, hits, allocated, new_blocks, note):
        self._row(now_ns, "admit", req, hits=hits, allocated=allocated, new_blocks=new_blocks,
                  note=note)

    def hit(self, now_ns, req, pos, block, hash_name, owner):
        self._row(now_ns, "hit", req, block, hash_name, owner, note={"pos": pos})


def test_ledger_rows_equal_csv_writer(tmp_path):
    rng = random.Random(7)
    names = ["t0", "a,b", 'q"x', "line\nbreak", "cr\rhere", "é", "", "g/probationary"]
    out = tmp_path / "ledger.csv"
    w = LedgerWriter(out, hits=True)
    w.FLUSH_ROWS = 5                   # exercise the batching
    buf = io.StringIO()
    ref = _RefWriter(buf, hits=True)
    for run, policy in (("baseline", "lru"), ("cand,idate", 'p"s')):
        for x in (w, ref):
            x.start_run(run, policy)
        now = 0
        for i in range(400):
            now += rng.choice([0, 0, 1, 999_999_999, 10**12 + 3])
            req = SimpleNamespace(id=rng.choice(names) + str(i % 7), group=rng.choice(names),
                                  contract=rng.choice(names))
            kind = rng.randrange(3)
            if kind == 0:
                rows = []
                for _ in range(rng.choice([1, 1, 2, 5])):
                    d = Decision(victim=1, num_candidates=rng.randrange(9),
                                 position=rng.randrange(3), queue=rng.choice(names),
                                 responsible=rng.choice([None] + names),
                                 responsible_p_before=rng.choice([None, 0.1 + 0.2, -0.0, 3.0]),
                                 responsible_p_after=rng.choice([None, 1e-7, 2.5]),
                                 runner_up=rng.choice([None, "r,u"]),
                                 runner_up_p=rng.choice([None, 1 / 3]),
                                 segments=rng.choice([None, {}, {"probationary": 2,
                                                                 "normal": 0}]),
                                 rank=rng.choice([{}, {"freed_t": 0.1 + 0.2, "s": 'a"b'},
                                                  {"z": -0.0, "w": 0.0}, {"n": 3, "f": False}]))
                    rows.append((d, rng.randrange(100), f"{rng.getrandbits(64):x}",
                                 rng.choice(names)))
                for d, block, h, owner in rows:
                    ref.eviction(now, req, d, block, h, owner)
                if rng.random() < 0.5:            # one allocation's rows in one call
                    w.eviction_batch(now, req, *(list(c) for c in zip(*rows)))
                else:
                    for d, block, h, owner in rows:
                        w.eviction(now, req, d, block, h, owner)
            elif kind == 1:
                args = (now, req, rng.randrange(5), rng.randrange(5), rng.randrange(5),
                        rng.choice([None, {}, {"charged": 3, "balance": -1.25, "x": "y,z"}]))
                for x in (w, ref):
                    x.admission(*args)
            else:
                args = (now, req, rng.randrange(5), rng.randrange(100), "ab12",
                        rng.choice(names))
                for x in (w, ref):
                    x.hit(*args)
    w.close()
    assert out.read_bytes().decode("utf-8") == buf.getvalue()


def test_a_lone_carriage_return_is_quoted_and_the_ledger_reads_back(tmp_path):
    """A request or group id with a lone CR is quoted (csv.writer with a "\\n" terminator
    leaves it bare, and a csv reader then ends the row there): explain reads the row."""
    from helpers import write
    from test_cli import psgate
    assert csv_field("a\rb") == '"a\rb"' and csv_field("\r") == '"\r"'
    trace = write(tmp_path, [
        {"t": 0, "id": "r\r1", "group": "g\rx", "blocks": ["a", "b", "c"], "done_t": 1},
        {"t": 2, "id": "r2", "group": "h", "blocks": ["d", "e", "f"], "done_t": 3},
    ])
    out = tmp_path / "out"
    assert psgate("replay", "--trace", trace, "--baseline", "lru", "--candidate", "lru",
                  "--capacity", "5", "--scheduler", "service", "--out", out,
                  "--quiet").returncode == 0
    with open_text(out / "ledger.compact.csv.gz") as fh:
        rows = list(csv.DictReader(fh))
    assert {r["request"] for r in rows} == {"r\r1", "r2"}
    evict = next(r for r in rows if r["kind"] == "evict" and r["run"] == "candidate")
    assert evict["owner"] == "g\rx"
    proc = psgate("explain", out, "--decision", evict["seq"])
    assert proc.returncode == 0 and "Victim: block" in proc.stdout, proc.stderr
