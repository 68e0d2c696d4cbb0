"""Importers: public KV prefix-cache request traces -> psgate-trace v1 lines.

    lines = import_trace("mooncake", "conversation_trace.jsonl", group_by="hash-mod:4")
    write_trace(Path("mc.jsonl"), lines)

``import_trace(fmt, src, **options)`` returns the trace's lines, the header dict
first and then one ``request`` event per source request in non-decreasing ``t``
(a stable sort: ties keep source order). ``FORMATS`` names each format with its
options and their defaults (``psgate trace import`` lists them).

Formats
-------
``mooncake``  JSON Lines (kvcache-ai/Mooncake FAST25-release traces): ``timestamp``
    (ms, relative), ``input_length``, ``output_length``, ``hash_ids`` (prefix-
    consistent ids of 512-token blocks, ``len == ceil(input_length / 512)``: when
    the input is not a multiple of 512 the last id covers a partial block).
    ``t = timestamp / 1000``. Request ids ``mc-<line>``; scope ``mooncake``.
``weka``  a directory of session files, or one file (callanjfox/kv-cache-tester
    traces/): one JSON object per file with ``id``, ``block_size`` (64),
    ``hash_id_scope`` ("local": ids are per file) and ``requests[]`` (``t`` in s,
    ``type``, ``model``, ``in``, ``out``, ``hash_ids`` of full blocks only,
    ``len == floor(in / 64)``). Sub-agent conversations are nested: a request
    with ``type: "subagent"`` carries no prompt of its own but its own
    ``requests[]`` (plus ``agent_id``, ``subagent_type``, ``duration_ms``,
    ``models``, ...) whose ``t`` are relative to the sub-agent's ``t``. They are
    flattened (recursively) with absolute time = file offset + sub-agent ``t`` +
    nested ``t``; their ids are ``<file>-<i>.<j>``, top-level ones ``<file>-<i>``
    (``<file>`` = the file name without ``.json``). Files are taken in file-name
    order; file k starts at offset ``k * stagger_s`` (default 0: every session
    starts at t = 0), keeping its relative times. Each distinct ``model`` is its
    own ``scope``.
``bailian``  JSON Lines (Alibaba Qwen/Bailian usage traces): ``chat_id``,
    ``parent_chat_id`` (-1, null or missing for a root), ``timestamp`` (s),
    ``input_length``, ``output_length``, ``type``, ``turn``, ``hash_ids`` (16-token
    blocks; ``len`` may be ``floor`` or ``ceil`` of ``input_length / 16``: with
    ``ceil`` the last id covers a partial block). ``t = timestamp - (earliest
    timestamp)``. Request ids ``bl-<line>``; scope ``bailian``.

Hashing
-------
Source ids become chained 128-bit hashes: block j (0-based, of the
``native / block_size`` sub-blocks) of source id X in id space S after parent
hash P is ``BLAKE2b-128(P || "S\\0X\\0j\\0b")``, b the output block size (P = 16 zero
bytes for a first block).
So equal prefixes of ids give equal hashes, a hash determines its parent, and
equal ids in different spaces never meet. Weka ids are namespaced per file (and
per model, since KV is never shared across models); Mooncake and Bailian ids
share one space per trace. A partial last block (Mooncake, ``ceil`` Bailian)
yields its full sub-blocks (the first ``r // block_size`` sub-blocks of its id,
``r`` = tokens it covers) and a ``tail``. Prompt tokens that no id covers (weka's
and ``floor`` Bailian's trailing ``in mod native`` tokens) are the ``tail`` at
the native block size; split finer, their full sub-blocks get hashes unique to
the request (``"S\\0~<request id>\\0j\\0b"``): content nobody else is known to share.

Every source id must always follow the same parent id within its space (the
traces are prefix-consistent); an id seen after two different parents is an
:class:`~psgate.errors.InputError` naming file:line (weka: file and request)
and is never imported.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import orjson

from psgate.errors import InputError
from psgate.trace.model import seconds_to_ns
from psgate.trace.reader import (MAX_BLOCK_SIZE, MAX_JSON_INT, MAX_TIME_S, check_lines,
                                 require_utf8_name)
from psgate.trace.writer import header_line

IMPORTER_VERSION = "psgate-import-v1"
HASHING = "psgate-import-blake2b-128"
CONTRACT_CYCLE = ("critical", "standard", "best-effort")
_ZERO = bytes(16)
MAX_OUTPUT_BYTES = 256 * 1024 * 1024
HASH_OUTPUT_BYTES = 35      # one block hash in a trace line: 32 hex digits, 2 quotes, a comma


class _OutputCap:
    """Stops an import whose block hashes alone would make a trace over ``max_output_bytes``.
    Re-blocking multiplies blocks (``block_size=1`` turns each 512-token Mooncake id into
    512 hashes) and the whole trace is built in memory before it is written, so the count
    is checked request by request, long before the memory or the file is spent."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.blocks = 0

    def add(self, n: int) -> None:
        self.blocks += n
        if self.blocks * HASH_OUTPUT_BYTES > self.limit:
            raise InputError(f"the imported trace would be over {self.limit} bytes (already "
                             f"{self.blocks} block hashes of {HASH_OUTPUT_BYTES} bytes each), "
                             f"the cap; choose a larger --block-size, fewer requests "
                             f"(--option limit=N) or raise the cap with --option "
                             f"max_output_bytes=N", path="--option max_output_bytes")


# --------------------------------------------------------------------------------------
# The format table
# --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Option:
    default: object
    kind: type
    help: str


@dataclass(frozen=True)
class ImportFormat:
    name: str
    summary: str
    source: str                      # what SRC is
    options: dict[str, Option]

    @property
    def defaults(self) -> dict:
        return {k: o.default for k, o in self.options.items()}


def _common(group_by: str, group_help: str) -> dict[str, Option]:
    return {
        "block_size": Option(None, int, "tokens per output block; must divide the source's "
                                        "native block size (default: the native size)"),
        "group_by": Option(group_by, str, group_help),
        "contract": Option(None, str, "contract of every request (default 'standard'); "
                                      "not with contracts_cycle"),
        "contracts_cycle": Option(False, bool, "contracts critical, standard, best-effort in "
                                               "turn by group (order of first appearance)"),
        "limit": Option(None, int, "keep only the first N requests in time order"),
        "max_output_bytes": Option(MAX_OUTPUT_BYTES, int, "stop (exit 2) once the block "
                                   "hashes made so far would take more than this many bytes "
                                   "of trace (re-blocking multiplies them)"),
    }


FORMATS: dict[str, ImportFormat] = {
    "mooncake": ImportFormat(
        "mooncake", "Mooncake FAST'25 traces (JSON Lines, 512-token hash_ids, ms timestamps)",
        "a .jsonl file",
        {**_common("none", "none (one group 'all') | root-block (group root-<hash_ids[0]>) | "
                           "hash-mod:N (group g<k>, k = hash_ids[1] mod N, or hash_ids[0] "
                           "mod N for a one-block request)"),
         "native_block_size": Option(512, int, "tokens per source hash id")}),
    "weka": ImportFormat(
        "weka", "kv-cache-tester agentic sessions (a directory of JSON files, one per "
                "conversation; nested sub-agents flattened)",
        "a directory of .json session files, or one file",
        {**_common("file", "file (one group per session file) | type (the request's "
                           "'type') | none (one group 'all')"),
         "stagger_s": Option(0.0, float, "session k (file-name order) starts at k * "
                                         "stagger_s seconds")}),
    "bailian": ImportFormat(
        "bailian", "Alibaba Qwen/Bailian usage traces (JSON Lines, 16-token hash_ids, "
                   "chat_id/parent_chat_id chains)",
        "a .jsonl file",
        {**_common("chat", "chat (group chat-<root chat id> along parent_chat_id) | type "
                           "(the request's 'type') | none (one group 'all')"),
         "native_block_size": Option(16, int, "tokens per source hash id")}),
}


# --------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------

def _tname(v) -> str:
    if v is None:
        return "null"
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
            list: "an array", dict: "an object"}.get(type(v), type(v).__name__)


def _is_int(v) -> bool:
    return type(v) is int


def _is_num(v) -> bool:
    return (type(v) is int or type(v) is float) and math.isfinite(v)


class _Where:
    """Builds InputErrors for one place in the source (file, line or field prefix)."""

    __slots__ = ("path", "line", "prefix")

    def __init__(self, path: str, line: int | None = None, prefix: str = ""):
        self.path = path
        self.line = line
        self.prefix = prefix

    def __call__(self, message: str, field: str | None = None) -> InputError:
        f = self.prefix + field if field else (self.prefix.rstrip(".") or None)
        return InputError(message, path=self.path, line=self.line, field=f)


def _need_int(obj: dict, key: str, where: _Where, minimum: int) -> int:
    if key not in obj:
        raise where("missing", key)
    v = obj[key]
    if not _is_int(v) or v < minimum:
        raise where(f"expected an integer >= {minimum}, found {v!r:.40}", key)
    if v > MAX_JSON_INT:
        raise where(f"expected an integer <= 2^53 - 1 (the most a trace can hold), found {v}",
                    key)
    return v


def _trace_time(t: float, where: _Where, field: str, rule: str) -> float:
    """``t``, the trace time a source time became, if a trace can hold it."""
    if not 0 <= t <= MAX_TIME_S:
        raise where(f"gives t = {t:g} s ({rule}), beyond the {MAX_TIME_S:g} s a trace can "
                    f"hold", field)
    return t


def _need_time(obj: dict, key: str, where: _Where) -> float:
    if key not in obj:
        raise where("missing", key)
    v = obj[key]
    if not _is_num(v) or v < 0:
        raise where(f"expected a finite number >= 0, found {v!r:.40}", key)
    return v


def _need_ids(obj: dict, key: str, where: _Where) -> list[int]:
    if key not in obj:
        raise where("missing", key)
    ids = obj[key]
    if type(ids) is not list:
        raise where(f"expected an array of integer block ids, found {_tname(ids)}", key)
    if ids and not (all(type(x) is int for x in ids) and min(ids) >= 0):
        for i, x in enumerate(ids):
            if not _is_int(x) or x < 0:
                raise where(f"element {i}: expected an integer >= 0, found {x!r:.40}", key)
    return ids


class _Chainer:
    """Source ids -> chained sub-block hashes, with the one-parent-per-id check."""

    _NEW = object()

    def __init__(self, native: int, block_size: int, cap: _OutputCap | None = None):
        self.cap = cap
        self.native = native
        self.bs = block_size
        self.k = native // block_size
        self._js = [f"{j}\x00{block_size}".encode() for j in range(self.k)]
        self.parent: dict[str, dict] = {}     # space -> {id: parent id (None: a first block)}
        self.first_seen: dict[str, dict] = {}  # space -> {id: where it was first seen}
        self.subs: dict[str, dict] = {}       # hashspace -> {id: its k sub-block hashes}
        self.last_unidentified = 0            # full blocks of the last request no id covers

    def _subs(self, hashspace: str, x: int, prev: bytes) -> list[str]:
        out = []
        label = f"{hashspace}\x00{x}\x00".encode()
        blake = hashlib.blake2b
        for j in self._js:
            prev = blake(prev + label + j, digest_size=16).digest()
            out.append(prev.hex())
        return out

    def blocks(self, space: str, hashspace: str, ids: list[int], covered_last: int,
               uncovered: int, rid: str, where: _Where, seen_at: str, field: str
               ) -> tuple[list[str], int]:
        """Blocks and tail of one request.

        ``covered_last``: tokens the last id covers (``native`` for a full block);
        ``uncovered``: prompt tokens after the last id that no id covers.
        """
        parent_map = self.parent.get(space)
        if parent_map is None:
            parent_map = self.parent[space] = {}
            self.first_seen[space] = {}
        cache = self.subs.get(hashspace)
        if cache is None:
            cache = self.subs[hashspace] = {}
        new = self._NEW
        get_parent = parent_map.get
        get_subs = cache.get
        out: list[str] = []
        extend = out.extend
        tail = 0
        p = None
        fresh = []
        self.last_unidentified = 0
        for x in ids:
            seen = get_parent(x, new)
            if seen is new:
                parent_map[x] = p
                fresh.append(x)
            elif seen != p:
                self._inconsistent(space, ids, x, seen, p, where, seen_at, field)
            subs = get_subs(x)
            if subs is None:
                subs = cache[x] = self._subs(hashspace, x, bytes.fromhex(out[-1]) if out
                                             else _ZERO)
            extend(subs)
            p = x
        if fresh:
            fs = self.first_seen[space]
            for x in fresh:
                fs[x] = seen_at
        if ids and covered_last < self.native:
            del out[len(out) - self.k + covered_last // self.bs:]
            tail = covered_last % self.bs
        if uncovered:
            extra = uncovered // self.bs
            prev = bytes.fromhex(out[-1]) if out else _ZERO
            for j in range(extra):
                h = hashlib.blake2b(prev + f"{hashspace}\x00~{rid}\x00{j}\x00{self.bs}".encode(),
                                    digest_size=16).digest()
                out.append(h.hex())
                prev = h
            self.last_unidentified = extra
            tail = uncovered % self.bs
        if self.cap is not None:
            self.cap.add(len(out))
        return out, tail

    def _inconsistent(self, space, ids, x, seen, p, where, seen_at, field):
        i = next(i for i, y in enumerate(ids)
                 if y == x and (ids[i - 1] if i else None) == p)
        first = "nothing (a first block)" if seen is None else f"id {seen}"
        here = "nothing (a first block)" if p is None else f"id {p}"
        at = self.first_seen[space].get(x, seen_at)
        raise where(f"element {i}: id {x} follows {here} here but followed {first} at {at}: "
                    f"the ids are not prefix-consistent", field)


def _split_ids(n_ids: int, tokens: int, native: int, rule: str, where: _Where, field: str
               ) -> tuple[int, int]:
    """(tokens the last id covers, prompt tokens no id covers) for ``rule`` ceil/floor/either."""
    full, rem = divmod(tokens, native)
    if n_ids == full and rule in ("floor", "either") or (n_ids == full and rem == 0):
        return native, rem
    if rem and n_ids == full + 1 and rule in ("ceil", "either"):
        return rem, 0
    expect = {"ceil": f"ceil({tokens}/{native}) = {full + (1 if rem else 0)}",
              "floor": f"floor({tokens}/{native}) = {full}",
              "either": f"{full}" + (f" or {full + 1}" if rem else "")}[rule]
    raise where(f"expected {expect} ids for {tokens} input tokens at {native} tokens per "
                f"id, found {n_ids}", field)


@dataclass(slots=True)
class _Req:
    t: float
    rid: str
    group: str
    scope: str
    blocks: list[str]
    tail: int
    out: int
    unidentified: int = 0     # of its blocks, those no source id covers


def _open_file(src: Path, display: str) -> Path:
    if not src.exists():
        raise InputError("no such file", path=display)
    if not src.is_file():
        raise InputError("not a regular file", path=display)
    return src


def _jsonl(path: Path, display: str):
    """(line number, object) for each non-blank line of a JSON Lines file."""
    try:
        fh = open(path, "rb")
    except OSError as exc:
        raise InputError(f"cannot open: {exc.strerror}", path=display) from None
    with fh:
        for lineno, raw in enumerate(fh, 1):
            if not raw.strip():
                continue
            try:
                obj = orjson.loads(raw)
            except orjson.JSONDecodeError as exc:
                raise InputError(f"invalid JSON ({exc})", path=display, line=lineno) from None
            if type(obj) is not dict:
                raise InputError(f"expected a JSON object, found {_tname(obj)}",
                                 path=display, line=lineno)
            yield lineno, obj


# --------------------------------------------------------------------------------------
# Options
# --------------------------------------------------------------------------------------

def _resolve_options(fmt: ImportFormat, options: dict) -> dict:
    opts = fmt.defaults
    for raw_key, v in options.items():
        key = raw_key.replace("-", "_")
        spec = fmt.options.get(key)
        if spec is None:
            raise InputError(f"unknown option '{raw_key}' for format '{fmt.name}'; known: "
                             f"{', '.join(fmt.options)}", path="--option")
        flag = "--" + key.replace("_", "-")
        if v is None:
            opts[key] = spec.default
            continue
        ok = (type(v) is spec.kind or (spec.kind is float and type(v) is int))
        if not ok:
            raise InputError(f"expected {spec.kind.__name__}, found {v!r:.40}", path=flag)
        opts[key] = float(v) if spec.kind is float else v
    if opts.get("native_block_size") is not None and opts["native_block_size"] < 1:
        raise InputError(f"expected a positive integer, found {opts['native_block_size']}",
                         path="--native-block-size")
    if opts["block_size"] is not None and opts["block_size"] < 1:
        raise InputError(f"expected a positive integer, found {opts['block_size']}",
                         path="--block-size")
    if opts["limit"] is not None and opts["limit"] < 1:
        raise InputError(f"expected a positive integer, found {opts['limit']}", path="--limit")
    if opts["max_output_bytes"] < 1:
        raise InputError(f"expected a positive integer, found {opts['max_output_bytes']}",
                         path="--option max_output_bytes")
    if opts["contracts_cycle"] and opts["contract"] is not None:
        raise InputError("give either a fixed contract or contracts_cycle, not both",
                         path="--contract")
    if opts["contract"] is not None and not opts["contract"]:
        raise InputError("expected a non-empty contract name", path="--contract")
    if "stagger_s" in opts and (not math.isfinite(opts["stagger_s"]) or opts["stagger_s"] < 0):
        raise InputError(f"expected a number >= 0, found {opts['stagger_s']}", path="--stagger-s")
    return opts


def _block_size(opts: dict, native: int, where: str) -> int:
    bs = opts["block_size"] or native
    if bs > MAX_BLOCK_SIZE:
        raise InputError(f"block size {bs} is above the {MAX_BLOCK_SIZE} tokens a trace can "
                         f"hold; choose a smaller --block-size that divides {native}",
                         path="--block-size" if opts["block_size"] else where)
    if native % bs:
        raise InputError(f"block size {bs} does not divide the source's native block size "
                         f"{native}", path="--block-size" if opts["block_size"] else where)
    return bs


def _contract_rule(opts: dict) -> str:
    if opts["contracts_cycle"]:
        return ("contract of the k-th group (0-based, order of first appearance in time) = "
                f"{', '.join(CONTRACT_CYCLE)}[k mod 3]")
    return f"every request has contract '{opts['contract'] or 'standard'}'"


def _hashing(native: int, bs: int, space_rule: str) -> str:
    k = native // bs
    return (f"{HASHING}: source ids of {native}-token blocks, each split into {k} block(s) of "
            f"{bs} tokens; block j of id X in id space S after parent hash P = "
            f"BLAKE2b-128(P || 'S\\0X\\0j\\0{bs}'), P of a first block = 16 zero bytes; "
            f"prompt tokens no id covers: full blocks hashed unique to the request "
            f"(X = '~' + request id); {space_rule}")


def _finish(fmt: str, reqs: list[_Req], opts: dict, *, bs: int, native: int, source: str,
            space_rule: str, tenant_rule: str, time_rule: str, extra: dict) -> list[dict]:
    reqs.sort(key=lambda r: seconds_to_ns(r.t))      # stable: ties keep source order
    n_source = len(reqs)
    if opts["limit"] is not None:
        del reqs[opts["limit"]:]
    group_index: dict[str, int] = {}
    for r in reqs:
        if r.group not in group_index:
            group_index[r.group] = len(group_index)
    fixed = opts["contract"] or "standard"

    def contract_of(group: str) -> str:
        if opts["contracts_cycle"]:
            return CONTRACT_CYCLE[group_index[group] % len(CONTRACT_CYCLE)]
        return fixed

    groups = {g: {"contracts": [contract_of(g)]} for g in group_index}
    resolved = {k: v for k, v in opts.items() if k != "max_output_bytes"}   # no content
    resolved["block_size"] = bs
    if resolved["contract"] is None and not resolved["contracts_cycle"]:
        resolved["contract"] = "standard"
    header = header_line(
        bs, hashing=_hashing(native, bs, space_rule), source=source, groups=groups)
    header["import"] = {
        "importer": IMPORTER_VERSION, "format": fmt, "options": resolved,
        "native_block_size": native, "tenant_rule": tenant_rule,
        "contract_rule": _contract_rule(opts), "time_rule": time_rule,
        "source_requests": n_source, "requests": len(reqs),
        "groups": len(group_index),
        "unidentified_blocks": sum(r.unidentified for r in reqs), **extra,
    }
    lines = [header]
    for r in reqs:
        lines.append({"t": r.t, "op": "request", "id": r.rid, "group": r.group,
                      "contract": contract_of(r.group), "scope": r.scope,
                      "blocks": r.blocks, "tail": r.tail, "out": r.out})
    return lines


# --------------------------------------------------------------------------------------
# Mooncake
# --------------------------------------------------------------------------------------

def _mooncake_grouper(spec: str) -> tuple[Callable[[list[int]], str], str]:
    if spec == "none":
        return (lambda ids: "all"), "one group 'all'"
    if spec == "root-block":
        return (lambda ids: f"root-{ids[0]}"), (
            "group root-<hash_ids[0]>: requests whose first 512-token block is the same id "
            "share a group (in Mooncake's conversation trace every request starts with id 0, "
            "so this is one group there)")
    if spec.startswith("hash-mod:"):
        try:
            n = int(spec[len("hash-mod:"):])
        except ValueError:
            n = 0
        if n < 1:
            raise InputError(f"expected hash-mod:N with an integer N >= 1, found '{spec}'",
                             path="--group-by")
        return (lambda ids: f"g{(ids[1] if len(ids) > 1 else ids[0]) % n}"), (
            f"group g<k>, k = hash_ids[1] mod {n} (hash_ids[0] mod {n} for a one-block "
            "request): hash_ids[0] is the system-prompt block every conversation-trace "
            "request shares, the second id follows the conversation, so requests sharing "
            "more than the first block share a group")
    raise InputError(f"expected none, root-block or hash-mod:N, found '{spec}'",
                     path="--group-by")


def _import_mooncake(src: Path, display: str, opts: dict) -> list[dict]:
    _open_file(src, display)
    native = opts["native_block_size"]
    bs = _block_size(opts, native, "--native-block-size")
    grouper, tenant_rule = _mooncake_grouper(opts["group_by"])
    chainer = _Chainer(native, bs, _OutputCap(opts["max_output_bytes"]))
    reqs: list[_Req] = []
    for lineno, obj in _jsonl(src, display):
        where = _Where(display, lineno)
        ts = _need_time(obj, "timestamp", where)
        n_in = _need_int(obj, "input_length", where, 1)
        n_out = _need_int(obj, "output_length", where, 0)
        ids = _need_ids(obj, "hash_ids", where)
        covered_last, uncovered = _split_ids(len(ids), n_in, native, "ceil", where, "hash_ids")
        rid = f"mc-{lineno}"
        blocks, tail = chainer.blocks("mooncake", "mooncake", ids, covered_last, uncovered,
                                      rid, where, f"line {lineno}", "hash_ids")
        t = _trace_time(round(ts / 1000, 9), where, "timestamp", "timestamp / 1000")
        reqs.append(_Req(t, rid, grouper(ids), "mooncake", blocks, tail,
                         n_out, chainer.last_unidentified))
    if not reqs:
        raise InputError("no requests in the file", path=display)
    return _finish("mooncake", reqs, opts, bs=bs, native=native,
                   source=f"mooncake:{src.name}",
                   space_rule="one id space for the whole trace (S = 'mooncake')",
                   tenant_rule=tenant_rule,
                   time_rule="t = timestamp / 1000 (ms to s); ties keep file order",
                   extra={"file": src.name})


# --------------------------------------------------------------------------------------
# WEKA / kv-cache-tester
# --------------------------------------------------------------------------------------

def _import_weka(src: Path, display: str, opts: dict) -> list[dict]:
    if not src.exists():
        raise InputError("no such file or directory", path=display)
    if src.is_dir():
        files = sorted(p for p in src.iterdir() if p.suffix == ".json" and p.is_file())
        if not files:
            raise InputError("no .json session files in this directory", path=display)
        source = f"weka:{src.name}/ ({len(files)} session files)"
    else:
        files = [src]
        source = f"weka:{src.name}"
    group_by = opts["group_by"]
    if group_by not in ("file", "type", "none"):
        raise InputError(f"expected file, type or none, found '{group_by}'", path="--group-by")
    stagger = opts["stagger_s"]
    chainers: dict[int, _Chainer] = {}
    cap = _OutputCap(opts["max_output_bytes"])       # one for all the sessions' chainers
    reqs: list[_Req] = []
    file_info = []
    native_sizes = set()
    nested_total = 0
    for k, path in enumerate(files):
        fdisplay = str(path) if path != src else display
        try:
            obj = orjson.loads(path.read_bytes())
        except OSError as exc:
            raise InputError(f"cannot read: {exc.strerror}", path=fdisplay) from None
        except orjson.JSONDecodeError as exc:
            raise InputError(f"invalid JSON ({exc})", path=fdisplay) from None
        top = _Where(fdisplay)
        if type(obj) is not dict:
            raise top(f"expected one JSON object, found {_tname(obj)}")
        native = _need_int(obj, "block_size", top, 1)
        native_sizes.add(native)
        bs = _block_size(opts, native, f"{fdisplay}: block_size")
        scope_kind = obj.get("hash_id_scope", "local")
        if scope_kind not in ("local", "global"):
            raise top(f"expected 'local' or 'global', found {scope_kind!r:.40}", "hash_id_scope")
        stem = path.stem
        space = stem if scope_kind == "local" else "weka"
        chainer = chainers.get(native * 100000 + bs)
        if chainer is None:
            chainer = chainers[native * 100000 + bs] = _Chainer(native, bs, cap)
        offset = round(k * stagger, 9)
        if "requests" not in obj:
            raise top("missing", "requests")
        counts = {"requests": 0, "nested": 0}

        def walk(items, base_t: float, rid_prefix: str, field_prefix: str, depth: int) -> None:
            if type(items) is not list:
                raise _Where(fdisplay)(f"expected an array, found {_tname(items)}",
                                       field_prefix.rstrip(".") or "requests")
            for i, r in enumerate(items):
                fp = f"{field_prefix}[{i}]."
                where = _Where(fdisplay, None, fp)
                if type(r) is not dict:
                    raise _Where(fdisplay)(f"expected an object, found {_tname(r)}", fp[:-1])
                t_rel = _need_time(r, "t", where)
                t = _trace_time(base_t + t_rel, where, "t", "session offset + t")
                rid = f"{rid_prefix}{i}"
                if r.get("type") == "subagent" or "requests" in r:
                    if "requests" not in r:
                        raise where("missing: a subagent entry carries its own requests",
                                    "requests")
                    walk(r["requests"], t, rid + ".", fp + "requests", depth + 1)
                    continue
                model = r.get("model")
                if type(model) is not str or not model:
                    raise where(f"expected a non-empty string, found "
                                f"{'nothing' if 'model' not in r else _tname(model)}", "model")
                n_in = _need_int(r, "in", where, 1)
                n_out = _need_int(r, "out", where, 0)
                ids = _need_ids(r, "hash_ids", where)
                if group_by == "type":
                    typ = r.get("type")
                    if type(typ) is not str or not typ:
                        raise where(f"expected a non-empty string (group_by type), found "
                                    f"{'nothing' if 'type' not in r else _tname(typ)}", "type")
                    group = typ
                elif group_by == "file":
                    group = stem
                else:
                    group = "all"
                covered_last, uncovered = _split_ids(len(ids), n_in, native, "floor", where,
                                                     "hash_ids")
                blocks, tail = chainer.blocks(
                    space, f"{space}\x00{model}", ids, covered_last, uncovered, rid, where,
                    f"{path.name} {fp[:-1]}", "hash_ids")
                reqs.append(_Req(round(t, 9), rid, group, model, blocks, tail, n_out,
                                 chainer.last_unidentified))
                counts["requests"] += 1
                if depth:
                    counts["nested"] += 1

        walk(obj["requests"], offset, f"{stem}-", "requests", 0)
        nested_total += counts["nested"]
        file_info.append({"file": path.name, "id": obj.get("id") if type(obj.get("id")) is str
                          else None, "offset_s": offset, "requests": counts["requests"],
                          "nested_requests": counts["nested"]})
    if not reqs:
        raise InputError("no requests in the session file(s)", path=display)
    if len(native_sizes) > 1:
        raise InputError(f"session files disagree on block_size ({sorted(native_sizes)}); "
                         "import them separately", path=display)
    native = native_sizes.pop()
    bs = opts["block_size"] or native
    tenant_rule = {"file": "one group per session file, named after the file (its name "
                           "without .json)",
                   "type": "group = the request's 'type' field as found (n or s in the "
                           "kv-cache-tester sample)",
                   "none": "one group 'all'"}[group_by]
    return _finish(
        "weka", reqs, opts, bs=bs, native=native, source=source,
        space_rule="S = the session file's name without .json (hash_id_scope 'local') or 'weka' "
                   "('global'), "
                   "then NUL and the request's model: ids never meet across files or models",
        tenant_rule=tenant_rule,
        time_rule=("session file k (file-name order, 0-based) starts at k * stagger_s; "
                   "t = offset + request t; a nested sub-agent request (inside a "
                   "type 'subagent' entry's requests[]) has t = offset + sub-agent t + its "
                   "own t; ties keep file, then request order"),
        extra={"files": file_info, "nested_requests": nested_total})


# --------------------------------------------------------------------------------------
# Alibaba Qwen / Bailian
# --------------------------------------------------------------------------------------

def _is_root_marker(v) -> bool:
    return v is None or v == -1 or v == "-1" or v == ""


def _import_bailian(src: Path, display: str, opts: dict) -> list[dict]:
    _open_file(src, display)
    native = opts["native_block_size"]
    bs = _block_size(opts, native, "--native-block-size")
    group_by = opts["group_by"]
    if group_by not in ("chat", "type", "none"):
        raise InputError(f"expected chat, type or none, found '{group_by}'", path="--group-by")
    chainer = _Chainer(native, bs, _OutputCap(opts["max_output_bytes"]))
    rows = []
    parent_of: dict = {}
    line_of: dict = {}
    for lineno, obj in _jsonl(src, display):
        where = _Where(display, lineno)
        if "chat_id" not in obj:
            raise where("missing", "chat_id")
        cid = obj["chat_id"]
        if not (_is_int(cid) or (type(cid) is str and cid)):
            raise where(f"expected an integer or a non-empty string, found {_tname(cid)}",
                        "chat_id")
        if cid in line_of:
            raise where(f"duplicate chat_id {cid!r:.40} (first on line {line_of[cid]})",
                        "chat_id")
        pid = obj.get("parent_chat_id")
        if not (_is_root_marker(pid) or _is_int(pid) or type(pid) is str):
            raise where(f"expected a chat id, -1 or null, found {_tname(pid)}",
                        "parent_chat_id")
        if pid == cid:
            raise where("a chat cannot be its own parent", "parent_chat_id")
        ts = _need_time(obj, "timestamp", where)
        n_in = _need_int(obj, "input_length", where, 1)
        n_out = _need_int(obj, "output_length", where, 0)
        ids = _need_ids(obj, "hash_ids", where)
        typ = obj.get("type")
        if group_by == "type" and (type(typ) is not str or not typ):
            raise where(f"expected a non-empty string (group_by type), found "
                        f"{'nothing' if 'type' not in obj else _tname(typ)}", "type")
        covered_last, uncovered = _split_ids(len(ids), n_in, native, "either", where,
                                             "hash_ids")
        rid = f"bl-{lineno}"
        blocks, tail = chainer.blocks("bailian", "bailian", ids, covered_last, uncovered, rid,
                                      where, f"line {lineno}", "hash_ids")
        line_of[cid] = lineno
        parent_of[cid] = None if _is_root_marker(pid) else pid
        rows.append((lineno, cid, ts, typ, blocks, tail, n_out, chainer.last_unidentified))
    if not rows:
        raise InputError("no requests in the file", path=display)

    root_of: dict = {}

    def root(cid):
        path = []
        c = cid
        while c not in root_of:
            p = parent_of.get(c)
            if p is None or p not in parent_of:
                # a root, or its parent lies outside the file: the chain starts here
                root_of[c] = c if p is None else p
                break
            path.append(c)
            if len(path) > len(parent_of):
                raise InputError(f"parent_chat_id chain from chat {cid!r:.40} loops",
                                 path=display, line=line_of[cid], field="parent_chat_id")
            c = p
        r = root_of[c]
        for x in path:
            root_of[x] = r
        return r

    t0 = min(r[2] for r in rows)
    reqs = []
    for lineno, cid, ts, typ, blocks, tail, n_out, unid in rows:
        _trace_time(ts - t0, _Where(display, lineno), "timestamp",
                    f"timestamp - earliest timestamp {t0:g}")
        group = {"chat": lambda: f"chat-{root(cid)}", "type": lambda: typ,
                 "none": lambda: "all"}[group_by]()
        reqs.append(_Req(round(ts - t0, 9), f"bl-{lineno}", group, "bailian", blocks, tail,
                         n_out, unid))
    tenant_rule = {"chat": "group chat-<R>, R = the root of the request's parent_chat_id chain "
                           "(a chat with parent -1, null or missing is a root; a parent not in "
                           "the file is taken as the root)",
                   "type": "group = the request's 'type' field",
                   "none": "one group 'all'"}[group_by]
    return _finish("bailian", reqs, opts, bs=bs, native=native, source=f"bailian:{src.name}",
                   space_rule="one id space for the whole trace (S = 'bailian')",
                   tenant_rule=tenant_rule,
                   time_rule="t = timestamp - earliest timestamp in the file (s); ties keep "
                             "file order",
                   extra={"file": src.name, "t0": t0})


_IMPORTERS = {"mooncake": _import_mooncake, "weka": _import_weka, "bailian": _import_bailian}


def import_trace(fmt: str, src: str | Path, **options) -> list[dict]:
    """Import a public trace of format ``fmt`` from ``src`` as psgate-trace v1 lines.

    Options (see ``FORMATS[fmt].options``; ``-`` in names is accepted for ``_``):
    ``block_size`` (divisor of the native block size; default native), ``group_by``
    (tenant rule), ``contract`` (fixed contract, default 'standard') or
    ``contracts_cycle`` (critical/standard/best-effort by group), ``limit`` (first N
    requests in time order); mooncake/bailian ``native_block_size``; weka
    ``stagger_s``. A ``None`` value means the default. Raises InputError on bad input.
    """
    spec = FORMATS.get(fmt)
    if spec is None:
        raise InputError(f"unknown trace format '{fmt}'; known: {', '.join(FORMATS)}",
                         path="FORMAT")
    opts = _resolve_options(spec, options)
    display = str(src)
    require_utf8_name(display)
    lines = _IMPORTERS[fmt](Path(src), display, opts)
    # What an importer writes must be what psgate reads: checked here, before any file.
    return check_lines(lines, f"{display} (imported)")
