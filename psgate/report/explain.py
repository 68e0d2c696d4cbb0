"""explain: one ledger decision in words, and the full candidate set behind it.

A ledger row is complete enough to explain a decision on its own; with
``--candidates`` the run is replayed up to that row (stopping before the engine
mutates anything) and the policy's whole candidate order at that moment is
listed, so the alternatives can be seen, not just counted.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import orjson

from psgate.engines.sim import NullRecorder
from psgate.errors import InputError
from psgate.receipt.ledger import open_text
from psgate.report.receipts import load_receipt, prepare_replay, replay_run

SEGMENT_ORDER = "Probationary, then Normal, then Reuse"


def read_rows(directory: Path, run: str, name: str = "ledger.csv") -> list[dict]:
    p = directory / name
    try:
        with open_text(p) as fh:
            return [r for r in csv.DictReader(fh) if r["run"] == run]
    except FileNotFoundError:
        raise InputError(f"no {name} here", path=str(directory)) from None


def _rank(row: dict) -> dict:
    return orjson.loads(row["rank"]) if row["rank"] else {}


def describe_eviction(row: dict, policy: str) -> list[str]:
    rank = _rank(row)
    out = [f"decision {row['seq']} ({row['run']} run, policy {policy}) at t={row['t']} s: "
           f"admitting request {row['request']} of group {row['group']} "
           f"(contract {row['contract']}) needed a block beyond the truly free ones.",
           f"Victim: block {row['block']} (trace hash {row['hash'][:16]}..., owned by "
           f"{row['owner']}), taken from queue '{row['queue']}' at position {row['position']}, "
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
            cands = [(b, names[eng.key[b] & 0xFFFFFFFF], eng.group_names[eng.owner[b]])
                     for b in eng.policy.candidates()]
            raise _Stop(cands)


def candidates_at(receipt: dict, run: str, seq: int, trace: str | None = None
                  ) -> list[tuple[int, str, str]]:
    """Replay ``run`` up to ledger row ``seq`` and return the policy's candidates then."""
    prepared = prepare_replay(receipt, trace)
    try:
        replay_run(receipt, prepared, run, _StopAt(seq, prepared[0].ledger_hits))
    except _Stop as stop:
        return stop.candidates
    raise InputError(f"the replay never reached decision {seq} of the {run} run")


def explain(directory: str | Path, run: str = "candidate", decision: int | None = None,
            request: str | None = None, block: int | None = None,
            candidates: bool = False, trace: str | None = None, limit: int = 20) -> list[str]:
    directory = Path(directory)
    receipt = load_receipt(directory)
    if run not in ("baseline", "candidate"):
        raise InputError(f"expected baseline or candidate, found '{run}'", path="--run")
    policy = receipt["config"][run]["name"]
    ledger = receipt["config"].get("ledger", {"rows": "all", "file": "ledger.csv"})
    rows = read_rows(directory, run, ledger["file"])
    if request is not None and ledger["rows"] == "evictions":
        raise InputError("this ledger holds evictions only (--ledger-rows evictions): "
                         "replay with the full ledger to explain a request", path="--request")
    if decision is not None:
        sel = [r for r in rows if int(r["seq"]) == decision]
        if not sel:
            raise InputError(f"the {run} run has no ledger row {decision} (it has "
                             f"{len(rows)})", path="--decision")
    elif request is not None:
        sel = [r for r in rows if r["request"] == request]
        if not sel:
            raise InputError(f"no ledger row for request '{request}' in the {run} run",
                             path="--request")
    elif block is not None:
        sel = [r for r in rows if r["block"] == str(block)]
        if not sel:
            raise InputError(f"block {block} was never evicted in the {run} run",
                             path="--block")
    else:
        raise InputError("name a --decision, --request or --block", path="explain")
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
