"""explain: one ledger decision in words, and the full candidate set behind it.

A ledger row is complete enough to explain a decision on its own; with
``--candidates`` the run is replayed up to that row (stopping before the engine
mutates anything) and the policy's whole candidate order at that moment is
listed, so the alternatives can be seen, not just counted.
"""

from __future__ import annotations

import csv
import textwrap
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

import orjson

from psgate.engines.base import NullRecorder
from psgate.errors import InputError
from psgate.receipt.ledger import fmt_t
from psgate.report.receipts import (config_from_receipt, load_receipt, prepare_replay,
                                    replay_run, resimulation_refusal, text_lines)
from psgate.report.render import printable
from psgate.report.verify import recorded_outputs_difference
from psgate.trace.keys import OUTPUT_KEY_BIT, split_key
from psgate.trace.model import RequestEvent
from psgate.trace.reader import HashTable, TraceReader, TraceSource, validate_trace

SEGMENT_ORDER = "Probationary, then Normal, then Reuse"


def read_rows(directory: Path, run: str, name: str = "ledger.csv") -> list[dict]:
    p = directory / name
    try:
        return [r for r in csv.DictReader(text_lines(p)) if r.get("run") == run]
    except FileNotFoundError:
        raise InputError(f"no {name} here", path=str(directory)) from None


def _rank(row: dict) -> dict:
    return orjson.loads(row["rank"]) if row["rank"] else {}


def describe_eviction(row: dict, policy: str) -> list[str]:
    rank = _rank(row)
    held = (f"trace hash {row['hash'][:16]}..." if row["hash"]
            else "an output block, no trace hash")
    out = [f"decision {row['seq']} ({row['run']} run, policy {policy}) at t={row['t']} s: "
           f"admitting request {row['request']} of group {row['group']} "
           f"(contract {row['contract']}) needed a block beyond the truly free ones.",
           f"Victim: block {row['block']} ({held}, owned by {row['owner']}), taken from "
           f"queue '{row['queue']}' at position {row['position']}, "
           f"out of {row['num_candidates']} candidates (unpinned cached blocks)."]
    if row["responsible"]:
        out.append(
            f"Why this group: {row['responsible']} had the largest projected normalized creation "
            f"debt among groups owning eligible candidates (P = {row['responsible_p_before']}); "
            + (f"the runner-up was {row['runner_up']} at P = {row['runner_up_p']}. "
               if row["runner_up"] else "no other group was in debt. ")
            + f"Taking this victim lowers its projection to {row['responsible_p_after']} "
            f"for the rest of the batch.")
    elif "global_fallback" in rank:
        out.append("Why this group: no group owning an eligible candidate was in debt "
                   "(P_g <= eps), so the segment order applied across all groups.")
    if "segment" in rank:
        seg = orjson.loads(row["segments"]) if row["segments"] else {}
        out.append(f"Why this block: segments are emptied {SEGMENT_ORDER}; it was the first "
                   f"in native free order (freed_seq {rank.get('freed_seq')}) of segment "
                   f"'{rank['segment']}' (class {rank.get('class')}). Eligible candidates per "
                   f"segment: {', '.join(f'{k} {v}' for k, v in seg.items())}.")
        out.append(f"Owner's debt now: raw {rank.get('owner_raw_debt')}, normalized "
                   f"{rank.get('owner_norm_debt')} blocks (contract {rank.get('owner_contract')}).")
    elif "freed_t" in rank and policy == "lru":
        out.append(f"Why this block: it was the least recently freed candidate (freed at "
                   f"t={rank['freed_t']} s), the head of vLLM's free queue.")
    else:
        out.append("Ranking fields: " + ", ".join(f"{k}={v}" for k, v in sorted(rank.items())))
    if rank.get("ancestry_fallback"):
        out.append("Note: no eligible leaf existed, so a non-leaf block was taken "
                   "(an ancestry fallback).")
    return out


def describe_admission(row: dict) -> list[str]:
    rank = _rank(row)
    out = [f"admission {row['seq']} ({row['run']} run) at t={row['t']} s: request "
           f"{row['request']} of group {row['group']} (contract {row['contract']}) hit "
           f"{row['hits']} cached blocks, was allocated {row['allocated']} and materialized "
           f"{row['new_blocks']}."]
    if rank:
        out.append("Policy notes: " + ", ".join(f"{k}={orjson.dumps(v).decode()}"
                                                for k, v in sorted(rank.items())))
    return out


@dataclass
class _Stop(Exception):
    candidates: list[tuple[int, str, str]]


class _Preemptions(NullRecorder):
    """One request's preemptions in a re-simulated run: when, by whom, what it lost."""

    def __init__(self, request: str) -> None:
        self.request = request
        self.engine = None          # set by replay_run
        self.found: list[dict] = []

    def preempted(self, now_ns, req, by, num_computed) -> None:
        if req.id == self.request:
            self.found.append({"t": fmt_t(now_ns), "by": by.id, "by_group": by.group,
                               "lost_tokens": num_computed})


def _preemptions(directory: Path, receipt: dict, trace: _Trace, request: str) -> dict:
    """Per run, how often ``request`` was preempted and the tokens it computed again
    (requests.csv), and when and why (a re-simulation, only where it was preempted and
    the run can be re-simulated)."""
    from psgate.report.html import read_requests
    out: dict[str, dict] = {}
    rows = read_requests(directory)
    prepared = None
    for run in RUNS:
        row = next((r for r in rows.get(run, []) if r["id"] == request), None)
        if row is None or "preemptions" not in row:
            continue        # a receipt from before requests.csv recorded them
        n = int(row["preemptions"] or 0)
        out[run] = {"preemptions": n,
                    "recompute_tokens": int(row["preempt_recompute_tokens"] or 0)}
        if n and not resimulation_refusal(receipt, "explain"):
            rec = _Preemptions(request)
            if prepared is None:        # the trace validated once for both runs
                prepared = prepare_replay(receipt, trace.override, "explain")
            replay_run(receipt, prepared, run, rec)
            out[run]["events"] = rec.found
    return out


class _StopAt(NullRecorder):
    """Counts ledger rows as the ledger writer would, and stops at the target one."""

    sequential = True          # reads the candidates as they were before each eviction

    def __init__(self, seq: int, hits: bool) -> None:
        self.seq = 0
        self.target = seq
        self.engine = None          # set by replay_run
        self.hits = hits

    def hit(self, *a) -> None:
        self._tick()

    def _tick(self) -> None:
        self.seq += 1

    def admission(self, *a) -> None:
        self._tick()

    def eviction(self, now_ns, req, decision, block, hash_name, owner) -> None:
        self._tick()
        if self.seq == self.target:
            eng = self.engine
            names = eng.hashes.names
            # a cached output block (step scheduler) holds no trace hash: its key is above
            # every trace key (psgate.trace.keys.OUTPUT_KEY_BIT), and it is listed as such
            cands = [(b, names[split_key(k)[1]] if (k := eng.key[b]) < OUTPUT_KEY_BIT
                      else "(output)", eng.group_names[eng.owner[b]])
                     for b in eng.policy.candidates()]
            raise _Stop(cands)


def candidates_at(receipt: dict, run: str, seq: int, trace: str | None = None
                  ) -> list[tuple[int, str, str]]:
    """Replay ``run`` up to ledger row ``seq`` and return the policy's candidates then."""
    prepared = prepare_replay(receipt, trace, "explain --candidates")
    try:
        replay_run(receipt, prepared, run, _StopAt(seq, prepared[0].ledger_hits))
    except _Stop as stop:
        return stop.candidates
    raise InputError(f"the replay never reached decision {seq} of the {run} run")


def _load_intact(directory: Path) -> dict:
    """The receipt, once every output it records has the SHA-256 it records: explain reads
    the ledger only as far as its answer, so a file cut or edited past that point would
    otherwise pass unnoticed, and an edited row would be explained as if psgate wrote it."""
    receipt = load_receipt(directory)
    diff = recorded_outputs_difference(directory, receipt)
    if diff is not None:
        raise InputError(f"{diff}; psgate verify names the first difference",
                         path=str(directory))
    return receipt


def _ledger_config(receipt: dict) -> dict:
    return receipt["config"].get("ledger", {"rows": "all", "file": "ledger.csv"})


def explain(directory: str | Path, run: str = "candidate", decision: int | None = None,
            slot: int | None = None, candidates: bool = False, trace: str | None = None,
            limit: int = 20) -> list[str]:
    """One ledger decision (``decision``), or every eviction of one pool slot (``slot``:
    a block id, which many contents share over a run), in words."""
    directory = Path(directory)
    receipt = _load_intact(directory)
    _check_run(run)
    policy = receipt["config"][run]["name"]
    name = _ledger_config(receipt)["file"]
    if decision is not None:
        sel, count = _select(directory, name, run, decision=decision)
        if not sel:
            raise InputError(f"the {run} run has no ledger row {decision} (it has "
                             f"{count})", path="--decision")
    elif slot is not None:
        sel, _ = _select(directory, name, run, slot=str(slot))
        if not sel:
            raise InputError(f"pool slot {slot} was never evicted in the {run} run",
                             path="--slot")
    else:
        raise InputError("name a --decision, --request, --block or --slot", path="explain")
    lines: list[str] = []
    for r in sel:
        lines += describe_eviction(r, policy) if r["kind"] == "evict" else describe_admission(r)
        if candidates and r["kind"] == "evict":
            cands = candidates_at(receipt, run, int(r["seq"]), trace)
            lines.append(f"All {len(cands)} candidates at that moment, as {policy} lists "
                         f"them (first {min(limit, len(cands))}):")
            shown = [i for i in range(min(limit, len(cands)))]
            vi = next((i for i, c in enumerate(cands) if str(c[0]) == r["block"]), None)
            if vi is not None and vi >= limit:
                shown.append(vi)
            for i in shown:
                b, h, owner = cands[i]
                if i == vi and i >= limit:
                    lines.append("  ...")
                mark = "  <- victim" if i == vi else ""
                lines.append(f"  {i:>4}  block {b:>6}  {owner:<16} {h[:16]}{mark}")
        lines.append("")
    return lines


def _compact_dicts(reader, fieldnames: list[str]) -> list[dict]:
    """The current row of a CompactReader as csv.DictReader reads the decoded ledger (one
    dict, or more where a field's text holds a line break csv reads as a row's end)."""
    line = reader.line()
    return list(csv.DictReader((part + "\n" for part in line[:-1].split("\n")),
                               fieldnames=fieldnames))


def _rows_stream(directory: Path, name: str):
    """(row number, a row dict or None, the live CompactReader or None) for every ledger
    row, streamed. A compact ledger's rows are decoded into the reader's state and no row
    is made (None) where the reader can give its fields as they are (``simple``); a
    plain or gzip ledger's rows are csv.DictReader's."""
    p = directory / name
    if not p.is_file():
        raise InputError(f"no {name} here", path=str(directory))
    if name.endswith(".compact.csv.gz"):
        from psgate.receipt.compact import read_compact
        fieldnames = None
        for n, reader in read_compact(p):
            if fieldnames is None:
                fieldnames = next(csv.reader([",".join(reader.columns) + "\n"]))
            if reader.simple:
                yield n - 1, None, reader
            else:
                for row in _compact_dicts(reader, fieldnames):
                    yield n - 1, row, None
        return
    lines = text_lines(p)
    with closing(lines):
        reader = csv.DictReader(lines)
        for row in reader:
            yield reader.line_num, row, None


def _select(directory: Path, name: str, run: str, decision: int | None = None,
            slot: str | None = None) -> tuple[list[dict], int]:
    """The rows of ``run`` that are ledger row ``decision`` (the first found: a run numbers
    its rows once), or the evictions from pool slot ``slot`` (the run's rows are together:
    reading stops where they end); and how many rows of the run were read."""
    sel: list[dict] = []
    count = 0
    seen = False
    for _, row, rd in _rows_stream(directory, name):
        get = row.get if rd is None else rd.value     # a decoded row, or the reader's state
        if get("run") != run:
            if seen and slot is not None:
                break
            continue
        seen = True
        count += 1
        if decision is not None:
            if int(get("seq")) != decision:
                continue
        elif get("kind") != "evict" or get("block") != slot:
            continue
        sel.append(row if rd is None else dict(zip(rd.columns, map(rd.value, rd.columns))))
        if decision is not None:
            break
    return sel, count


def _check_run(run: str) -> None:
    if run not in RUNS:
        raise InputError(f"expected baseline or candidate, found '{run}'", path="--run")


# -- blame: which earlier decisions took a request's prefix ----------------------------
#
# The ledger orders every decision of a run; the trace says which contents each request
# holds. Walking a run's rows in order with a count of resident copies per content (an
# admission caches the request's blocks past its hits as new copies, an eviction drops
# one copy) gives, at any request's lookup, which of its blocks were resident and, for
# each that was not, the eviction that dropped the content's last copy. A content is
# (group, scope, trace hash): each (group, scope) is its own cache namespace. A ledger
# row names the victim's group and hash; where a group has several scopes the scope
# comes from replaying the run.

RUNS = ("baseline", "candidate")
_NEEDED = ("run", "seq", "t", "kind", "request", "group", "hash", "owner", "hits",
           "new_blocks")


@dataclass
class _Request:
    id: str
    group: str
    contract: str
    scope: str
    t_ns: int
    blocks: list[int]
    prompt_tokens: int
    chain: list[int]        # blocks, then the answer's: the contents its admissions cache


class _Trace:
    """The trace's requests (ids, groups, interned block hashes), read in one pass."""

    def __init__(self, receipt: dict, trace: str | None) -> None:
        cfg = config_from_receipt(receipt, Path("."), trace=trace)
        self.path = cfg.trace
        self.override = trace
        self.hashes = HashTable()
        self.requests: dict[str, _Request] = {}
        # a content first seen in a request's answer -> that request: a later prompt that
        # re-sends it hits what the server cached while decoding the answer
        self.answer_of: dict[int, str] = {}
        scopes: dict[str, set[str]] = {}
        summary = validate_trace(cfg.trace, self.hashes, cfg.limits)[1]
        seen: set[int] = set()
        with TraceReader(TraceSource.resolve(cfg.trace), self.hashes, cfg.limits,
                         validated=summary) as reader:
            self.block_size = reader.header.block_size
            for ev in reader.events():
                if type(ev) is RequestEvent:
                    self.requests[ev.id] = _Request(
                        ev.id, ev.group, ev.contract, ev.scope, ev.t_ns, ev.blocks,
                        ev.prompt_tokens, ev.chain)
                    scopes.setdefault(ev.group, set()).add(ev.scope)
                    seen.update(ev.blocks)
                    for h in ev.answer or ():
                        if h not in seen:
                            self.answer_of.setdefault(h, ev.id)
        self.scope_of = {g: next(iter(v)) for g, v in scopes.items() if len(v) == 1}
        self.multi_scope = len(self.scope_of) < len(scopes)

    def name(self, hid: int) -> str:
        return self.hashes.names[hid]

    def hid(self, name: str) -> int | None:
        return self.hashes.ids.get(name)

    def max_hits(self, r: _Request) -> int:
        """A lookup stops one token short of the prompt, in whole blocks (vLLM's rule)."""
        return min((r.prompt_tokens - 1) // self.block_size, len(r.blocks))


_LIGHT = ("run", "seq", "t", "kind", "request", "group", "hash", "owner", "hits",
          "new_blocks")


def _light(rd) -> dict:
    """A simple compact row as the fields a walk reads on every row (an admission's rank
    only where it has a "resumed" key: what the walk asks of it), and ``_full`` to make
    the whole row while the reader still holds it."""
    row = {c: rd.value(c) for c in _LIGHT}
    if row["kind"] == "admit":
        keys = rd.json_keys("rank")
        row["rank"] = rd.value("rank") if keys and "resumed" in keys else ""
    row["_full"] = lambda: {c: rd.value(c) for c in rd.columns}
    return row


def _full(row: dict) -> dict:
    """The whole ledger row of a row from _ledger_lines (call it before the next row)."""
    make = row.pop("_full", None)
    if make is None:
        return row
    extra = {k: v for k, v in row.items() if k not in _LIGHT and k != "rank"}
    return {**make(), **extra}


def _ledger_lines(directory: Path, name: str, run: str):
    """(line number, row) of one run's ledger rows, streamed; a row that cannot be read
    is an error naming the file, line and field. A compact ledger's rows may be light
    (only what the walk reads, see _light): :func:`_full` gives the whole row."""
    p = directory / name
    if not p.is_file():
        raise InputError(f"no {name} here", path=str(directory))
    checked = False
    line = 0
    try:
        for line, row, rd in _rows_stream(directory, name):
            if not checked:
                cols = rd.columns if rd is not None else list(row)
                missing = [c for c in _NEEDED if c not in cols]
                if missing:
                    raise InputError("not a psgate ledger (no such column)", path=str(p),
                                     line=1, field=missing[0])
                checked = True
            if rd is not None:
                if rd.value("run") != run:
                    continue
                row = _light(rd)
            elif row["run"] != run:
                continue
            for f in ("seq", "hits") if row["kind"] == "admit" else ("seq",):
                v = row[f]
                if v is None or not v.isdigit():
                    raise InputError(f"expected a whole number, found {v!r}", path=str(p),
                                     line=line, field=f)
            yield line, row
    except (csv.Error, OSError) as exc:
        raise InputError(f"unreadable ledger ({exc})", path=str(p), line=line) from None


class _Replayed(NullRecorder):
    """Numbers decisions as the ledger writer does, keeping each admission (which an
    evictions-only ledger leaves out) and each victim's hash and scope (which no ledger
    row holds), to check the replay against the ledger row by row; stops after the
    admission of ``stop_after``."""

    def __init__(self, stop_after: str | None, hits: bool) -> None:
        self.seq = 0
        self.hits = hits
        self.engine = None          # set by replay_run
        self.stop_after = stop_after
        self.admits: list[dict] = []
        self.evicted: dict[int, tuple[str, str | None]] = {}
        self._scopes: dict[int, str] = {}

    def hit(self, *a) -> None:
        self.seq += 1

    def eviction(self, now_ns, req, decision, block, hash_name, owner) -> None:
        self.seq += 1
        eng = self.engine
        ns = split_key(eng.key[block])[0]      # the victim still holds its content
        if ns not in self._scopes:
            self._scopes = {v: k[1] for k, v in eng.ns_ids.items()}
        self.evicted[self.seq] = (hash_name, self._scopes.get(ns))

    def admission(self, now_ns, req, hits, allocated, new_blocks, note) -> None:
        self.seq += 1
        self.admits.append({"seq": str(self.seq), "t": fmt_t(now_ns), "kind": "admit",
                            "request": req.id, "group": req.group, "contract": req.contract,
                            "hits": str(hits), "allocated": str(allocated),
                            "new_blocks": str(new_blocks)})
        if req.id == self.stop_after:
            raise _Reached()


class _Reached(Exception):
    pass


def _run_rows(directory: Path, receipt: dict, run: str, trace: _Trace,
              stop_after: str | None):
    """One run's decisions in order, admissions included, each eviction with its scope
    where the trace cannot tell it: read from the ledger alone when it has every row and
    every group one scope, else merged with a replay of the run that is checked row by
    row against the ledger's evictions."""
    ledger = _ledger_config(receipt)
    name = ledger["file"]
    evictions_only = ledger.get("rows", "all") == "evictions"
    if not evictions_only and not trace.multi_scope:
        yield from _ledger_lines(directory, name, run)
        return
    prepared = prepare_replay(receipt, trace.override, "explaining a request or block from "
                              "an evictions-only ledger or a multi-scope trace")
    rec = _Replayed(stop_after, prepared[0].ledger_hits and not evictions_only)
    try:
        replay_run(receipt, prepared, run, rec)
    except _Reached:
        pass
    admits = iter(rec.admits if evictions_only else ())
    nxt = next(admits, None)
    for line, row in _ledger_lines(directory, name, run):
        seq = int(row["seq"])
        while nxt is not None and int(nxt["seq"]) < seq:
            yield 0, nxt
            nxt = next(admits, None)
        if stop_after is not None and seq > rec.seq:
            return
        if row["kind"] == "evict":
            got = rec.evicted.get(seq)
            if got is None or got[0] != row["hash"]:
                raise InputError(f"replaying the {run} run does not reproduce this eviction "
                                 f"(engine {receipt['config'].get('engine', 'sim')}); "
                                 f"explaining a request needs a ledger with every row from "
                                 f"a single-scope trace here", path=str(directory / name),
                                 line=line, field="hash")
            row["scope"] = got[1]
        yield line, row
    while nxt is not None:
        yield 0, nxt
        nxt = next(admits, None)


def _eviction(row: dict, policy: str) -> dict:
    """An eviction row as the facts a blame line needs."""
    return {"decision": int(row["seq"]), "t": row["t"], "request": row["request"],
            "group": row["group"], "owner": row["owner"], "queue": row.get("queue") or "",
            "position": _int_or_none(row.get("position")),
            "num_candidates": _int_or_none(row.get("num_candidates")),
            "responsible": row.get("responsible") or None,
            "rank": _rank_or_raw(row), "reason": reason(row, policy)}


def _int_or_none(v: str | None) -> int | None:
    return int(v) if v and v.lstrip("-").isdigit() else None


def _rank_or_raw(row: dict) -> dict:
    """The ranking fields, or the raw text where they are not a JSON object."""
    try:
        rank = _rank(row)
    except orjson.JSONDecodeError:
        rank = None
    return rank if isinstance(rank, dict) else {"unparsed": row.get("rank")}


def reason(row: dict, policy: str) -> str:
    """Why the policy took this victim, in a few words (``describe_eviction`` is the
    paragraph)."""
    rank = _rank_or_raw(row)
    parts = []
    if row.get("responsible"):
        s = f"{row['responsible']} most in debt (P={row['responsible_p_before']}"
        if row.get("runner_up"):
            s += f"; runner-up {row['runner_up']} P={row['runner_up_p']}"
        parts.append(s + ")")
    elif "global_fallback" in rank:
        parts.append("no group in debt")
    if "segment" in rank:
        parts.append(f"segment {rank['segment']}, freed_seq {rank.get('freed_seq')}")
    elif "freed_t" in rank and policy == "lru":
        parts.append(f"least recently freed candidate (freed t={rank['freed_t']} s)")
    elif rank:
        parts.append(", ".join(f"{k}={orjson.dumps(v).decode()}" for k, v in sorted(rank.items())))
    if rank.get("ancestry_fallback"):
        parts.append("ancestry fallback")
    return "; ".join(parts)


def rule(row: dict, policy: str) -> str:
    """The rule behind an eviction without its per-row numbers, so that one line can
    stand for a whole batch of them."""
    rank = _rank_or_raw(row)
    if row.get("responsible") or "global_fallback" in rank:
        head = ("the most indebted group's blocks" if row.get("responsible")
                else "no group in debt, all groups' blocks")
        return head + (f", segments {SEGMENT_ORDER}" if "segment" in rank else "")
    if "freed_t" in rank and policy == "lru":
        return "least recently freed candidate first (vLLM's free queue)"
    return f"{policy}'s order ({', '.join(sorted(rank)) or 'no ranking fields'})"


def _classify(req: _Request, trace: _Trace, copies: dict, lost: dict) -> list[dict]:
    """Each of ``req``'s blocks as the pool held it just before its lookup."""
    out = []
    ns = (req.group, req.scope)
    for pos, hid in enumerate(req.blocks):
        k = (ns, hid)
        b = {"pos": pos, "hash": trace.name(hid), "resident": copies.get(k, 0) > 0,
             "eviction": None}
        if not b["resident"] and k in lost:
            b["eviction"] = lost[k]
        out.append(b)
    return out


def _walk(directory: Path, receipt: dict, run: str, trace: _Trace, request: str | None,
          target: int | None) -> dict:
    """One pass over a run: the blame of ``request``, or the history of the content
    ``target`` (an interned trace hash) in every namespace that held it."""
    policy = receipt["config"][run]["name"]
    where = str(directory / _ledger_config(receipt)["file"])
    copies: dict[tuple[tuple[str, str], int], int] = {}
    lost: dict[tuple[tuple[str, str], int], dict] = {}
    mismatches: list[int] = []
    snapshot = None
    own: list[dict] = []
    admit = None
    history: dict[tuple[str, str], list[dict]] = {}
    cached_upto: dict[str, int] = {}
    reqs = trace.requests
    # the contents whose last eviction the answer names: the request's own blocks
    wanted = ({((reqs[request].group, reqs[request].scope), h) for h in reqs[request].blocks}
              if request is not None else set())
    for line, row in _run_rows(directory, receipt, run, trace, request):
        kind = row["kind"]
        mine = request is not None and row["request"] == request
        if mine and snapshot is None:
            snapshot = _classify(reqs[request], trace, copies, lost)
        if kind == "evict":
            if mine:
                row = _full(row)
                own.append(row)
            hid = trace.hid(row["hash"])
            if hid is None:                 # content the trace never named (output blocks)
                continue
            ns = (row["owner"], row.get("scope") or trace.scope_of.get(row["owner"], ""))
            k = (ns, hid)
            n = copies.get(k, 0) - 1
            if n > 0:
                copies[k] = n
            else:                           # no copy left: nothing kept for it
                copies.pop(k, None)
            keep = n <= 0 and k in wanted
            ev = _eviction(_full(row), policy) if keep or hid == target else None
            if keep:                        # only the contents the answer reads
                lost[k] = ev
            if hid == target:
                history.setdefault(ns, []).append(
                    {"kind": "evicted", **ev, "copies_left": max(n, 0)})
        elif kind == "admit":
            r = reqs.get(row["request"])
            if r is None:
                raise InputError(f"request '{row['request']}' is not in the trace "
                                 f"{trace.path}", path=where, line=line, field="request")
            hits = int(row["hits"])
            ns = (r.group, r.scope)
            # A request's first row is its lookup, and so is a row marked ``resumed`` (a
            # preempted request scheduled again). The step scheduler writes one row per
            # allocation batch (prompt chunks, decode blocks, a resumed request's new
            # lookup): each caches its ``new_blocks`` next blocks, from its hits on.
            resumed = r.id in cached_upto and (
                '"resumed"' in (row.get("rank") or "")
                and _rank_or_raw(row).get("resumed") is True)
            first = r.id not in cached_upto or resumed
            if first or hits:
                cached_upto[r.id] = hits
            if first:
                # A resumed request has sampled tokens: its lookup may pass its trace
                # blocks and answer into its own output blocks, which the trace does not
                # name.
                expect = 0
                for hid in (r.chain if resumed else r.blocks[:trace.max_hits(r)]):
                    if copies.get((ns, hid), 0) <= 0:
                        break
                    expect += 1
                if not (expect == hits or (resumed and expect == len(r.chain) < hits)):
                    mismatches.append(int(row["seq"]))
            start = cached_upto[r.id]
            end = start + int(row["new_blocks"] or 0)
            cached_upto[r.id] = end
            for pos in range(start, min(end, len(r.chain))):
                k = (ns, r.chain[pos])
                copies[k] = copies.get(k, 0) + 1
            pos = r.blocks.index(target) if target is not None and target in r.blocks else -1
            if pos >= 0 and (pos < hits or start <= pos < end):
                history.setdefault(ns, []).append(
                    {"kind": "hit" if pos < hits else "cached", "decision": int(row["seq"]),
                     "t": row["t"], "request": r.id, "group": r.group, "pos": pos,
                     "copies": copies.get((ns, target), 0)})
            if mine:
                admit = _full(row)
                break
    return {"policy": policy, "snapshot": snapshot, "own": own, "admit": admit,
            "mismatches": mismatches, "history": history}


def _span(values: list[int]) -> str:
    """1, 2, 3, 7 -> '1-3, 7'."""
    out = []
    for v in sorted(values):
        if out and out[-1][1] == v - 1:
            out[-1][1] = v
        else:
            out.append([v, v])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in out)


def _blame_run(w: dict, req: _Request, trace: _Trace) -> dict:
    """A run's answer for one request: its hits, and for each miss why."""
    admit = w["admit"]
    if admit is None or w["snapshot"] is None:
        return {"policy": w["policy"], "admitted": False}
    hits = int(admit["hits"])
    max_hits = trace.max_hits(req)
    blocks = []
    for b in w["snapshot"]:
        pos = b["pos"]
        if pos < hits:
            status, why = "hit", None
        elif b["resident"]:
            status = "resident_not_hit"
            why = (f"after the first miss (block {hits})" if hits < max_hits and pos > hits
                   else "a fully cached prompt's last block is recomputed" if pos >= max_hits
                   else "resident at the lookup, yet not hit")
        elif b["eviction"] is not None:
            status, why = "evicted", None
        else:
            status, why = "never_cached", "no earlier admission computed this content"
        answer_of = (trace.answer_of.get(req.blocks[pos]) if pos < len(req.blocks)
                     else None)
        blocks.append({"pos": pos, "hash": b["hash"], "status": status,
                       **({"why": why} if why else {}),
                       **({"answer_of": answer_of} if answer_of else {}),
                       **({"eviction": b["eviction"]} if status == "evicted" else {})})
    missed = [b for b in blocks if b["status"] != "hit"]
    by_group: dict[str, list[dict]] = {}
    for b in missed:
        if b["status"] == "evicted":
            by_group.setdefault(b["eviction"]["group"], []).append(b["eviction"])
    blame = []
    for g, evs in sorted(by_group.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        evs = sorted(evs, key=lambda e: e["decision"])
        order: list[str] = []
        for e in evs:
            if e["request"] not in order:
                order.append(e["request"])
        blame.append({"group": g, "blocks": len(evs), "requests": order,
                      "decisions": [e["decision"] for e in evs],
                      "first_t": evs[0]["t"], "last_t": evs[-1]["t"]})
    own = w["own"]
    mine = {trace.name(h) for h in req.blocks}   # own contents: same group, same hash
    by_owner: dict[str, int] = {}
    rules: list[str] = []
    for r in own:
        by_owner[r["owner"]] = by_owner.get(r["owner"], 0) + 1
        why = rule(r, w["policy"])
        if why not in rules:
            rules.append(why)
    return {
        "policy": w["policy"], "admitted": True, "decision": int(admit["seq"]),
        "t": admit["t"], "hits": hits, "missed": len(missed),
        "evicted": sum(b["status"] == "evicted" for b in blocks),
        "never_cached": sum(b["status"] == "never_cached" for b in blocks),
        "resident_not_hit": sum(b["status"] == "resident_not_hit" for b in blocks),
        "blame": blame, "blocks": blocks,
        "own_evictions": {
            "count": len(own), "decisions": [int(r["seq"]) for r in own],
            "by_owner": dict(sorted(by_owner.items())), "rules": rules,
            "own_contents": sum(r["owner"] == req.group and r["hash"] in mine
                                and r.get("scope") in (None, req.scope) for r in own)},
        "ledger_consistent": not w["mismatches"],
        **({"mismatched_admissions": w["mismatches"][:20]} if w["mismatches"] else {}),
    }


def explain_request(directory: str | Path, request: str, trace: str | None = None) -> dict:
    """Why ``request`` missed what it missed, in both runs: for each missed block the
    eviction that dropped its content last before the lookup, summed per evicting group."""
    directory = Path(directory)
    receipt = _load_intact(directory)
    tr = _Trace(receipt, trace)
    req = tr.requests.get(request)
    if req is None:
        raise InputError(f"no request '{request}' in the trace {tr.path}", path="--request")
    runs = {run: _blame_run(_walk(directory, receipt, run, tr, request, None), req, tr)
            for run in RUNS}
    for run, p in _preemptions(directory, receipt, tr, request).items():
        runs[run]["preempted"] = p
    return {"request": req.id, "group": req.group, "contract": req.contract,
            "arrival_t": fmt_t(req.t_ns), "prompt_tokens": req.prompt_tokens,
            "full_blocks": len(req.blocks), "trace": str(tr.path), "runs": runs}


def explain_block(directory: str | Path, block: str, trace: str | None = None) -> dict:
    """One content's life in both runs: who cached it, who hit it, who evicted it."""
    directory = Path(directory)
    receipt = _load_intact(directory)
    tr = _Trace(receipt, trace)
    want = block.strip().lower()
    hid = tr.hid(want)
    if hid is None:
        found = [n for n in tr.hashes.names if n.startswith(want)] if len(want) >= 6 else []
        if len(found) != 1:
            what = (f"{len(found)} trace hashes start with '{block}'; give more digits"
                    if found else f"no block with trace hash '{block}' in the trace "
                    f"(a hash from the ledger's hash column, or its first digits)")
            raise InputError(what, path="--block")
        hid = tr.hid(found[0])
    runs = {}
    for run in RUNS:
        w = _walk(directory, receipt, run, tr, None, hid)
        groups = {}
        for (g, scope), evs in sorted(w["history"].items()):
            label = g if g in tr.scope_of else f"{g} (scope {scope})"
            groups[label] = {"group": g, "scope": scope,
                             "cached": sum(e["kind"] == "cached" for e in evs),
                         "hits": sum(e["kind"] == "hit" for e in evs),
                         "evicted": sum(e["kind"] == "evicted" for e in evs),
                         "events": evs}
        runs[run] = {"policy": w["policy"], "groups": groups,
                     "ledger_consistent": not w["mismatches"]}
    users = sorted({r.group for r in tr.requests.values() if hid in r.blocks})
    return {"hash": tr.name(hid), "trace": str(tr.path), "groups": users, "runs": runs}


# -- rendering: one screen of text (names from the trace printed as they are, escaped) ------

def _short_t(t: str) -> str:
    return t[:-6] if len(t) > 6 and "." in t else t


def _who(requests: list[str]) -> str:
    names = [printable(r) for r in requests]
    if len(names) <= 3:
        return ", ".join(names)
    return f"{names[0]} .. {names[-1]} ({len(names)} requests)"


def _wrap(text: str, width: int = 100) -> list[str]:
    """A prose line folded to ``width``, continuation lines indented under it."""
    indent = " " * (len(text) - len(text.lstrip()) + 4)
    return textwrap.wrap(text, width, subsequent_indent=indent, break_long_words=False,
                         break_on_hyphens=False) or [text]


def _range(a, b) -> str:
    return str(a) if a == b else f"{a}-{b}"


def _clip(text: str, width: int = 56) -> str:
    return text if len(text) <= width else text[:width - 3] + "..."


def _times(n: int) -> str:
    return "once" if n == 1 else f"{n} times"


def _columns(rows: list[list[str]], indent: str = "") -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [indent + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]


def render_request(res: dict, first: str = "candidate", limit: int = 12) -> list[str]:
    """The answer for one request: both runs side by side, then each run's blame."""
    runs = res["runs"]
    order = [first] + [r for r in RUNS if r != first]
    lines = _wrap(f"request {printable(res['request'])} (group {printable(res['group'])}, "
                  f"contract {printable(res['contract'])}) arrived "
                  f"t={_short_t(res['arrival_t'])} s with "
                  f"{res['full_blocks']} full prompt blocks ({res['prompt_tokens']} tokens)")
    head = [""] + [f"{r} ({printable(runs[r]['policy'])})" for r in order]
    table = [head]

    def cell(run: str, key: str) -> str:
        x = runs[run]
        if not x["admitted"]:
            return "never admitted" if key == "decision" else "-"
        if key == "decision":
            return f"decision {x['decision']}, t={_short_t(x['t'])}"
        if key == "own":
            return str(x["own_evictions"]["count"])
        return str(x[key])

    for label, key in (("looked up at", "decision"), ("hit", "hits"), ("missed", "missed"),
                       ("  evicted earlier", "evicted"), ("  never cached", "never_cached"),
                       ("  resident, not hit", "resident_not_hit"),
                       ("its own admission evicted", "own")):
        table.append([label] + [cell(r, key) for r in order])
    if any(runs[r].get("preempted", {}).get("preemptions") for r in order):
        table.append(["preempted (tokens again)"] + [
            f"{p['preemptions']} ({p['recompute_tokens']})" if (p := runs[r].get("preempted"))
            else "-" for r in order])
    lines += _columns(table)
    for run in order:
        lines.append("")
        lines += _render_run(res, run, limit)
    return lines


def _render_run(res: dict, run: str, limit: int) -> list[str]:
    x = res["runs"][run]
    name = f"{run} ({printable(x['policy'])})"
    if not x["admitted"]:
        return [f"{name}: the request was never admitted (rejected, or cancelled while "
                f"waiting), so it never looked anything up"]
    out = [f"{name}: {x['hits']} of {res['full_blocks']} blocks hit, {x['missed']} missed"]
    p = x.get("preempted") or {}
    if p.get("preemptions"):
        events = "; ".join(
            f"t={_short_t(e['t'])} s, when "
            + ("it could not get blocks for its own next tokens" if e["by"] == res["request"]
               else f"request {printable(e['by'])} ({printable(e['by_group'])}) could not get "
                    f"blocks for its next tokens")
            + f" and it was the last running request, losing {e['lost_tokens']} computed tokens"
            for e in p.get("events", []))
        out += _wrap(f"  preempted {p['preemptions']} time{'s' if p['preemptions'] > 1 else ''}"
                     f"{': ' + events if events else ''}; it computed "
                     f"{p['recompute_tokens']} tokens again after resuming")
    for b in x["blame"]:
        ds = b["decisions"]
        t0, t1 = _short_t(b["first_t"]), _short_t(b["last_t"])
        out += _wrap(f"  {b['blocks']} of {x['missed']} missed blocks were evicted by "
                   f"{printable(b['group'])}'s request{'s' if len(b['requests']) > 1 else ''} "
                   f"{_who(b['requests'])} (decision{'s' if len(ds) > 1 else ''} "
                   f"{_range(ds[0], ds[-1])}, t={_range(t0, t1)} s)")
    by_answer: dict[str, list[int]] = {}
    for b in x["blocks"]:
        if b["status"] == "hit" and "answer_of" in b:
            by_answer.setdefault(b["answer_of"], []).append(b["pos"])
    for rid, pos in by_answer.items():
        out += _wrap(f"  {len(pos)} hit the answer of request {printable(rid)} (the blocks the "
                     f"server cached while decoding it; block{'s' if len(pos) > 1 else ''} "
                     f"{_span(pos)})")
    for status, text in (("never_cached", "never cached"),
                         ("resident_not_hit", "resident but not hit")):
        sel = [b for b in x["blocks"] if b["status"] == status]
        if sel:
            whys = sorted({b["why"] for b in sel})
            out += _wrap(f"  {len(sel)} {'was' if len(sel) == 1 else 'were'} {text} "
                       f"(block{'s' if len(sel) > 1 else ''} {_span([b['pos'] for b in sel])}: "
                       f"{'; '.join(whys)})")
    groups: list[list[dict]] = []
    for b in x["blocks"]:
        if b["status"] != "evicted":
            continue
        e = b["eviction"]
        last = groups[-1][-1] if groups else None
        if (last is not None and last["pos"] == b["pos"] - 1
                and last["eviction"]["request"] == e["request"]):
            groups[-1].append(b)
        else:
            groups.append([b])
    if groups:
        rows = [["blocks", "decisions", "t (s)", "evicted by (group)", "queue pos/of", "why"]]
        for grp in groups[:limit]:
            e = grp[0]["eviction"]
            rows.append([_span([b["pos"] for b in grp]),
                         _span([b["eviction"]["decision"] for b in grp]), _short_t(e["t"]),
                         f"{printable(e['request'])} ({printable(e['group'])})",
                         f"{printable(e['queue'])} {e['position']}/{e['num_candidates']}",
                         _clip(printable(e["reason"]) + ("" if len({b["eviction"]["reason"]
                                                                for b in grp}) == 1
                                                           else " (first)"))])
        out += _columns(rows, "  ")
        if len(groups) > limit:
            out.append(f"  ... {len(groups) - limit} more rows (--json lists every block)")
    own = x["own_evictions"]
    if own["count"]:
        ds = own["decisions"]
        owners = ", ".join(f"{printable(g)} {n}" for g, n in own["by_owner"].items())
        mine = (f"; {own['own_contents']} held this request's own contents, recomputed"
                if own["own_contents"] else "")
        out += _wrap(f"  its own admission (decision {x['decision']}) evicted {own['count']} "
                   f"blocks to make room (decisions {ds[0]}-{ds[-1]}; owners: {owners}{mine}; "
                   f"{'; '.join(printable(r) for r in own['rules'])})")
    if not x["ledger_consistent"]:
        out += _wrap(f"  note: the ledger's hit counts differ from the reconstruction at "
                   f"decisions {', '.join(map(str, x['mismatched_admissions']))}; the "
                   f"blame above may be off there")
    return out


def render_block(res: dict, first: str = "candidate", limit: int = 12) -> list[str]:
    """One content's history, run by run, consecutive hits folded into one line."""
    lines = [f"trace hash {res['hash']} (in prompts of "
             f"{', '.join(printable(g) for g in res['groups']) or 'no group'})"]
    for run in [first] + [r for r in RUNS if r != first]:
        x = res["runs"][run]
        name = f"{run} ({printable(x['policy'])})"
        if not x["groups"]:
            lines.append(f"{name}: never cached")
            continue
        for g, h in x["groups"].items():
            lines.append(f"{name}, group {printable(g)}: cached {_times(h['cached'])}, hit "
                         f"{_times(h['hits'])}, evicted {_times(h['evicted'])}")
            items: list[str] = []
            evs = h["events"]
            i = 0
            while i < len(evs):
                e = evs[i]
                if e["kind"] == "hit":
                    j = i
                    while j + 1 < len(evs) and evs[j + 1]["kind"] == "hit":
                        j += 1
                    run_ = evs[i:j + 1]
                    ds = [h_["decision"] for h_ in run_]
                    t0, t1 = _short_t(run_[0]["t"]), _short_t(run_[-1]["t"])
                    items.append(f"  decision{'s' if len(ds) > 1 else ''} "
                                 f"{_range(ds[0], ds[-1])}  t={_range(t0, t1)}  hit "
                                 f"{_times(len(ds))} by {_who([h_['request'] for h_ in run_])}")
                    i = j + 1
                    continue
                if e["kind"] == "cached":
                    items.append(f"  decision {e['decision']}  t={_short_t(e['t'])}  cached "
                                 f"by {printable(e['request'])} (block {e['pos']} of its prompt; "
                                 f"{e['copies']} cop{'y' if e['copies'] == 1 else 'ies'} now)")
                else:
                    items.append(f"  decision {e['decision']}  t={_short_t(e['t'])}  evicted "
                                 f"by {printable(e['request'])} ({printable(e['group'])}), queue "
                                 f"{printable(e['queue'])} position {e['position']}/"
                                 f"{e['num_candidates']}: {printable(e['reason'])}"
                                 + ("; content lost" if e["copies_left"] == 0 else
                                    f"; {e['copies_left']} copies left"))
                i += 1
            if len(items) > limit:
                items = items[:limit // 2] + [f"  ... {len(items) - limit + limit // 2} "
                                              f"more (--json has all)"] + items[-(limit // 2):]
            lines += items
    return lines
