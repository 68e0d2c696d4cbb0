"""What the importers share: the option table, source checks, the chained hashing of
source ids and the assembly of the psgate-trace lines.

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
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import orjson

from psgate.contracts import CONTRACT_NAMES
from psgate.errors import InputError
from psgate.inputs import open_input
from psgate.trace.importers.answers import infer_answers
from psgate.trace.model import seconds_to_ns
from psgate.trace.reader import MAX_BLOCK_SIZE, MAX_JSON_INT, MAX_TIME_S, is_number, type_name
from psgate.trace.writer import header_line

IMPORTER_VERSION = "psgate-import-v1"
HASHING = "psgate-import-blake2b-128"
_ZERO = bytes(16)
MAX_OUTPUT_BYTES = 256 * 1024 * 1024
HASH_OUTPUT_BYTES = 35      # one block hash in a trace line: 32 hex digits, 2 quotes, a comma


class OutputCap:
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


def common_options(group_by: str, group_help: str) -> dict[str, Option]:
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
        "answers": Option(None, str, "'infer': give a request the answer a later turn "
                                     "re-sends (psgate/trace/importers/answers.py; the "
                                     "native block size only)"),
    }


# --------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------

def is_int(v) -> bool:
    return type(v) is int


class Where:
    """Builds InputErrors for one place in the source (file, line or field prefix)."""

    __slots__ = ("path", "line", "prefix")

    def __init__(self, path: str, line: int | None = None, prefix: str = ""):
        self.path = path
        self.line = line
        self.prefix = prefix

    def __call__(self, message: str, field: str | None = None) -> InputError:
        f = self.prefix + field if field else (self.prefix.rstrip(".") or None)
        return InputError(message, path=self.path, line=self.line, field=f)


def need_int(obj: dict, key: str, where: Where, minimum: int) -> int:
    if key not in obj:
        raise where("missing", key)
    v = obj[key]
    if not is_int(v) or v < minimum:
        raise where(f"expected an integer >= {minimum}, found {v!r:.40}", key)
    if v > MAX_JSON_INT:
        raise where(f"expected an integer <= 2^53 - 1 (the most a trace can hold), found {v}",
                    key)
    return v


def trace_time(t: float, where: Where, field: str, rule: str) -> float:
    """``t``, the trace time a source time became, if a trace can hold it."""
    if not 0 <= t <= MAX_TIME_S:
        raise where(f"gives t = {t:g} s ({rule}), beyond the {MAX_TIME_S:g} s a trace can "
                    f"hold", field)
    return t


def need_time(obj: dict, key: str, where: Where) -> float:
    if key not in obj:
        raise where("missing", key)
    v = obj[key]
    if not is_number(v) or v < 0:
        raise where(f"expected a finite number >= 0, found {v!r:.40}", key)
    return v


def need_ids(obj: dict, key: str, where: Where) -> list[int]:
    if key not in obj:
        raise where("missing", key)
    ids = obj[key]
    if type(ids) is not list:
        raise where(f"expected an array of integer block ids, found {type_name(ids)}", key)
    if ids and not (all(type(x) is int for x in ids) and min(ids) >= 0):
        for i, x in enumerate(ids):
            if not is_int(x) or x < 0:
                raise where(f"element {i}: expected an integer >= 0, found {x!r:.40}", key)
    return ids


class PendingBlocks(NamedTuple):
    """A checked request's blocks, hashed on demand: an import with ``limit`` hashes (and
    counts against the output cap) only the requests it keeps."""

    chainer: Chainer
    hashspace: str
    ids: list[int]
    covered_last: int
    uncovered: int
    rid: str

    def hashes(self) -> list[str]:
        return self.chainer.hashes(self.hashspace, self.ids, self.covered_last,
                                   self.uncovered, self.rid)


class Chainer:
    """Source ids -> chained sub-block hashes, with the one-parent-per-id check."""

    _NEW = object()

    def __init__(self, native: int, block_size: int, cap: OutputCap | None = None):
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
               uncovered: int, rid: str, where: Where, seen_at: str, field: str
               ) -> tuple[PendingBlocks, int]:
        """Blocks and tail of one request: the one-parent-per-id check now, in source
        order, the hashes later (``PendingBlocks.hashes``), once ``finish`` knows which
        requests the limit keeps. A sub-block's hash depends on its id's parent alone,
        which this check makes one per id, so hashing the kept requests alone gives them
        the hashes a whole-file import does.

        ``covered_last``: tokens the last id covers (``native`` for a full block);
        ``uncovered``: prompt tokens after the last id that no id covers.
        """
        parent_map = self.parent.get(space)
        if parent_map is None:
            parent_map = self.parent[space] = {}
            self.first_seen[space] = {}
        new = self._NEW
        get_parent = parent_map.get
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
            p = x
        if fresh:
            fs = self.first_seen[space]
            for x in fresh:
                fs[x] = seen_at
        if ids and covered_last < self.native:
            tail = covered_last % self.bs
        if uncovered:
            self.last_unidentified = uncovered // self.bs
            tail = uncovered % self.bs
        return PendingBlocks(self, hashspace, ids, covered_last, uncovered, rid), tail

    def hashes(self, hashspace: str, ids: list[int], covered_last: int, uncovered: int,
               rid: str) -> list[str]:
        """The chained sub-block hashes of a request that ``blocks`` checked, counted
        against the output cap."""
        cache = self.subs.get(hashspace)
        if cache is None:
            cache = self.subs[hashspace] = {}
        get_subs = cache.get
        out: list[str] = []
        extend = out.extend
        for x in ids:
            subs = get_subs(x)
            if subs is None:
                subs = cache[x] = self._subs(hashspace, x, bytes.fromhex(out[-1]) if out
                                             else _ZERO)
            extend(subs)
        if ids and covered_last < self.native:
            del out[len(out) - self.k + covered_last // self.bs:]
        if uncovered:
            prev = bytes.fromhex(out[-1]) if out else _ZERO
            for j in range(uncovered // self.bs):
                h = hashlib.blake2b(prev + f"{hashspace}\x00~{rid}\x00{j}\x00{self.bs}".encode(),
                                    digest_size=16).digest()
                out.append(h.hex())
                prev = h
        if self.cap is not None:
            self.cap.add(len(out))
        return out

    def _inconsistent(self, space, ids, x, seen, p, where, seen_at, field):
        i = next(i for i, y in enumerate(ids)
                 if y == x and (ids[i - 1] if i else None) == p)
        first = "nothing (a first block)" if seen is None else f"id {seen}"
        here = "nothing (a first block)" if p is None else f"id {p}"
        at = self.first_seen[space].get(x, seen_at)
        raise where(f"element {i}: id {x} follows {here} here but followed {first} at {at}: "
                    f"the ids are not prefix-consistent", field)


def split_ids(n_ids: int, tokens: int, native: int, rule: str, where: Where, field: str
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
class Req:
    t: float
    rid: str
    group: str
    scope: str
    blocks: PendingBlocks
    tail: int
    out: int
    unidentified: int = 0     # of its blocks, those no source id covers


def open_file(src: Path, display: str) -> Path:
    if not src.exists():
        raise InputError("no such file", path=display)
    if not src.is_file():
        raise InputError("not a regular file", path=display)
    return src


def jsonl(path: Path, display: str):
    """(line number, object) for each non-blank line of a JSON Lines file."""
    try:
        fh = open_input(path, "trace file")
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
                raise InputError(f"expected a JSON object, found {type_name(obj)}",
                                 path=display, line=lineno)
            yield lineno, obj


# --------------------------------------------------------------------------------------
# Options
# --------------------------------------------------------------------------------------

def resolve_options(fmt: ImportFormat, options: dict) -> dict:
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
    if opts["answers"] not in (None, "infer"):
        raise InputError(f"expected infer, found {opts['answers']!r:.40}",
                         path="--option answers")
    if opts["contract"] is not None and not opts["contract"]:
        raise InputError("expected a non-empty contract name", path="--contract")
    if "stagger_s" in opts and (not math.isfinite(opts["stagger_s"]) or opts["stagger_s"] < 0):
        raise InputError(f"expected a number >= 0, found {opts['stagger_s']}", path="--stagger-s")
    return opts


def output_block_size(opts: dict, native: int, where: str) -> int:
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
                f"{', '.join(CONTRACT_NAMES)}[k mod 3]")
    return f"every request has contract '{opts['contract'] or 'standard'}'"


def _hashing(native: int, bs: int, space_rule: str) -> str:
    k = native // bs
    return (f"{HASHING}: source ids of {native}-token blocks, each split into {k} block(s) of "
            f"{bs} tokens; block j of id X in id space S after parent hash P = "
            f"BLAKE2b-128(P || 'S\\0X\\0j\\0{bs}'), P of a first block = 16 zero bytes; "
            f"prompt tokens no id covers: full blocks hashed unique to the request "
            f"(X = '~' + request id); {space_rule}")


def finish(fmt: str, reqs: list[Req], opts: dict, *, bs: int, native: int, source: str,
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
            return CONTRACT_NAMES[group_index[group] % len(CONTRACT_NAMES)]
        return fixed

    groups = {g: {"contracts": [contract_of(g)]} for g in group_index}
    # no content; answers only when asked for, so earlier imports stay byte-identical
    resolved = {k: v for k, v in opts.items()
                if k != "max_output_bytes" and not (k == "answers" and v is None)}
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
                      "blocks": r.blocks.hashes(), "tail": r.tail, "out": r.out})
    if opts["answers"] == "infer":
        if bs != native:
            # a finer block splits the predecessor's last, partly filled source block into
            # blocks its follower does not share: the follower no longer starts with them
            raise InputError(f"answers=infer needs the source's native block size {native} "
                             f"(found {bs})", path="--option answers")
        header["import"].update(infer_answers(lines, bs))
    return lines


# --------------------------------------------------------------------------------------
# Mooncake
# --------------------------------------------------------------------------------------
