"""ledger.csv and requests.csv writers.

One header serves every policy: fixed core columns plus ``rank``, canonical
JSON of the policy's own ranking fields. Per admission the ledger has its
eviction rows first, then the admission row; per-block hit rows only when
asked for. Numbers are formatted explicitly so the bytes never depend on
anything but the inputs.
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import io
from pathlib import Path

import orjson

from psgate.engines.results import RequestOutcome

LEDGER_COLUMNS = (
    "run", "policy", "seq", "t", "kind", "request", "group", "contract", "block", "hash",
    "owner", "num_candidates", "position", "queue", "responsible", "responsible_p_before",
    "responsible_p_after", "runner_up", "runner_up_p", "segments", "hits", "allocated",
    "new_blocks", "rank",
)
REQUEST_COLUMNS = (
    "run", "policy", "id", "group", "contract", "role", "measure", "state", "t",
    "prompt_tokens", "cached_tokens", "new_blocks", "recompute_tokens", "waited", "wait_ms",
    "queue_ms", "prefill_ms", "ttft_ms", "done_t",
)


def fmt_t(ns: int | None) -> str:
    return "" if ns is None else f"{ns // 1_000_000_000}.{ns % 1_000_000_000:09d}"


def fmt_f(x: float | None, nd: int = 6) -> str:
    if x is None:
        return ""
    s = f"{x:.{nd}f}".rstrip("0").rstrip(".")
    return "0" if s in ("-0", "") else s


def canonical(obj) -> str:
    """Canonical JSON of a flat dict of ranking fields; floats rounded to 9 decimals
    so a value reads the same whatever arithmetic path produced it."""
    if not obj:
        return ""
    obj = {k: round(v, 9) if type(v) is float else v for k, v in obj.items()}
    return orjson.dumps(obj, option=orjson.OPT_SORT_KEYS).decode()


LEDGER_ROWS = ("all", "evictions")
COMPRESSIONS = ("none", "gzip")


def ledger_name(compression: str) -> str:
    return "ledger.csv.gz" if compression == "gzip" else "ledger.csv"


def open_text(path: Path):
    """A ledger or any CSV output for reading, gzip or plain by its name."""
    if path.name.endswith(".gz"):
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", newline="")
    return open(path, newline="", encoding="utf-8")


class LedgerWriter:
    """The engine's recorder: one CSV row per decision, streamed to disk.

    ``rows="evictions"`` keeps only eviction rows (admissions still advance ``seq``, so
    a decision has the same number in every mode); ``compression="gzip"`` writes a gzip
    stream with no name and no timestamp, so its bytes too depend only on the inputs."""

    def __init__(self, path: Path, hits: bool = False, rows: str = "all",
                 compression: str = "none") -> None:
        if compression == "gzip":
            self._raw = open(path, "wb")
            self._gz = gzip.GzipFile(filename="", mode="wb", fileobj=self._raw, mtime=0)
            self._fh = io.TextIOWrapper(self._gz, encoding="utf-8", newline="")
        else:
            self._raw = self._gz = None
            self._fh = open(path, "w", newline="", encoding="utf-8")
        self._w = csv.writer(self._fh, lineterminator="\n")
        self._w.writerow(LEDGER_COLUMNS)
        self.hits = hits and rows == "all"
        self.evictions_only = rows == "evictions"
        self.run = ""
        self.policy = ""
        self.seq = 0

    def start_run(self, run: str, policy: str) -> None:
        self.run, self.policy = run, policy
        self.seq = 0

    def _row(self, now_ns, kind, req, block="", hash_name="", owner="", decision=None,
             hits="", allocated="", new_blocks="", note=None) -> None:
        self.seq += 1
        if decision is not None:
            d = decision
            core = [d.num_candidates, d.position, d.queue, d.responsible or "",
                    fmt_f(d.responsible_p_before), fmt_f(d.responsible_p_after),
                    d.runner_up or "", fmt_f(d.runner_up_p), canonical(d.segments)]
            rank = canonical(d.rank)
        else:
            core = ["", "", "", "", "", "", "", "", ""]
            rank = canonical(note)
        self._w.writerow([self.run, self.policy, self.seq, fmt_t(now_ns), kind, req.id,
                          req.group, req.contract, block, hash_name, owner, *core, hits,
                          allocated, new_blocks, rank])

    def eviction(self, now_ns, req, decision, block, hash_name, owner) -> None:
        self._row(now_ns, "evict", req, block, hash_name, owner, decision=decision)

    def admission(self, now_ns, req, hits, allocated, new_blocks, note) -> None:
        if self.evictions_only:
            self.seq += 1
            return
        self._row(now_ns, "admit", req, hits=hits, allocated=allocated, new_blocks=new_blocks,
                  note=note)

    def hit(self, now_ns, req, pos, block, hash_name, owner) -> None:
        self._row(now_ns, "hit", req, block, hash_name, owner, note={"pos": pos})

    def close(self) -> None:
        self._fh.close()      # closes the gzip stream, which closes nothing beneath it
        if self._raw is not None:
            self._raw.close()


def write_requests(path: Path, runs: list[tuple[str, str, list[RequestOutcome]]]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh, lineterminator="\n")
        w.writerow(REQUEST_COLUMNS)
        for label, policy, outcomes in runs:
            for o in sorted(outcomes, key=lambda o: (o.t_ns, o.id)):
                w.writerow([label, policy, o.id, o.group, o.contract, o.role or "",
                            int(o.measure), o.state, fmt_t(o.t_ns), o.prompt_tokens,
                            o.cached_tokens, o.new_blocks, o.recompute_tokens, int(o.waited),
                            fmt_f(o.wait_ms, 3), fmt_f(o.queue_ms, 3), fmt_f(o.prefill_ms, 3),
                            fmt_f(o.ttft_ms, 3), fmt_t(o.release_ns)])


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
