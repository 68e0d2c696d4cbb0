"""Shared test helpers: replay a trace in-process and collect what happened."""

from __future__ import annotations

from pathlib import Path

from psgate.engines.sim import NullRecorder, SimEngine
from psgate.policies import make_policy
from psgate.trace.reader import HashTable, TraceReader, TraceSource, validate_trace

DATA = Path(__file__).parent / "data"
CONTRACTS = ("critical", "standard", "best-effort")


class EventLog(NullRecorder):
    """Records evictions (namespace label + trace hash) and admissions."""

    hits = False

    def __init__(self) -> None:
        self.evictions: list[str] = []
        self.victims: list[int] = []
        self.decisions = []
        self.admissions: list[tuple[str, int, int, int]] = []

    def eviction(self, now_ns, req, decision, block, hash_name, owner) -> None:
        self.evictions.append(f"{owner}:{hash_name}")
        self.victims.append(block)
        self.decisions.append(decision)

    def admission(self, now_ns, req, hits, allocated, new_blocks, note) -> None:
        self.admissions.append((req.id, hits, allocated, new_blocks))


def replay_file(path: Path | str, capacity: int, policy: str = "lru", paranoid: bool = False,
                params: dict | None = None, cost=None):
    """Replay with sim; returns (RunResult, EventLog, engine)."""
    path = str(path)
    hashes = HashTable()
    header, summary = validate_trace(path, hashes)
    log = EventLog()
    pol = make_policy(policy, params)
    if pol.needs_future:
        from psgate.trace.future import future_uses
        pol.set_future(future_uses(TraceSource(path, Path(path)), hashes))
    engine = SimEngine(header=header, hashes=hashes, capacity=capacity,
                       policy=pol, contracts=CONTRACTS,
                       done_ids=summary.done_ids, recorder=log, paranoid=paranoid, cost=cost,
                       trace_path=path, groups=summary.groups)
    log.block_ids = {}
    admit = engine._try_admit

    def spy(r):
        status = admit(r)
        if status == "ok":
            log.block_ids[r.ev.id] = list(r.blocks)
        return status

    engine._try_admit = spy
    with TraceReader(TraceSource(path, Path(path)), hashes) as reader:
        result = engine.run(reader.events())
    return result, log, engine
