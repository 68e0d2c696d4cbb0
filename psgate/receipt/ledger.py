"""ledger.csv and requests.csv writers.

One header serves every policy: fixed core columns plus ``rank``, canonical
JSON of the policy's own ranking fields. Per admission the ledger has its
eviction rows first, then the admission row; per-block hit rows only when
asked for. Numbers are formatted explicitly so the bytes never depend on
anything but the inputs.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import mmap
from array import array
from collections.abc import Iterable
from pathlib import Path

from psgate import core
from psgate.engines.results import OutcomeSink, RequestOutcome
from psgate.inputs import open_input, require_regular
from psgate.receipt.row_text import (MEMO_PAYS, JsonMemo, NumberTexts, csv_field, csv_json,
                                     eviction_rows, fmt_t, request_line)

LEDGER_COLUMNS = (
    "run", "policy", "seq", "t", "kind", "request", "group", "contract", "block", "hash",
    "owner", "num_candidates", "position", "queue", "responsible", "responsible_p_before",
    "responsible_p_after", "runner_up", "runner_up_p", "segments", "hits", "allocated",
    "new_blocks", "rank",
)
REQUEST_COLUMNS = (
    "run", "policy", "id", "group", "contract", "role", "measure", "state", "t",
    "prompt_tokens", "cached_tokens", "new_blocks", "recompute_tokens", "waited", "wait_ms",
    "queue_ms", "prefill_ms", "ttft_ms", "done_t", "preemptions", "preempt_recompute_tokens",
)


LEDGER_ROWS = ("all", "evictions")
COMPRESSIONS = ("none", "gzip", "compact")
LEDGER_NAMES = {"none": "ledger.csv", "gzip": "ledger.csv.gz",
                "compact": "ledger.compact.csv.gz"}


def ledger_name(compression: str) -> str:
    return LEDGER_NAMES[compression]


# The zlib level of gzip and compact ledgers. A receipt records it (config.ledger.level),
# since the ledger's digest covers the compressed bytes; one without it was written at 9,
# GzipFile's default. At level 6 compression was a sixth of a Mooncake replay's time; it
# takes 2.6-2.7 times level 1's time there for 10-15% fewer bytes (compact and gzip CSV
# ledgers), so the default is 1 and --ledger-level (config.ledger.level) trades time for
# bytes.
GZIP_LEVEL = 1
LEGACY_GZIP_LEVEL = 9
GZIP_LEVELS = range(1, 10)


def gzip_writer(raw, level: int = GZIP_LEVEL) -> gzip.GzipFile:
    """A gzip stream onto the binary file ``raw`` with no name and no time in its header,
    so its bytes depend only on what is written and the level (closing it leaves ``raw``
    open)."""
    return gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=level)


def open_text(path: Path):
    """A ledger or any CSV output for reading, gzip or plain by its name; a compact
    ledger (psgate.receipt.compact) reads as the CSV it codes."""
    if path.name.endswith(".compact.csv.gz"):
        from psgate.receipt.compact import open_compact
        return contextlib.closing(open_compact(path))      # iterable lines, closed by with
    require_regular(path, "ledger")
    if path.name.endswith(".gz"):
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", newline="")
    return open(path, newline="", encoding="utf-8")


class LedgerWriter:
    """The engine's recorder: one CSV row per decision, streamed to disk.

    ``rows="evictions"`` keeps only eviction rows (admissions still advance ``seq``, so
    a decision has the same number in every mode); ``compression="gzip"`` writes a gzip
    stream with no name and no timestamp at zlib ``level``, so its bytes too depend only
    on the inputs;
    ``compression="compact"`` codes each row against the ones before it first
    (psgate.receipt.compact), a lossless form of the same CSV.

    Rows are formatted field by field (``row_text``: the bytes csv.writer would write)
    and written in batches of ``FLUSH_ROWS`` lines."""

    FLUSH_ROWS = 2048

    def __init__(self, path: Path, hits: bool = False, rows: str = "all",
                 compression: str = "none", level: int = GZIP_LEVEL) -> None:
        self._compact = None
        if compression == "gzip":
            self._raw = open(path, "wb")
            self._gz = gzip_writer(self._raw, level)
            self._fh = io.TextIOWrapper(self._gz, encoding="utf-8", newline="")
        elif compression == "compact":
            from psgate.receipt.compact import CompactLedgerFile
            self._raw = self._gz = self._fh = None
            self._compact = CompactLedgerFile(path, level)
        else:
            self._raw = self._gz = None
            self._fh = open(path, "w", newline="", encoding="utf-8")
        self._buf: list[str] = [",".join(csv_field(c) for c in LEDGER_COLUMNS) + "\n"]
        self.hits = hits and rows == "all"
        self.evictions_only = rows == "evictions"
        self.run = ""
        self.policy = ""
        self.seq = 0
        self._head = ","                 # "run,policy," quoted as csv would
        self._run_f = self._policy_f = ""
        self._req = None                 # the request whose fields _req_s holds
        self._req_f = ("", "", "")
        self._req_s = ""
        self._t_ns = None
        self._t_s = ""
        self._q: dict = {}               # the texts of the fields and numbers rows repeat
        self._ff = NumberTexts()
        self._core = core.get()
        # the last segments and rank written (row_text.MEMO_PAYS)
        self._memos = (JsonMemo(), JsonMemo()) if MEMO_PAYS else (None, None)

    def start_run(self, run: str, policy: str) -> None:
        self.run, self.policy = run, policy
        self.seq = 0
        self._run_f, self._policy_f = csv_field(run), csv_field(policy)
        self._head = f"{self._run_f},{self._policy_f},"
        self._req = None

    def _prefix(self, now_ns, kind, req) -> str:
        """run,policy,seq,t,kind,request,group,contract, for the next seq."""
        self.seq += 1
        if now_ns != self._t_ns:
            self._t_ns, self._t_s = now_ns, fmt_t(now_ns)
        if req is not self._req:
            self._req = req
            self._req_f = (csv_field(req.id), csv_field(req.group), csv_field(req.contract))
            self._req_s = ",".join(self._req_f)
        return f"{self._head}{self.seq},{self._t_s},{kind},{self._req_s}"

    def _flush(self) -> None:
        if self._compact is not None:
            self._compact.write_rows(self._buf)
        else:
            self._fh.write("".join(self._buf))
        self._buf.clear()

    def _write(self, line: str) -> None:
        buf = self._buf
        buf.append(line)
        if len(buf) >= self.FLUSH_ROWS:
            self._flush()

    def eviction(self, now_ns, req, decision, block, hash_name, owner) -> None:
        self.eviction_batch(now_ns, req, [decision], [block], [hash_name], [owner])

    def eviction_batch(self, now_ns, req, decisions, blocks, hash_names, owners) -> None:
        """eviction() for each of one allocation's victims, in order, in one call."""
        self._prefix(now_ns, "evict", req)          # the batch's time and request fields
        self.seq -= 1
        seq = self.seq
        compact = self._compact
        if compact is not None and self._core is not None:
            if self._buf:            # the rows before these first (and the header)
                self._flush()
            if compact.codes_evictions:
                # coded from the rows' fields, without making the CSV rows
                self.seq = compact.write_evictions(
                    decisions, blocks, hash_names, owners,
                    (self._run_f, self._policy_f, self._t_s, "evict", *self._req_f), seq,
                    self._q, self._ff, *self._memos)
                return
        buf = self._buf
        self.seq = eviction_rows(buf, decisions, blocks, hash_names, owners, self._head, seq,
                                 f"{self._t_s},evict,{self._req_s},", self._q, self._ff,
                                 *self._memos)
        if len(buf) >= self.FLUSH_ROWS:
            self._flush()

    def admission(self, now_ns, req, hits, allocated, new_blocks, note) -> None:
        if self.evictions_only:
            self.seq += 1
            return
        f = csv_field
        self._write(f"{self._prefix(now_ns, 'admit', req)},,,,,,,,,,,,,{f(hits)},"
                    f"{f(allocated)},{f(new_blocks)},{csv_json(note)}\n")

    def hit(self, now_ns, req, pos, block, hash_name, owner) -> None:
        f = csv_field
        self._write(f"{self._prefix(now_ns, 'hit', req)},{f(block)},{f(hash_name)},{f(owner)},"
                    f",,,,,,,,,,,,{csv_json({'pos': pos})}\n")

    def close(self) -> None:
        if self._buf:
            self._flush()
        if self._compact is not None:
            self._compact.close()
            return
        self._fh.close()      # closes the gzip stream, which closes nothing beneath it
        if self._raw is not None:
            self._raw.close()


class RequestSpool(OutcomeSink):
    """One run's requests.csv rows, written to a scratch file as requests finish.

    requests.csv lists a run's requests by (t, id), while they finish in another order. Each
    finished request's row goes to the scratch file at once; what stays in memory is 20
    bytes per request (where its row is, its length and its time, by arrival index), so a
    replay's memory does not grow with the rows of the trace. Arrival order is time order,
    so placing rows by arrival index sorts them by t; requests that share a t are put in
    id order when the file is written (:meth:`write_to`)."""

    def __init__(self, path: Path, label: str, policy: str) -> None:
        self.path = path
        self.label, self.policy = label, policy
        self._fh = open(path, "wb")
        self._buf: list[bytes] = []
        self._size = 0                 # bytes of rows so far, buffered ones included
        self.offset = array("q")       # arrival index -> row start, -1 for none
        self.length = array("I")
        self.t_ns = array("q")
        self.num_rows = 0
        self._head = f"{csv_field(label)},{csv_field(policy)},".encode()

    def add(self, o: RequestOutcome, index: int) -> None:
        row = request_line(self._head, o)
        have = len(self.offset)
        if index >= have:
            more = index + 1 - have
            self.offset.extend(array("q", [-1]) * more)
            self.length.extend(array("I", [0]) * more)
            self.t_ns.extend(array("q", [0]) * more)
        self.offset[index] = self._size
        self.length[index] = len(row)
        self.t_ns[index] = o.t_ns
        self._size += len(row)
        self.num_rows += 1
        buf = self._buf
        buf.append(row)
        if len(buf) >= 2048:
            self._fh.write(b"".join(buf))
            buf.clear()

    def extend(self, outcomes: Iterable[RequestOutcome]) -> "RequestSpool":
        """Rows of outcomes already in arrival order (an engine that does not stream)."""
        for i, o in enumerate(outcomes):
            self.add(o, i)
        return self

    def write_to(self, out) -> None:
        """This run's rows, by (t, id), to the binary file ``out``; the scratch file is
        removed."""
        if self._buf:
            self._fh.write(b"".join(self._buf))
            self._buf.clear()
        self._fh.close()
        try:
            with open(self.path, "rb") as fh:
                data = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) if self._size else b""
            offset, length, t_ns = self.offset, self.length, self.t_ns
            n = len(offset)
            head = len(f"{csv_field(self.label)},{csv_field(self.policy)},".encode())
            batch: list[bytes] = []
            i = 0
            while i < n:
                if offset[i] < 0:
                    i += 1
                    continue
                j = i + 1
                while j < n and (offset[j] < 0 or t_ns[j] == t_ns[i]):
                    j += 1
                rows = [data[offset[k]:offset[k] + length[k]] for k in range(i, j)
                        if offset[k] >= 0]
                if len(rows) > 1:             # requests that share a time: by id
                    rows.sort(key=lambda row: _field_at(row, head))
                batch.extend(rows)
                if len(batch) >= 4096:
                    out.write(b"".join(batch))
                    batch.clear()
                i = j
            out.write(b"".join(batch))
            if isinstance(data, mmap.mmap):
                data.close()
        finally:
            self.path.unlink(missing_ok=True)


def _field_at(row: bytes, start: int) -> str:
    """The field of a row that starts at byte ``start``, as csv_field wrote it: quoted (its
    quotes doubled) when it begins with a quote, else plain up to the next comma."""
    s = row[start:].decode()
    if not s.startswith('"'):
        return s[:s.index(",")]
    parts, i = [], 1
    while True:
        j = s.index('"', i)
        if s.startswith('"', j + 1):
            parts.append(s[i:j + 1])
            i = j + 2
        else:
            parts.append(s[i:j])
            return "".join(parts)


def write_requests(path: Path, runs: list[tuple[str, str, list[RequestOutcome]]]
                   | list[RequestSpool]) -> None:
    """requests.csv: every run's rows by (t, id), runs in order. ``runs``: spools filled
    while the runs were replayed, or (label, policy, outcomes) with outcomes in memory."""
    with open(path, "wb") as fh:
        fh.write(",".join(REQUEST_COLUMNS).encode() + b"\n")
        for run in runs:
            if not isinstance(run, RequestSpool):
                label, policy, outcomes = run
                head = f"{csv_field(label)},{csv_field(policy)},".encode()
                rows = sorted(outcomes, key=lambda o: (o.t_ns, o.id))
                fh.write(b"".join(request_line(head, o) for o in rows))
                continue
            run.write_to(fh)


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open_input(path, "output file") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
