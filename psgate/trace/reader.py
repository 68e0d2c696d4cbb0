"""Streaming reader and validator for psgate-trace v1.

The reader never holds the whole file: it parses one line at a time, checks it
against the rules of ``schemas/trace.schema.json`` plus the rules a schema
cannot state (time order, one parent per block hash, ids), and yields typed
events. The checks are written out by hand because a generic schema validator
costs more per line than the whole replay of that line; a test keeps the two
in agreement.

Every problem is an :class:`~psgate.errors.InputError` of the form
``file:line: field 'x': expected ..., found ...``.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import orjson
import rfc8785

from psgate.errors import InputError
from psgate.inputs import open_input
from psgate.resources import BUNDLED_PREFIX, bundled_trace_names, bundled_trace_path
from psgate.trace import jcs
from psgate.trace.hashes import HashTable, block_ids, first_bad_hash
from psgate.trace.model import (FORMAT_VERSION, CancelEvent, DoneEvent, RequestEvent,
                                RetentionRange, TraceHeader, TraceSummary, seconds_to_ns)

MAX_LINE_BYTES = 8 * 1024 * 1024
MAX_BLOCKS_PER_REQUEST = 1 << 20
# Times become signed 64-bit integer nanoseconds (up to about 9.22e9 s) in every engine and
# policy, and the simulator's clock runs to 2^62 ns (about 4.61e9 s) at most. A trace's times
# stop at 4e9 s (about 126 years): every event lies on that clock, with room after the last one
# for what a replay adds (the prefill queue, decoding, admission waits).
MAX_TIME_S = 4_000_000_000
MAX_JSON_INT = 2**53 - 1   # the JSON interchange range (RFC 8785 refuses integers beyond it)


@dataclass(frozen=True, slots=True)
class Limits:
    """Caps that turn a hostile or broken trace into a clear error, not a memory blow-up."""

    max_line_bytes: int = MAX_LINE_BYTES
    max_blocks_per_request: int = MAX_BLOCKS_PER_REQUEST
    max_in_flight: int = 1_000_000          # requests admitted or waiting at once (replay)

    def to_json(self) -> dict:
        return {"max_line_bytes": self.max_line_bytes,
                "max_blocks_per_request": self.max_blocks_per_request,
                "max_in_flight": self.max_in_flight}
MAX_BLOCK_SIZE = 1 << 16
_OPS = ("request", "cancel", "done")
_RANGE_KEYS = frozenset(("start", "end", "priority", "duration_s"))
_REQUEST_REQUIRED = ("id", "group", "contract", "scope", "blocks", "tail", "out")


@dataclass(frozen=True, slots=True)
class TraceSource:
    """A trace as the user named it (``display``) and where its bytes are."""

    display: str
    path: Path

    @classmethod
    def resolve(cls, given: str) -> "TraceSource":
        if given.startswith(BUNDLED_PREFIX):
            name = given[len(BUNDLED_PREFIX):]
            if name not in bundled_trace_names():
                raise InputError(f"no bundled trace named '{name}'; bundled traces: "
                                 f"{', '.join(bundled_trace_names())}", path=given)
            return cls(given, Path(str(bundled_trace_path(name))))
        require_utf8_name(given)
        p = Path(given)
        if not p.exists():
            raise InputError("no such file", path=given)
        if not p.is_file():
            raise InputError("not a regular file", path=given)
        return cls(given, p)


def require_utf8_name(name: str, option: str | None = None) -> None:
    """File names go into receipts, headers and JSON on stdout, which hold UTF-8 only; a
    name that is not UTF-8 is refused here rather than failing once a run is done."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise InputError("the file name is not valid UTF-8 (psgate records file names in "
                         "JSON); rename the file", path=option or name) from None


def check_seed(seed, option: str) -> None:
    """Seeds are written into trace headers and receipts, as JSON numbers: an integer
    beyond 2^53 - 1 has no exact JSON form (RFC 8785) and would fail only at the end."""
    if type(seed) is not int or abs(seed) > MAX_JSON_INT:
        raise InputError(f"expected an integer in -(2^53 - 1)..2^53 - 1, found {seed!r:.40}",
                         path=option)


class _DuplicateKey(Exception):
    pass


def _no_duplicates(pairs: list) -> dict:
    seen = {}
    for k, v in pairs:
        if k in seen:
            raise _DuplicateKey(k)
        seen[k] = v
    return seen


def duplicate_key(raw: bytes, obj) -> str | None:
    """The first key that appears twice in one object of the JSON text ``raw`` (parsed as
    ``obj``), else None. A parser keeps the last of two equal keys, so a line with a
    duplicate would get the canonical digest of a line without it.

    A line written as orjson writes it (psgate's own writers) cannot hide a duplicate: its
    bytes are those of ``obj`` re-serialized. Other lines are parsed again, keeping pairs.
    """
    try:
        if orjson.dumps(obj) == raw.strip():
            return None
    except TypeError:
        pass
    try:
        json.loads(raw, object_pairs_hook=_no_duplicates)
    except _DuplicateKey as dup:
        return str(dup.args[0])
    except (ValueError, RecursionError):
        return None     # orjson parsed it; what json cannot is no duplicate key
    return None


def trace_directory(given: str) -> Path | None:
    """The directory ``given`` names when it names one (an incident corpus, a capture's
    directory of rotated files), else None (a trace file or ``bundled:NAME``): replay,
    validate and trace stats read a directory as its ``*.jsonl`` traces."""
    if given.startswith(BUNDLED_PREFIX):
        return None
    p = Path(given)
    return p if p.is_dir() else None


def corpus_traces(directory: Path) -> list[Path]:
    """Every ``*.jsonl`` entry of an incident corpus, sorted by name. An entry that is not a
    readable regular file (a dangling symlink, a symlink loop, a directory, a FIFO, a file
    without read permission) is an error, never skipped: a corpus that silently loses a
    trace gates on less evidence than the operator put in it."""
    try:
        entries = sorted(p for p in directory.iterdir() if p.name.endswith(".jsonl"))
    except OSError as exc:
        raise InputError(f"cannot list the directory: {exc.strerror}",
                         path=str(directory)) from None
    for p in entries:
        what = None
        if p.is_symlink() and not p.exists():
            what = "is a dangling symlink or a symlink loop"
        elif p.is_dir():
            what = "is a directory"
        elif not p.is_file():
            what = "is not a regular file"
        if what is None:
            try:
                with open(p, "rb"):
                    pass
            except OSError as exc:
                what = f"cannot be read ({exc.strerror})"
        if what is not None:
            raise InputError(f"corpus entry {what}: every *.jsonl entry must be a readable "
                             f"trace file (fix or remove it)", path=str(p))
    if not entries:
        raise InputError("no *.jsonl traces in this directory", path=str(directory))
    return entries


def _outside_jcs(obj: dict) -> str | None:
    """The first field of ``obj`` that RFC 8785 cannot write, to name it in the error."""
    for key, value in obj.items():
        try:
            jcs.dumps(value)
        except (rfc8785.CanonicalizationError, ValueError):
            return key
    return None


def is_number(v) -> bool:
    return (type(v) is int or type(v) is float) and math.isfinite(v)


def type_name(v) -> str:
    if v is None:
        return "null"
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
            list: "an array", dict: "an object"}.get(type(v), type(v).__name__)


class HintError(ValueError):
    """A retention hint that is not valid: args (message, field)."""


def retention_seconds(v) -> int:
    """``retention_s`` (SGLang's soft retention time) checked, in nanoseconds."""
    if not is_number(v) or not 0 < v <= MAX_TIME_S:
        raise HintError(f"expected a number of seconds > 0 and <= {MAX_TIME_S:g}, found "
                        f"{v!r:.40}", "retention_s")
    return seconds_to_ns(v)


def retention_ranges(v, prompt_tokens: int) -> tuple[RetentionRange, ...]:
    """``retention`` (TensorRT-LLM's KvCacheRetentionConfig token ranges) checked: each
    inside the prompt, start < end, priority 1..100, a finite duration > 0 or null, no two
    overlapping (given in any order; returned sorted by start). Raises HintError."""
    if type(v) is not list or not v:
        raise HintError(f"expected a non-empty array of token ranges, found "
                        f"{'an empty array' if v == [] else type_name(v)}", "retention")
    out = []
    for i, r in enumerate(v):
        where = f"retention[{i}]"
        if type(r) is not dict:
            raise HintError(f"expected an object {{start, end, priority, duration_s}}, found "
                            f"{type_name(r)}", where)
        extra = sorted(set(r) - _RANGE_KEYS)
        if extra:
            raise HintError(f"unknown key '{extra[0]:.40}' (a range has start, end, priority, "
                            f"duration_s)", where)
        for key in ("start", "priority"):
            if key not in r:
                raise HintError("missing", f"{where}.{key}")
        start = r["start"]
        if type(start) is not int or not 0 <= start < prompt_tokens:
            raise HintError(f"expected an integer token offset in 0..{prompt_tokens - 1} (the "
                            f"prompt has {prompt_tokens} tokens), found {start!r:.40}",
                            f"{where}.start")
        end = r.get("end")
        if end is not None and (type(end) is not int or not start < end <= prompt_tokens):
            raise HintError(f"expected null (the end of the prompt) or an integer in "
                            f"{start + 1}..{prompt_tokens} (after start {start}, within the "
                            f"prompt's {prompt_tokens} tokens), found {end!r:.40}",
                            f"{where}.end")
        prio = r["priority"]
        if type(prio) is not int or not 1 <= prio <= 100:
            raise HintError(f"expected an integer in 1..100, found {prio!r:.40}",
                            f"{where}.priority")
        dur = r.get("duration_s")
        if dur is not None and (not is_number(dur) or not 0 < dur <= MAX_TIME_S):
            raise HintError(f"expected null (no end) or a finite number of seconds > 0 and "
                            f"<= {MAX_TIME_S:g}, found {dur!r:.40}", f"{where}.duration_s")
        out.append((start, i, RetentionRange(start, end, prio,
                                             None if dur is None else seconds_to_ns(dur))))
    out.sort()
    for (_, i, a), (_, j, b) in zip(out, out[1:]):
        if a.end is None or a.end > b.start:
            raise HintError(f"overlaps retention[{i}] (tokens {a.start}.."
                            f"{'end' if a.end is None else a.end}); ranges must not overlap",
                            f"retention[{j}].start")
    return tuple(r for _, _, r in out)


def hints_from_xargs(extra, prompt_tokens: int) -> dict:
    """The trace fields of a live request's ``psgate_retention`` / ``psgate_retention_s``
    (vLLM ``SamplingParams.extra_args``, the OpenAI server's ``vllm_xargs``, where a list of
    objects can only travel as a JSON string, so a string is parsed as JSON): ``retention``
    and ``retention_s`` as a trace writes them, only those that pass the reader's checks
    (a client's bad hint is left out, never written into a trace the reader refuses)."""
    out: dict = {}
    if not extra:
        return out
    v = extra.get("psgate_retention")
    if v is not None:
        if type(v) is str:
            try:
                v = json.loads(v)
            except ValueError:
                v = None
        try:
            retention_ranges(v, prompt_tokens)
            out["retention"] = v
        except HintError:
            pass
    v = extra.get("psgate_retention_s")
    if type(v) is str:
        try:
            v = float(v)
        except ValueError:
            v = None
    try:
        retention_seconds(v)
        out["retention_s"] = v
    except HintError:
        pass
    return out


class TraceReader:
    """One streaming pass over a trace: ``with TraceReader(src) as r: r.header; r.events()``.

    ``summary()`` is available once ``events()`` is exhausted. Pass the same
    :class:`HashTable` to later passes so block ids agree between them.

    A later pass over a trace that a full pass already checked may say so with
    ``validated`` (that pass's summary): it then skips what cannot have changed if
    the bytes have not (the canonical digest, hash syntax, chain parents, field
    checks) and only hashes the file, whose digest the caller compares with the
    validated one. Anything it cannot read is reported as the trace having changed.
    """

    def __init__(self, source: TraceSource, hashes: HashTable | None = None,
                 limits: Limits | None = None, validated: TraceSummary | None = None,
                 stream=None):
        self.source = source
        self.validated = validated
        self.limits = limits or Limits()
        self.hashes = hashes if hashes is not None else HashTable()
        self.header: TraceHeader | None = None
        self._stream = stream       # an open binary stream to read instead of the file
        self._fh = None
        self._line = 0
        self._file_sha = hashlib.sha256()
        self._canon_sha = hashlib.sha256()
        self._summary: TraceSummary | None = None

    # -- context management -------------------------------------------------
    def __enter__(self) -> "TraceReader":
        if self._stream is not None:
            self._fh = self._stream
            self.header = self._read_header()
            return self
        try:
            self._fh = open_input(self.source.path, "trace file")
        except OSError as exc:
            raise InputError(f"cannot open: {exc.strerror}", path=self.source.display) from None
        self.header = self._read_header()
        return self

    def __exit__(self, *exc) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    # -- helpers --------------------------------------------------------------
    def _err(self, message: str, field: str | None = None) -> InputError:
        return InputError(message, path=self.source.display, line=self._line, field=field)

    def _next_object(self):
        """The next line as a parsed JSON object, or None at end of file."""
        cap = self.limits.max_line_bytes
        raw = self._fh.readline(cap + 1)
        if not raw:
            return None
        self._line += 1
        if len(raw) > cap and not raw.endswith(b"\n"):
            raise self._err(f"line longer than {cap} bytes (the cap; raise it with "
                            f"--max-line-bytes)")
        self._file_sha.update(raw)
        if not raw.strip():
            raise self._err("empty line: expected one JSON object per line")
        try:
            obj = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            if b"\n" not in raw:
                raise self._err(f"truncated or invalid JSON on the last line ({exc})") from None
            raise self._err(f"invalid JSON ({exc})") from None
        if type(obj) is not dict:
            raise self._err(f"expected a JSON object, found {type_name(obj)}")
        dup = duplicate_key(raw, obj)
        if dup is not None:
            raise self._err("duplicate key in one JSON object (a parser would silently keep "
                            "only the last)", dup)
        try:
            self._canon_sha.update(jcs.dumps(obj))
        except (rfc8785.CanonicalizationError, ValueError) as exc:
            raise self._err(f"value outside the JSON interchange range ({exc})",
                            _outside_jcs(obj)) from None
        self._canon_sha.update(b"\n")
        return obj

    def _read_header(self) -> TraceHeader:
        obj = self._next_object()
        if obj is None:
            raise InputError("empty file: expected a psgate-trace header on line 1",
                             path=self.source.display)
        if "psgate_trace" not in obj:
            raise self._err("missing: the first line must be a header with 'psgate_trace' "
                            "and 'block_size'", "psgate_trace")
        ver = obj["psgate_trace"]
        if type(ver) is not int:
            raise self._err(f"expected the integer {FORMAT_VERSION}, found {type_name(ver)}",
                            "psgate_trace")
        if ver != FORMAT_VERSION:
            if ver > FORMAT_VERSION:
                raise self._err(f"format version {ver} is newer than this psgate reads "
                                f"({FORMAT_VERSION})", "psgate_trace")
            raise self._err(f"expected {FORMAT_VERSION}, found {ver}", "psgate_trace")
        bs = obj.get("block_size")
        if type(bs) is not int or not 1 <= bs <= MAX_BLOCK_SIZE:
            found = "nothing" if "block_size" not in obj else repr(bs)
            raise self._err(f"expected an integer in 1..{MAX_BLOCK_SIZE}, found {found}",
                            "block_size")
        for key in ("hashing", "source", "kv_groups"):
            if key in obj and type(obj[key]) is not str:
                raise self._err(f"expected a string, found {type_name(obj[key])}", key)
        groups = obj.get("groups")
        if groups is not None:
            if type(groups) is not dict:
                raise self._err(f"expected an object, found {type_name(groups)}", "groups")
            for name, spec in groups.items():
                if type(spec) is not dict:
                    raise self._err(f"expected an object, found {type_name(spec)}",
                                    f"groups.{name}")
                contracts = spec.get("contracts")
                if contracts is not None and (type(contracts) is not list or not all(
                        type(c) is str for c in contracts)):
                    raise self._err("expected an array of contract names",
                                    f"groups.{name}.contracts")
        partial = obj.get("partial", False)
        if type(partial) is not bool:
            raise self._err(f"expected a boolean, found {type_name(partial)}", "partial")
        return TraceHeader(block_size=bs, hashing=obj.get("hashing"), source=obj.get("source"),
                           groups=groups, partial=partial, raw=obj,
                           kv_groups=obj.get("kv_groups"))

    # -- the event stream ------------------------------------------------------
    def events(self) -> Iterator[RequestEvent | CancelEvent | DoneEvent]:
        if self.validated is not None:
            return self._validated_events()
        return self._checked_events()

    def _validated_events(self) -> Iterator[RequestEvent | CancelEvent | DoneEvent]:
        """The events of a trace already validated by a full pass (see the class)."""
        fh, sha, ids, names = self._fh, self._file_sha, self.hashes.ids, self.hashes.names
        cursor = 0          # block_ids': the next hash not met yet on this read, in names
        bs = self.header.block_size
        partial = self.header.partial
        known: set[str] = set()      # request ids, kept only where a partial trace needs them
        answers = self.validated.answers     # done lines' answers, known before their requests
        loads = orjson.loads
        try:
            while True:
                raw = fh.readline()
                if not raw:
                    break
                self._line += 1
                sha.update(raw)
                obj = loads(raw)
                t = obj["t"]
                op = obj["op"]
                rid = obj["id"]
                if op == "request":
                    blocks = obj["blocks"]
                    tail = obj["tail"]
                    t_ns = seconds_to_ns(t)
                    bids, cursor = block_ids(ids, names, blocks, cursor)
                    ev = RequestEvent(line=self._line, t_ns=t_ns, id=rid, group=obj["group"],
                                      contract=obj["contract"], scope=obj["scope"],
                                      blocks=bids, tail=tail, out=obj["out"],
                                      prompt_tokens=len(blocks) * bs + tail)
                    num_fields = len(obj)     # 9 required; often done_t, seldom others
                    if num_fields == 10 and "done_t" in obj:
                        ev.done_ns = seconds_to_ns(obj["done_t"])
                    elif num_fields > 9:
                        self._optional_fields(obj, ev, t, t_ns)
                        if "answer" in obj:
                            ev.answer = [ids[h] for h in obj["answer"]]
                    if answers:
                        ev.answer = answers.get(rid, ev.answer)
                    if partial:
                        known.add(rid)
                    yield ev
                elif rid not in known and partial:
                    continue
                elif op == "cancel":
                    yield CancelEvent(line=self._line, t_ns=seconds_to_ns(t), id=rid)
                else:
                    yield DoneEvent(line=self._line, t_ns=seconds_to_ns(t), id=rid)
        except (KeyError, TypeError, ValueError, AttributeError, InputError):
            raise self._err("the trace changed while it was being replayed (this line no "
                            "longer reads as it did when the trace was validated)") from None
        v = self.validated
        self._summary = TraceSummary(
            path=v.path, sha256=sha.hexdigest(), canonical_sha256=v.canonical_sha256,
            num_lines=self._line, num_requests=v.num_requests, num_cancels=v.num_cancels,
            num_dones=v.num_dones, num_distinct_blocks=v.num_distinct_blocks,
            num_skipped_unknown=v.num_skipped_unknown, done_ids=v.done_ids, groups=v.groups,
            answers=v.answers)

    def _checked_events(self) -> Iterator[RequestEvent | CancelEvent | DoneEvent]:
        header = self.header
        bs = header.block_size
        groups = header.groups
        partial = header.partial
        last_t = -1
        # id -> (carries done_t (a done event would then conflict), the id its answer hangs
        # from, the most full output blocks it can have, carries an answer)
        requests: dict[str, tuple[bool, int, int, bool]] = {}
        done_ids: set[str] = set()
        answers: dict[str, list[int]] = {}
        group_order: dict[str, None] = dict.fromkeys(groups or ())
        n_req = n_cancel = n_done = n_skipped = 0
        err = self._err
        intern = self.hashes.intern_chain

        while True:
            obj = self._next_object()
            if obj is None:
                break
            t = obj.get("t")
            if t is None and "t" not in obj:
                raise err("missing", "t")
            if not is_number(t):
                raise err(f"expected a finite number of seconds, found {type_name(t)}", "t")
            if t < 0 or t > MAX_TIME_S:
                raise err(f"expected a time in 0..{MAX_TIME_S:g} seconds, found {t}", "t")
            t_ns = seconds_to_ns(t)
            if t_ns < last_t:
                raise err(f"time goes backwards: {t} is earlier than the previous event", "t")
            last_t = t_ns
            op = obj.get("op")
            if op not in _OPS:
                found = "nothing" if "op" not in obj else repr(op)
                raise err(f"expected one of {', '.join(_OPS)}, found {found}", "op")
            rid = obj.get("id")
            if type(rid) is not str or not rid:
                found = "nothing" if "id" not in obj else type_name(rid)
                raise err(f"expected a non-empty string, found {found}", "id")

            if op == "request":
                for key in _REQUEST_REQUIRED:
                    if key not in obj:
                        raise err("missing", key)
                if rid in requests:
                    raise err(f"duplicate request id '{rid}'", "id")
                for key in ("group", "contract", "scope"):
                    v = obj[key]
                    if type(v) is not str or (key != "scope" and not v):
                        raise err(f"expected a{' non-empty' if key != 'scope' else ''} string, "
                                  f"found {type_name(v)}", key)
                group = obj["group"]
                contract = obj["contract"]
                if groups is not None:
                    spec = groups.get(group)
                    if spec is None:
                        raise err(f"group '{group}' is not declared in the header's groups",
                                  "group")
                    allowed = spec.get("contracts")
                    if allowed is not None and contract not in allowed:
                        raise err(f"contract '{contract}' is not declared for group '{group}'",
                                  "contract")
                blocks = obj["blocks"]
                if type(blocks) is not list:
                    raise err(f"expected an array of block hashes, found {type_name(blocks)}",
                              "blocks")
                if len(blocks) > self.limits.max_blocks_per_request:
                    raise err(f"{len(blocks)} blocks in one request, more than the cap of "
                              f"{self.limits.max_blocks_per_request} (--max-blocks-per-request)",
                              "blocks")
                bad = first_bad_hash(blocks)
                if bad >= 0:
                    raise err(f"element {bad}: expected a lowercase hex string of 1-128 "
                              f"characters, found {blocks[bad]!r:.40}", "blocks")
                tail = obj["tail"]
                if type(tail) is not int or not 0 <= tail < bs:
                    raise err(f"expected an integer in 0..{bs - 1} (block_size {bs}), found "
                              f"{tail!r:.40}", "tail")
                out = obj["out"]
                if type(out) is not int or not 0 <= out <= MAX_JSON_INT:
                    raise err(f"expected an integer >= 0 and <= 2^53 - 1, found {out!r:.40}",
                              "out")
                prompt_tokens = len(blocks) * bs + tail
                if prompt_tokens == 0:
                    raise err("empty prompt: no blocks and tail 0", "blocks")
                ev = RequestEvent(line=self._line, t_ns=t_ns, id=rid, group=group,
                                  contract=contract, scope=obj["scope"], blocks=[],
                                  tail=tail, out=out, prompt_tokens=prompt_tokens)
                self._optional_fields(obj, ev, t, t_ns)
                ev.blocks = intern(blocks, err)
                last = ev.blocks[-1] if ev.blocks else HashTable.ROOT
                max_answer = (prompt_tokens + out) // bs - len(blocks)
                if "answer" in obj:
                    ev.answer = self._answer(obj["answer"], last, max_answer)
                requests[rid] = (ev.done_ns is not None, last, max_answer, "answer" in obj)
                group_order.setdefault(group)
                n_req += 1
                yield ev
            else:
                known = requests.get(rid)
                if known is None:
                    if partial:
                        n_skipped += 1
                        continue
                    raise err(f"{op} of unknown request id '{rid}' (no earlier request line "
                              f"has this id)", "id")
                if op == "cancel":
                    n_cancel += 1
                    yield CancelEvent(line=self._line, t_ns=t_ns, id=rid)
                else:
                    has_done_t, last, max_answer, has_answer = known
                    if has_done_t:
                        raise err(f"request '{rid}' already carries done_t; a done event "
                                  f"would give it two completions", "id")
                    if rid in done_ids:
                        raise err(f"duplicate done for request '{rid}'", "id")
                    done_ids.add(rid)
                    if "answer" in obj:
                        if has_answer:
                            raise err(f"request '{rid}' already carries its answer on its "
                                      f"request line", "answer")
                        answers[rid] = self._answer(obj["answer"], last, max_answer)
                    n_done += 1
                    yield DoneEvent(line=self._line, t_ns=t_ns, id=rid)

        self._summary = TraceSummary(
            path=self.source.display, sha256=self._file_sha.hexdigest(),
            canonical_sha256=self._canon_sha.hexdigest(), num_lines=self._line,
            num_requests=n_req, num_cancels=n_cancel, num_dones=n_done,
            num_distinct_blocks=len(self.hashes), num_skipped_unknown=n_skipped,
            done_ids=frozenset(done_ids), groups=tuple(group_order), answers=answers)

    def _answer(self, v, parent: int, max_blocks: int) -> list[int]:
        """``answer`` checked and interned: hashes of full output blocks chained on from the
        request's last prompt block, no more than its prompt and ``out`` tokens can fill."""
        err = self._err
        if type(v) is not list:
            raise err(f"expected an array of block hashes, found {type_name(v)}", "answer")
        if len(v) > self.limits.max_blocks_per_request:
            raise err(f"{len(v)} answer blocks, more than the cap of "
                      f"{self.limits.max_blocks_per_request} (--max-blocks-per-request)",
                      "answer")
        bad = first_bad_hash(v)
        if bad >= 0:
            raise err(f"element {bad}: expected a lowercase hex string of 1-128 characters, "
                      f"found {v[bad]!r:.40}", "answer")
        if len(v) > max_blocks:
            raise err(f"{len(v)} answer blocks, more than the request's prompt and out "
                      f"tokens fill beyond its prompt blocks ({max_blocks})", "answer")
        return self.hashes.intern_chain(v, err, parent, "answer")

    def _optional_fields(self, obj: dict, ev: RequestEvent, t, t_ns: int) -> None:
        err = self._err
        for key in ("prefix", "role"):
            if key in obj:
                v = obj[key]
                if type(v) is not str or not v:
                    raise err(f"expected a non-empty string, found {type_name(v)}", key)
                setattr(ev, key, v)
        if "measure" in obj:
            if type(obj["measure"]) is not bool:
                raise err(f"expected a boolean, found {type_name(obj['measure'])}", "measure")
            ev.measure = obj["measure"]
        if "priority" in obj:
            if type(obj["priority"]) is not int:
                raise err(f"expected an integer, found {type_name(obj['priority'])}",
                          "priority")
            if abs(obj["priority"]) > MAX_JSON_INT:
                raise err(f"expected an integer in -(2^53 - 1)..2^53 - 1, found "
                          f"{obj['priority']}", "priority")
            ev.priority = obj["priority"]
        if "priority_until" in obj:
            v = obj["priority_until"]
            if not is_number(v) or v < 0 or v > MAX_TIME_S:
                raise err(f"expected a time in 0..{MAX_TIME_S:g} seconds, found {v!r:.40}",
                          "priority_until")
            ev.priority_until_ns = seconds_to_ns(v)
        if "retention" in obj:
            ev.retention = self._retention(obj["retention"], ev.prompt_tokens)
        if "retention_s" in obj:
            try:
                ev.retention_ns = retention_seconds(obj["retention_s"])
            except HintError as exc:
                raise err(*exc.args) from None
        if "done_t" in obj:
            v = obj["done_t"]
            if not is_number(v) or v < t:
                raise err(f"expected a time >= t ({t}), found {v!r:.40}", "done_t")
            if v > MAX_TIME_S:
                raise err(f"expected a time in 0..{MAX_TIME_S:g} seconds, found {v!r:.40}",
                          "done_t")
            ev.done_ns = seconds_to_ns(v)
        if "prefill_ms" in obj:
            v = obj["prefill_ms"]
            if not is_number(v) or v < 0 or v > MAX_TIME_S * 1000:
                raise err(f"expected a number of milliseconds in 0..{MAX_TIME_S * 1000:g}, "
                          f"found {v!r:.40}", "prefill_ms")
            ev.prefill_ms = float(v)

    def _retention(self, v, prompt_tokens: int) -> tuple[RetentionRange, ...]:
        try:
            return retention_ranges(v, prompt_tokens)
        except HintError as exc:
            raise self._err(*exc.args) from None

    def summary(self) -> TraceSummary:
        if self._summary is None:
            raise RuntimeError("summary() before the trace was read to the end")
        return self._summary


def validate_trace(given: str, hashes: HashTable | None = None, limits: Limits | None = None
                   ) -> tuple[TraceHeader, TraceSummary]:
    """Read a whole trace once, checking every line; the first problem raises InputError."""
    src = TraceSource.resolve(given)
    with TraceReader(src, hashes, limits) as reader:
        for _ in reader.events():
            pass
        return reader.header, reader.summary()


class _Feed:
    """Lines about to be written, read back as the bytes the writer will write them as
    (``psgate.trace.writer``), so that what is checked is exactly what lands in the file."""

    def __init__(self, lines, origin: str, pulled: list):
        self._it = iter(lines)
        self._origin = origin
        self._n = 0
        self.pulled = pulled

    def readline(self, size: int = -1) -> bytes:
        line = next(self._it, None)
        if line is None:
            return b""
        self._n += 1
        try:
            data = orjson.dumps(line) + b"\n"
        except TypeError as exc:
            raise InputError(f"cannot be written as JSON ({exc})", path=self._origin,
                             line=self._n) from None
        self.pulled.append(line)
        return data[:size] if 0 <= size < len(data) else data

    def close(self) -> None:
        pass


def checked_lines(lines, origin: str, limits: Limits | None = None) -> Iterator[dict]:
    """``lines`` (a trace's dicts, header first), each passed on only once the reader has
    accepted it: a writer that streams through this never writes a trace ``psgate validate``
    refuses. ``origin`` names the output in errors (``origin:line: field ...``)."""
    pulled: list[dict] = []
    feed = _Feed(lines, origin, pulled)
    with TraceReader(TraceSource(origin, Path(".")), limits=limits, stream=feed) as reader:
        yield from pulled
        pulled.clear()
        for _ in reader.events():
            yield from pulled
            pulled.clear()
        yield from pulled


def check_lines(lines: list[dict], origin: str) -> list[dict]:
    """``lines`` unchanged once every one of them passed the reader's checks."""
    for _ in checked_lines(lines, origin):
        pass
    return lines
