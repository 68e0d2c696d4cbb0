"""Capture: a redacted psgate-trace v1 of live vLLM traffic, written off the hot path.

The vLLM plugin (``PSGATE_CAPTURE=DIR``) feeds a :class:`CaptureWriter` from the
scheduler: arrivals, completions, cancellations, and per request the cached tokens
and first-token time the scheduler saw. The scheduler thread only puts a small
tuple on a bounded queue; when the queue is full the event is dropped and counted,
never waited for, and wakes nothing. A writer thread, which drains the queue every
``POLL_S`` (50 ms; sooner if ``flush_s`` is shorter), does the hashing and the writing:

    request   keyed chained block hashes of the prompt (psgate.trace.hashing), bound
              to the scope (model, adapter, cache_salt) as ``psgate trace redact``
              binds it; id, group and scope pseudonymized with the key; ``out`` is
              the request's max_tokens (what it reserved)
    done      with ``cached_tokens_observed``, ``ttft_ms_observed`` (first token as
              the scheduler saw it), ``out_observed``, ``preemptions_observed`` and
              ``answer``: the keyed hashes of the full blocks its output completed,
              chained on from its prompt's as vLLM chains them, so a later turn that
              re-sends the answer is replayed as hitting what the server cached
              while decoding it
    cancel    an aborted request

A request's retention hints, ``SamplingParams.extra_args`` ``psgate_retention`` (a list of
``{start, end, priority, duration_s}`` token ranges, or that list as a JSON string, as
the OpenAI server's ``vllm_xargs`` can only carry it) and ``psgate_retention_s`` (seconds),
are written as the trace's ``retention`` and ``retention_s``: not identifying, kept as given.
A hint the trace reader would refuse is left out (counted in the summary's
``hints_dropped``), so a capture file always validates.

Token ids and text never reach a file. A request's ``id`` is a keyed pseudonym of
the id its client sent or was given (vLLM's external request id), so whoever holds the
key can find a client's request; a repeat within one file gets a ``.N`` suffix. Files
rotate by size or age (``capture-000001.jsonl``, ...); each is a complete trace marked
``partial`` whose header counts the events dropped since the previous file; the file
being written carries a ``.part`` suffix until it is complete. At shutdown
``capture-summary.json`` totals files, events and drops. Times are seconds since the
capture's zero (one clock across files, so the files concatenate); each header's
``capture.t0_unix`` is the wall-clock time of that zero.

The writer thread keeps whole lines in memory and writes them out every ``flush_s``
seconds or ``flush_events`` events, whichever comes first, one write per batch: a
process killed outright (SIGKILL) loses at most that much of what the writer had
taken from the queue, plus what was still queued, and leaves a ``.part`` file of
whole lines. An orderly shutdown (:meth:`CaptureWriter.close`) loses nothing.
"""

from __future__ import annotations

import atexit
import json
import os
from collections import deque
import threading
import time
from pathlib import Path

import orjson

from psgate.trace.hashing import HASHING_NAME, chain_hashes
from psgate.trace.reader import hints_from_xargs
from psgate.trace.redact import key_fingerprint, pseudonym, scope_root
from psgate.trace.writer import header_line

SCOPE_FIELDS = ("model", "tokenizer", "adapter", "cache_salt")
POLL_S = 0.05       # how often the writer thread looks at the queue


class CaptureWriter:
    """Bounded queue in, rotating trace files out; see the module docstring."""

    def __init__(self, directory: str | Path, key: bytes, block_size: int, *,
                 source: str = "psgate capture", max_bytes: int = 64 << 20,
                 max_seconds: float = 3600.0, queue_size: int = 65536,
                 clock=time.monotonic, start: bool = True, t0: float | None = None,
                 t0_unix: float | None = None, flush_s: float = 1.0,
                 flush_events: int = 1024, kv_groups: str | None = None) -> None:
        if not key or len(key) < 16:
            raise ValueError("capture needs a hash key of at least 16 bytes "
                             "($PSGATE_CAPTURE_KEY_FILE or $PSGATE_HASH_KEY, hex)")
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.key = key[:64]
        self.bs = block_size
        self.source = source
        # a hybrid model's KV-cache groups, in every file's header (None: one full group)
        self.kv_groups = kv_groups
        self.max_bytes = max_bytes
        self.max_seconds = max_seconds
        self.clock = clock
        self.t0 = clock() if t0 is None else t0
        self.t0_unix = time.time() - (clock() - self.t0) if t0_unix is None else t0_unix
        self.flush_s = flush_s
        self.flush_events = flush_events
        self._buf: list[bytes] = []         # whole lines not yet written
        self._buf_since = 0.0               # time.monotonic() of the oldest of them
        self._used: set[str] = set()        # ids in the current file
        # A deque the writer drains every POLL_S: an append is one atomic C call, and no
        # event wakes the writer thread (a wake-up per event makes the two threads trade
        # the GIL on every request); the bound is kept by its length, read before a put.
        self.q: deque = deque()
        self.queue_size = queue_size
        self._poll_s = min(POLL_S, flush_s)
        self._stop = threading.Event()
        self.num_dropped = 0            # all drops (scheduler thread)
        self._dropped_reported = 0      # drops already counted in some header
        self.num_written = 0
        self.num_requests = 0
        self.num_hints_dropped = 0      # retention hints that failed the reader's checks
        self.files: list[str] = []
        self._ids: dict[str, tuple] = {}      # id -> (pseudonym, answer's parent, tail)
        self._roots: dict[tuple, bytes] = {}
        self._names: dict[tuple, tuple[str, str]] = {}   # (group, scope) -> pseudonyms
        self._fh = None
        self._part: Path | None = None
        self._file_bytes = 0
        self._file_t0 = 0.0
        self._last_t = 0.0
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="psgate-capture", daemon=True)
        if start:
            self.start()
        atexit.register(self.close)

    def start(self) -> None:
        """Start the writer thread (the constructor does, unless told not to)."""
        self._thread.start()

    # -- the scheduler side: never blocks ------------------------------------------------
    def now(self) -> float:
        return self.clock() - self.t0

    def submit(self, event: tuple) -> None:
        if len(self.q) >= self.queue_size:
            self.num_dropped += 1
        else:
            self.q.append(event)

    def request(self, rid: str, group: str, contract: str, scope: tuple[str, ...],
                token_ids, max_tokens: int, client_id: str | None = None,
                extra_args: dict | None = None) -> None:
        """``rid`` names the request in later done/cancel calls; ``client_id`` (default
        ``rid``) is what its pseudonym is made of. ``extra_args`` (the request's
        ``SamplingParams.extra_args``) may carry retention hints, ``psgate_retention`` and
        ``psgate_retention_s``, written as the trace's ``retention`` / ``retention_s``
        (checked on the writer thread; an invalid hint is left out and counted)."""
        hints = None
        if extra_args and ("psgate_retention" in extra_args
                           or "psgate_retention_s" in extra_args):
            hints = {k: extra_args[k] for k in ("psgate_retention", "psgate_retention_s")
                     if k in extra_args}
        self.submit(("request", self.now(), rid, group, contract, scope, token_ids,
                     max_tokens, client_id, hints))

    def done(self, rid: str, cached_tokens: int | None, ttft_ms: float | None,
             out: int, preemptions: int, output_token_ids=()) -> None:
        """``output_token_ids``: the tokens it generated (a sequence the scheduler no
        longer changes; hashed on the writer thread into the line's ``answer``)."""
        self.submit(("done", self.now(), rid, cached_tokens, ttft_ms, out, preemptions,
                     output_token_ids))

    def cancel(self, rid: str) -> None:
        self.submit(("cancel", self.now(), rid))

    # -- the writer thread ------------------------------------------------------------------
    def _run(self) -> None:
        q, stop = self.q, self._stop
        while True:
            stopping = stop.wait(self._poll_s)
            while q:
                line = self._line(q.popleft())
                if line is not None:
                    self._write(line)
                if self._buf and (len(self._buf) >= self.flush_events
                                  or time.monotonic() - self._buf_since >= self.flush_s):
                    self._flush()
            if stopping:
                return
            if self._buf and time.monotonic() - self._buf_since >= self.flush_s:
                self._flush()

    def _line(self, ev: tuple) -> dict | None:
        kind, t = ev[0], max(self._last_t, round(ev[1], 6))
        self._last_t = t
        if kind == "request":
            _, _, rid, group, contract, scope, toks, max_tokens, client, hints = ev
            root = self._roots.get(scope)
            if root is None:
                root = self._roots[scope] = scope_root(scope, self.key)
            names = self._names.get((group, scope))
            if names is None:
                names = self._names[(group, scope)] = (
                    pseudonym("g", group, self.key),
                    pseudonym("s", "\x00".join(scope), self.key))
            new_id = base = pseudonym("r", rid if client is None else client, self.key)
            n = 1
            while new_id in self._used:
                n += 1
                new_id = f"{base}.{n}"
            self._used.add(new_id)
            self.num_requests += 1
            toks = list(toks)
            blocks = chain_hashes(toks, self.bs, self.key, parent=root)
            tail = len(toks) % self.bs
            # what its answer's hashes go on from: the last full prompt block, the tail
            self._ids[rid] = (new_id, bytes.fromhex(blocks[-1]) if blocks else root,
                              toks[len(toks) - tail:] if tail else [])
            line = {"t": t, "op": "request", "id": new_id,
                    "group": names[0], "contract": contract, "scope": names[1],
                    "blocks": blocks, "tail": tail, "out": int(max_tokens or 0)}
            if hints:
                kept = hints_from_xargs(hints, len(toks))
                self.num_hints_dropped += len(hints) - len(kept)
                line.update(kept)
            return line
        known = self._ids.pop(ev[2], None)
        if known is None:           # its request line was dropped: nothing to refer to
            return None
        new_id, parent, tail = known
        if kind == "cancel":
            return {"t": t, "op": "cancel", "id": new_id}
        _, _, _, cached, ttft_ms, out, preemptions, out_toks = ev
        line = {"t": t, "op": "done", "id": new_id, "out_observed": out,
                "preemptions_observed": preemptions}
        answer = chain_hashes(tail + list(out_toks), self.bs, self.key, parent=parent)
        if answer:
            line["answer"] = answer
        if cached is not None:
            line["cached_tokens_observed"] = cached
        if ttft_ms is not None:
            line["ttft_ms_observed"] = round(ttft_ms, 3)
        return line

    def _write(self, line: dict) -> None:
        t = line["t"]
        if self._fh is not None and (self._file_bytes >= self.max_bytes
                                     or t - self._file_t0 >= self.max_seconds):
            self._finish_file()
        if self._fh is None:
            self._open_file(t)
            if line["op"] == "request":         # its id was checked against the last file
                self._used.add(line["id"])
        self._append(orjson.dumps(line) + b"\n")
        self.num_written += 1

    def _append(self, data: bytes) -> None:
        if not self._buf:
            self._buf_since = time.monotonic()
        self._buf.append(data)
        self._file_bytes += len(data)

    def _flush(self) -> None:
        """Write the buffered lines with one write call (whole lines reach the file)."""
        if self._buf and self._fh is not None:
            data = memoryview(b"".join(self._buf))
            while data:
                data = data[self._fh.write(data):]
        self._buf.clear()

    def _open_file(self, t: float) -> None:
        index = len(self.files) + 1
        self._part = self.dir / f"capture-{index:06d}.jsonl.part"
        dropped = self.num_dropped
        extra = {"kv_groups": self.kv_groups} if self.kv_groups else {}
        header = header_line(self.bs, hashing=HASHING_NAME, source=self.source, **extra,
                             partial=True,
                             redaction={"key_fingerprint": key_fingerprint(self.key),
                                        "scope_binds": list(SCOPE_FIELDS),
                                        "pseudonymized": ["id", "group", "scope"]},
                             capture={"file": index, "t_start": t,
                                      "t0_unix": round(self.t0_unix, 6),
                                      "dropped_before": dropped - self._dropped_reported,
                                      "dropped_total": dropped})
        self._dropped_reported = dropped
        self._fh = open(self._part, "wb", buffering=0)
        self._used.clear()
        self._file_bytes = 0
        self._append(orjson.dumps(header) + b"\n")
        self._flush()
        self._file_t0 = t

    def _finish_file(self) -> None:
        self._flush()
        self._fh.close()
        final = self._part.with_suffix("")          # drop ".part"
        os.replace(self._part, final)
        self.files.append(final.name)
        self._fh = self._part = None

    def close(self) -> dict:
        """Drain the queue, complete the current file and write the summary (idempotent)."""
        if self._closed:
            return self.summary()
        self._closed = True
        if not self._thread.is_alive() and self._thread.ident is None:
            self.start()
        self._stop.set()
        self._thread.join()
        if self._fh is not None:
            self._finish_file()
        summary = self.summary()
        tmp = self.dir / "capture-summary.json.part"
        tmp.write_text(json.dumps(summary, indent=1) + "\n")
        os.replace(tmp, self.dir / "capture-summary.json")
        return summary

    def summary(self) -> dict:
        return {"psgate_capture": 1, "files": list(self.files), "requests": self.num_requests,
                "events_written": self.num_written, "events_dropped": self.num_dropped,
                "hints_dropped": self.num_hints_dropped,
                "dropped_after_last_header": self.num_dropped - self._dropped_reported,
                "block_size": self.bs, "key_fingerprint": key_fingerprint(self.key),
                "t0_unix": round(self.t0_unix, 6)}
