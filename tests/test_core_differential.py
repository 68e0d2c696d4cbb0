"""The compiled core against the Python engine: byte-identical receipts and ledgers.

Every registered policy, both schedulers, on generated workloads, the bundled example,
hypothesis-random traces and the repository's Mooncake sample (a real trace), each
replayed twice in this process: with the compiled loops (psgate.core) and with
``PSGATE_CORE=0``. Everything a replay writes must be the same bytes, but the
receipt's environment section, which names the code that ran. The loops' own edge cases
(a row field that needs quotes, a float the fast JSON path must not take) are held to
their Python forms row by row (the rows' own text is tests/receipt/test_row_text.py's).
"""

from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import (chat_traces, close_ranks, csv_texts, decisions, random_traces,
                     replay_outputs, write, write_lines)
from psgate import api, core
from psgate.contracts import CONTRACT_NAMES
from psgate.policies import policy_names, register, unregister
from psgate.policy.base import Decision
from psgate.policies.lru import LRUDecision, LRUPolicy
from psgate.receipt.compact import open_compact
from psgate.receipt.ledger import LedgerWriter
from psgate.workloads import generate

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "example.jsonl"


def _compiled():
    os.environ.pop("PSGATE_CORE", None)
    mod = core.get()
    if mod is None:
        # CI builds the core with the README's install; anywhere else a missing compiler
        # or Cython is a reason to skip, given here.
        if os.environ.get("CI"):
            pytest.fail("psgate._core is not built: pip install -e . must build it here")
        pytest.skip("psgate._core is not built here (no C compiler or Cython at install)")
    return mod


@pytest.fixture(autouse=True)
def _core_state(monkeypatch):
    monkeypatch.delenv("PSGATE_CORE", raising=False)
    yield


def builtin_policies() -> list[str]:
    return [p for p in policy_names() if not p.startswith("test-")]


def _replay_both(monkeypatch, tmp_path: Path, trace: Path, capacity: int, baseline: str,
                 candidate: str, **kw) -> dict[str, bytes]:
    """Both replays' outputs, checked equal; returns the compiled one's."""
    got = {}
    for code in ("compiled", "python"):
        if code == "python":
            monkeypatch.setenv("PSGATE_CORE", "0")
        else:
            monkeypatch.delenv("PSGATE_CORE", raising=False)
        out = tmp_path / f"out-{code}"
        cfg = api.ReplayConfig(trace=str(trace), baseline=baseline, candidate=candidate,
                               capacity=capacity, out=out, force=True,
                               contracts=CONTRACT_NAMES, **kw)
        try:
            api.replay(cfg)
        except Exception as exc:        # the same error from both is the same result
            got[code] = {"error": repr(exc).encode()}
            continue
        got[code] = replay_outputs(out)
    compiled, python = got["compiled"], got["python"]
    if "receipt.json" in compiled:
        assert json.loads(compiled["receipt.json"])["replay_code"] == "compiled"
        assert json.loads(python["receipt.json"])["replay_code"] == "python"
        for files in (compiled, python):
            r = json.loads(files["receipt.json"])
            del r["replay_code"]
            files["receipt.json"] = json.dumps(r, sort_keys=True).encode()
    assert sorted(compiled) == sorted(python)
    for name in compiled:
        assert compiled[name] == python[name], f"{trace.name}: {name} differs"
    return compiled


def _workload(tmp_path: Path, kind: str, **params) -> Path:
    lines = generate(kind, params)
    p = tmp_path / f"{kind}.jsonl"
    p.write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in lines))
    return p


# (kind, its parameters, configured blocks): tight enough that every policy evicts
WORKLOADS = [
    ("one-touch", {"attack_requests": 60}, 384),
    ("fanout", {"duration_s": 20.0}, 512),
    ("sharegpt", {"conversations": 40}, 256),
    ("sharegpt", {"conversations": 40, "answers": True}, 256),     # follow-ups hit answers
    ("cancellation", {"duration_s": 20.0}, 256),
    ("random", {"requests": 80}, 12),
]


@pytest.mark.parametrize("policy", builtin_policies())
@pytest.mark.parametrize("scheduler", ["step", "service"])
def test_every_policy_gives_the_same_bytes_compiled_and_in_python(monkeypatch, tmp_path,
                                                                 policy, scheduler):
    _compiled()
    for kind, params, cap in WORKLOADS:
        trace = _workload(tmp_path, kind, **params)
        files = _replay_both(monkeypatch, tmp_path, trace, cap, "lru", policy,
                             scheduler=scheduler)
        if "receipt.json" in files:
            assert files["ledger.csv"].count(b",evict,") > 0, (kind, "no eviction to compare")


@pytest.mark.parametrize("capacity", [80, 192, 8192])
def test_the_bundled_example_with_hits_and_every_ledger_form(monkeypatch, tmp_path, capacity):
    _compiled()
    for compression in ("none", "compact"):
        files = _replay_both(monkeypatch, tmp_path, EXAMPLE, capacity, "lru", "prefixshield",
                             ledger_hits=True, ledger_compression=compression)
        assert "receipt.json" in files


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(lines=random_traces([["a1", "a2", "a3", "a4"], ["b1", "b2"], ["c1", "c2", "c3"]],
                           groups=("g", "h", "g2"), max_requests=30, cancel_one_in=8,
                           max_out=9),
       capacity=st.integers(2, 16), policy=st.sampled_from(["lru", "prefixshield",
                                                          "prefixshield-b", "s3fifo"]),
       scheduler=st.sampled_from(["step", "service"]))
def test_random_traces_give_the_same_bytes(monkeypatch, tmp_path, lines, capacity, policy,
                                          scheduler):
    _compiled()
    trace = write_lines(tmp_path, lines)
    _replay_both(monkeypatch, tmp_path, trace, capacity, "lru", policy, scheduler=scheduler)


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(lines=chat_traces(cancel_one_in=9), capacity=st.integers(6, 24),
       policy=st.sampled_from(["lru", "prefixshield", "prefixshield-b", "s3fifo"]))
def test_chat_with_answers_gives_the_same_bytes(monkeypatch, tmp_path, lines, capacity,
                                                policy):
    _compiled()
    trace = write_lines(tmp_path, lines)
    _replay_both(monkeypatch, tmp_path, trace, capacity, "lru", policy, scheduler="step",
                 ledger_hits=True, allow_unexercised=True)


def test_a_real_trace_gives_the_same_bytes(monkeypatch, tmp_path):
    """The Mooncake sample in the repository (its first 400 conversation requests)."""
    from psgate.trace.importers import import_trace
    _compiled()
    src = ROOT / "examples" / "traces" / "mooncake_conversation_6000.jsonl"
    trace = tmp_path / "mooncake.jsonl"
    lines = import_trace("mooncake", src, limit=400)
    trace.write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in lines))
    for policy in ("lru", "prefixshield", "prefixshield-b", "s3fifo"):
        files = _replay_both(monkeypatch, tmp_path, trace, 2048, "lru", policy)
        assert files["ledger.csv"].count(b",evict,") > 0


def _engine_state(loaded, policy: str, capacity: int, scheduler: str,
                  trace: Path | None = None) -> dict:
    """One replay with no recorder (the policies' batch paths that build no decisions):
    its result, the pool's final arrays, the policy's candidates and counters. A
    clairvoyant policy gets the trace's future, as a replay gives it."""
    from dataclasses import asdict

    from psgate.bench.traces import make_engine
    from psgate.policies import make_policy
    from psgate.trace.future import future_uses
    from psgate.trace.reader import TraceSource
    pol = make_policy(policy)
    if pol.needs_future:         # (the callers without a trace name no such policy)
        pol.set_future(future_uses(TraceSource(str(trace), trace), loaded.hashes))
    engine = make_engine(loaded, pol, capacity, scheduler)
    result = engine.run(loaded.events)
    got = asdict(result)
    got["invariants"] = {k: (v.holds, v.violations) for k, v in result.invariants.items()}
    got["pool"] = (engine.key.tobytes(), engine.owner.tobytes(), bytes(engine.ref.tobytes()))
    got["candidates"] = pol.candidates()
    # the invariant checker's own counts (a key kept outside its flat tables, such as a
    # block of generated tokens, through its dict): a divergence here is a verdict
    # waiting to differ on a longer trace
    ck = engine.checker
    got["checker"] = (sorted(ck.res.items()), ck.res_ns.tobytes(), ck.res_cnt.tobytes(),
                      ck.num_orphans, ck.orphans_created, ck.num_candidates,
                      ck.num_resident, ck.key.tobytes(), ck.ref.tobytes())
    # what only speed depends on, held in C during a batch and written back after it
    got["policy"] = {k: getattr(pol, k) for k in ("num_cand", "free_seq", "glob_budget")
                     if hasattr(pol, k)}
    if hasattr(pol, "glob"):
        got["policy"]["fallback_queues_kept"] = pol.glob is not None
    return got


BENCH_SHAPES = [("reuse", False, 300, 1024), ("cold", True, 300, 1024)]


@pytest.mark.parametrize("policy", builtin_policies())
@pytest.mark.parametrize("scheduler", ["step", "service"])
def test_replays_without_a_ledger_end_in_the_same_state(monkeypatch, tmp_path, policy,
                                                        scheduler):
    """What the bench's hot loop runs: no recorder, so no decisions are built and a
    policy's compiled batch path (prefixshield's, lru's) decides alone."""
    from psgate.bench.traces import load, write_debt_trace, write_reuse_trace
    _compiled()
    traces = []
    for name, cold, n, cap in BENCH_SHAPES:
        p = tmp_path / f"{name}.jsonl"
        write_reuse_trace(p, n, 24, cap, cold=cold)
        traces.append((p, cap))
    p = tmp_path / "debt.jsonl"
    write_debt_trace(p, 1024, 8, 3.0, blocks=16)
    traces.append((p, 1024))
    for kind, params, cap in WORKLOADS:
        traces.append((_workload(tmp_path, kind, **params), cap))
    for trace, cap in traces:
        loaded = load(trace)
        monkeypatch.delenv("PSGATE_CORE", raising=False)
        compiled = _engine_state(loaded, policy, cap, scheduler, Path(trace))
        monkeypatch.setenv("PSGATE_CORE", "0")
        python = _engine_state(loaded, policy, cap, scheduler, Path(trace))
        assert compiled["evictions"] > 0 or python["evictions"] == 0
        for k in compiled:
            assert compiled[k] == python[k], f"{trace.name}: {k} differs"


class _RepeatInBatch(LRUPolicy):
    """Names its first victim again in place of its second (no longer a candidate)."""

    name = "test-core-repeat-in-batch"
    defaults = {}

    def evict_batch(self, req, now_ns, num_blocks, decisions):
        victims = super().evict_batch(req, now_ns, num_blocks, decisions)
        if len(victims) > 1:
            victims[1] = victims[0]
        return victims


class _ShortBatch(LRUPolicy):
    """Hands back one victim fewer than it was asked for."""

    name = "test-core-short-batch"
    defaults = {}

    def evict_batch(self, req, now_ns, num_blocks, decisions):
        victims = super().evict_batch(req, now_ns, num_blocks, decisions)
        return victims[:-1] if len(victims) > 1 else victims


class _LyingCount(LRUPolicy):
    """Counts one candidate more than it holds: every batch's accounting check fails."""

    name = "test-core-lying-count"
    defaults = {}

    @property
    def num_candidates(self):
        return self._q.sizes[0] + 1


@pytest.mark.parametrize("broken", [_RepeatInBatch, _ShortBatch, _LyingCount])
@pytest.mark.parametrize("scheduler", ["step", "service"])
def test_a_faulty_batch_without_a_ledger_aborts_as_in_python(monkeypatch, tmp_path, broken,
                                                            scheduler):
    """A policy's bad batch, with no recorder (the compiled allocation path checks and
    drops the victims itself): the same violation, the same abort message, and what
    was evicted before the fault counted the same; a wrong count, the same verdicts."""
    from psgate.bench.traces import load, write_reuse_trace
    _compiled()
    trace = tmp_path / "reuse.jsonl"
    write_reuse_trace(trace, 300, 24, 1024)
    register(broken)
    try:
        loaded = load(trace)
        compiled = _engine_state(loaded, broken.name, 1024, scheduler)
        monkeypatch.setenv("PSGATE_CORE", "0")
        python = _engine_state(loaded, broken.name, 1024, scheduler)
    finally:
        unregister(broken.name)
    if broken is _LyingCount:      # checked after each batch (the compiled check undone)
        assert python["invariants"]["capacity_and_accounting"][1] > 1
    else:
        assert python["aborted"] and ("not an eviction candidate" in python["aborted"]
                                      or "were asked for" in python["aborted"])
    for k in compiled:
        assert compiled[k] == python[k], f"{k} differs"


class _VictimLog:
    """A recorder that looks at each eviction as it happens (``sequential``), so the
    engine asks the policy one select_victim/on_evict at a time: prefixshield's Python
    ranking, relist and eviction methods then run against the state its compiled batch
    path holds (the heaps that rank the groups), interleaved with its compiled on_free
    and hits."""

    sequential = True

    def __init__(self):
        self.rows = []

    def eviction(self, now_ns, req, decision, block, hash_name, owner):
        self.rows.append((now_ns, block, owner, decision.responsible,
                          decision.responsible_p_before, decision.responsible_p_after,
                          decision.runner_up, decision.runner_up_p, decision.queue))

    def admission(self, now_ns, req, hits, allocated, new_blocks, note):
        self.rows.append((now_ns, "admit", json.dumps(note, sort_keys=True)))

    def hit(self, now_ns, req, pos, block, hash_name, owner):
        pass


@pytest.mark.parametrize("policy", ["prefixshield", "prefixshield-noseg",
                                    "prefixshield-nogate"])
def test_one_victim_at_a_time_decides_as_the_python_engine(monkeypatch, tmp_path, policy):
    from psgate.bench.traces import load, make_engine, write_debt_trace, write_reuse_trace
    from psgate.policies import make_policy
    _compiled()
    traces = []
    p = tmp_path / "debt.jsonl"
    write_debt_trace(p, 1024, 8, 3.0, blocks=16)
    traces.append((p, 1024))
    p = tmp_path / "reuse.jsonl"
    write_reuse_trace(p, 300, 24, 1024)
    traces.append((p, 1024))
    traces.append((_workload(tmp_path, "one-touch", attack_requests=60), 384))
    for trace, cap in traces:
        loaded = load(trace)
        logs = {}
        for mode in ("compiled", "python"):
            if mode == "python":
                monkeypatch.setenv("PSGATE_CORE", "0")
            pol = make_policy(policy)
            log = _VictimLog()
            engine = make_engine(loaded, pol, cap, recorder=log)
            assert not engine.batch_evictions
            assert (pol._view is not None) == (mode == "compiled")
            engine.run(loaded.events)
            logs[mode] = log.rows
            monkeypatch.delenv("PSGATE_CORE", raising=False)
        assert sum(1 for r in logs["python"] if r[1] != "admit") > 500, trace.name
        assert logs["compiled"] == logs["python"], trace.name


@pytest.mark.parametrize("policy", ["prefixshield", "prefixshield-noseg",
                                    "prefixshield-nogate", "prefixshield-b"])
def test_groups_tied_in_debt_give_the_same_bytes(monkeypatch, tmp_path, policy):
    """The bench's debt trace: groups round-robin with equal debts, so the responsible
    group is often one of several tied (the runner-up is then the second of them)."""
    from psgate.bench.traces import write_debt_trace
    _compiled()
    trace = tmp_path / "debt.jsonl"
    write_debt_trace(trace, 1024, 8, 3.0, blocks=16)
    files = _replay_both(monkeypatch, tmp_path, trace, 1024, "lru", policy)
    assert files["ledger.csv"].count(b",evict,") > 1000
    # four groups charged alike at the same instants, then a fifth that must evict: their
    # debts are equal to the bit, so victims alternate between tied groups
    events = []
    for r in range(3):
        t = r * 0.01
        events += [{"t": t, "id": f"r{r}g{g}", "group": f"g{g}", "contract": "best-effort",
                    "blocks": [f"{r:x}{g:x}{j:04x}" for j in range(220)], "done_t": t + 1e-4}
                   for g in range(4)]
        events.append({"t": t + 0.001, "id": f"x{r}", "group": "x", "done_t": t + 0.002,
                       "blocks": [f"ff{r:x}{j:04x}" for j in range(300)]})
    trace = write(tmp_path, events, name="tied.jsonl")
    files = _replay_both(monkeypatch, tmp_path, trace, 1000, "lru", policy)
    rows = [r for r in csv.DictReader(io.StringIO(files["ledger.csv"].decode()))
            if r["kind"] == "evict" and r["run"] == "candidate" and r["runner_up_p"]]
    assert sum(r["runner_up_p"] == r["responsible_p_before"] for r in rows) > 100


def test_the_kinetic_heaps_stay_as_large_as_the_groups(monkeypatch, tmp_path):
    """Every group is relisted in each batch, each relist leaving the group's older
    per-k heap entry stale: the heaps are compacted at 2 x groups + 32 entries instead of
    growing with the trace (uncompacted, one reaches 142 entries), and the compiled and
    Python replays still decide alike."""
    from psgate.bench.traces import INSTANT, load, make_engine, write_debt_trace
    from psgate.policies import make_policy
    _compiled()
    groups = 24
    trace = tmp_path / "debt.jsonl"
    write_debt_trace(trace, 2048, groups, 6.0, blocks=16)
    pol = make_policy("prefixshield")
    loaded = load(trace)
    make_engine(loaded, pol, 2048).run(loaded.events)
    bound = 2 * groups + 32
    sizes = pol.ranking.heap_sizes()
    assert pol.ranking.num_compactions >= 2
    assert sizes and all(n <= bound + 1 for n in sizes.values()), sizes
    files = _replay_both(monkeypatch, tmp_path, trace, 2048, "lru", "prefixshield",
                         scheduler="service", cost=INSTANT)
    assert files["ledger.csv"].count(b",evict,") > 3000


# -- the loops one by one --------------------------------------------------------------

@st.composite
def _repeating_decisions(draw):
    """Decisions whose segments and rank mostly repeat the keys (and many values) of the
    one before, as a policy's rows do."""
    return Decision(victim=draw(st.integers(0, 3)), num_candidates=draw(st.integers(0, 3)),
                    position=0, queue="g/normal", responsible=draw(st.sampled_from([None, "g"])),
                    responsible_p_before=draw(st.sampled_from([None, 2.5, 1.5])),
                    responsible_p_after=draw(st.sampled_from([None, 1.5, 0.5])),
                    segments=draw(st.sampled_from([None, {"normal": 1, "reuse": 0},
                                                   {"normal": 2, "reuse": 0}])),
                    rank=draw(close_ranks()))


class _Req:
    def __init__(self, rid: str, group: str = "g", contract: str = "standard") -> None:
        self.id, self.group, self.contract = rid, group, contract


@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(st.tuples(st.sampled_from(["batch", "batch", "one", "admit", "run"]),
                                st.lists(st.one_of(decisions(), _repeating_decisions()),
                                         max_size=5), csv_texts), max_size=8),
       data=st.data())
def test_compact_eviction_rows_are_the_python_ones(monkeypatch, tmp_path, steps, data):
    """The compact ledger coded from eviction batches' fields (the compiled coder's
    encode_evictions) against the Python writer coding the CSV rows: the same bytes,
    with admission rows, single evictions and run changes in between, and values the
    compiled JSON reader hands back to the text path (DEL, 19-digit integers, floats with
    an exponent, non-dict ranks)."""
    _compiled()
    plan = []
    for kind, ds, text in steps:
        n = len(ds)
        plan.append((kind, ds, text,
                     data.draw(st.lists(st.one_of(st.integers(1, 99), csv_texts), min_size=n,
                                        max_size=n)),
                     data.draw(st.lists(csv_texts, min_size=n, max_size=n)),
                     data.draw(st.lists(st.one_of(csv_texts, st.none()), min_size=n,
                                        max_size=n))))

    def write(w: LedgerWriter) -> None:
        w.start_run("baseline", "lru")
        for i, (kind, ds, text, blocks, names, owners) in enumerate(plan):
            req = _Req(f"r{i % 3}{text}", text or "g")
            if kind == "batch":
                w.eviction_batch(1_000_000 * (i // 2), req, ds, blocks, names, owners)
            elif kind == "one" and ds:
                w.eviction(1_000_000 * i, req, ds[0], blocks[0], names[0], owners[0])
            elif kind == "admit":
                w.admission(1_000_000 * i, req, len(ds), 2, 1, {"charged": len(text)})
            else:
                w.start_run("candidate" + text, "prefixshield")

    got = _compact_both_ways(monkeypatch, tmp_path, write)
    assert got["compiled"] == got["python"]


def _compact_both_ways(monkeypatch, tmp_path, write) -> dict:
    """The compact ledger ``write`` makes, with the compiled core and with the Python
    writer (PSGATE_CORE=0): its bytes, or the type of what it raised."""
    got = {}
    for code in ("compiled", "python"):
        if code == "python":
            monkeypatch.setenv("PSGATE_CORE", "0")
        path = tmp_path / f"{code}.compact.csv.gz"
        w = LedgerWriter(path, compression="compact")
        try:
            write(w)
            w.close()
            got[code] = path.read_bytes()
        except Exception as exc:       # orjson refusing a value: the same refusal
            got[code] = type(exc).__name__
    return got


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches=st.lists(st.lists(_repeating_decisions(), min_size=3, max_size=40),
                        min_size=1, max_size=3),
       blocks=st.lists(st.integers(0, 5), min_size=40, max_size=40))
def test_long_compact_eviction_batches_are_the_python_ones(monkeypatch, tmp_path, batches,
                                                           blocks):
    """Long batches of decisions that repeat most of the row before (as a policy's do):
    what the compiled coder carries from row to row inside a batch (integer values,
    number texts, each JSON column's keys and values) codes as the Python writer's rows."""
    _compiled()

    def write(w: LedgerWriter) -> None:
        w.start_run("candidate", "prefixshield")
        for i, ds in enumerate(batches):
            n = len(ds)
            w.eviction_batch(1_000_000 * i, _Req(f"r{i}"), ds, blocks[:n],
                             [f"h{b}" for b in blocks[:n]], ["g"] * n)

    got = _compact_both_ways(monkeypatch, tmp_path, write)
    assert got["compiled"] == got["python"]


_ps_name = st.sampled_from(["probationary", "normal", "reuse", "best-effort", 'a"b', "t\u00e9",
                            "x\x7f", "a\\b", "tab\tx", ""])
_ps_float = st.one_of(st.sampled_from([0.0, -0.0, 1e-7, 2.5e-5, 1e16, 1e300, 123.4567891234,
                                       794.179168, 793.179168, 2.5, 1.5]),
                      st.floats(allow_nan=True))


@st.composite
def _ps_decisions(draw):
    """prefixshield's compiled decisions (PSDecision), with runs of repeating fields as a
    batch of one group's victims has, and values its coder must hand to the Decision's
    path (a name that needs escaping or holds DEL, a debt with an exponent, a 19-digit
    seq)."""
    mod = _compiled()
    small = st.sampled_from([0, 1, 2])
    runner = draw(st.sampled_from([None, "g2", 'r"q']))
    return mod.PSDecision(
        Decision, draw(st.integers(0, 5)), draw(st.one_of(small, st.integers(0, 10**6))),
        draw(st.sampled_from(["g/normal", "g/reuse", 'q,"x'])),
        draw(st.sampled_from(["g", "", "g,2"])), draw(_ps_float), draw(_ps_float), runner,
        draw(_ps_float), (draw(small), draw(small), draw(small)),
        draw(st.one_of(st.just("probationary"), _ps_name)),
        draw(st.one_of(st.just("normal"), _ps_name)),
        draw(st.one_of(st.just("standard"), _ps_name)),
        draw(st.one_of(small, st.integers(0, 2**62), st.just(10**18 + 7))),
        draw(st.one_of(st.just((1.5, 0.75, 2.0)), st.just((0, 0, 1.0)),
                       st.tuples(_ps_float, _ps_float, st.just(1.0)),
                       st.tuples(st.integers(-2**70, 2**70), st.just(0.5), st.just(1.0)))))


@st.composite
def _lru_decisions(draw):
    """lru's decisions as their fields (LRUDecision), freed at times whose seconds have an
    exponent (the Decision's path), beyond 2**53 ns, or repeat down a batch."""
    return LRUDecision(
        draw(st.integers(0, 5)), draw(st.integers(0, 10**6)),
        draw(st.one_of(st.sampled_from([0, 10_000, 8_833_106_000, 8_833_106_000, -5,
                                         2**60 + 1, 123_456_789_123]),
                       st.integers(-2**63, 2**63 - 1))))


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches=st.lists(st.lists(st.one_of(_ps_decisions(), _ps_decisions(),
                                           _lru_decisions(), _lru_decisions(),
                                           _repeating_decisions(), decisions()),
                                 max_size=12), min_size=1, max_size=4),
       data=st.data())
def test_compiled_decisions_code_as_their_decisions(monkeypatch, tmp_path, batches, data):
    """The compact coder writes a PSDecision's or an LRUDecision's row from its fields
    (_ps_row, _lru_row): the same bytes as the Python writer coding the Decision it
    stands for, in batches mixed with other decisions (which share the JSON columns'
    state with it), and where a field sends the row by the Decision's attributes
    instead. Either is that Decision to any other reader."""
    _compiled()
    for ds in batches:
        for d in ds:
            if type(d) is not Decision:
                assert repr(d) == repr(d.decision())      # a NaN is equal to no copy
                assert d.decision().rank == d.rank and d.rank is d.rank
    plan = [(ds, data.draw(st.lists(st.integers(0, 9), min_size=len(ds), max_size=len(ds))))
            for ds in batches]

    def write(w: LedgerWriter) -> None:
        python = os.environ.get("PSGATE_CORE") == "0"
        w.start_run("candidate", "prefixshield")
        for i, (ds, blocks) in enumerate(plan):
            if python:
                ds = [d if type(d) is Decision else d.decision() for d in ds]
            w.eviction_batch(1_000_000 * (i // 2), _Req(f"r{i % 2}"), ds, blocks,
                             [f"h{b}" for b in blocks], ["g"] * len(ds))

    got = _compact_both_ways(monkeypatch, tmp_path, write)
    assert got["compiled"] == got["python"]


def test_compiled_decisions_are_their_decisions():
    """What reads a decision by its attributes (the CSV rows, explain's tests, a shadow
    engine) or compares it gets the Decision the compiled policy stands for."""
    mod = _compiled()
    ps = mod.PSDecision(Decision, 7, 12, "g/normal", "g", 2.5, 1.5, None, 0.0, (3, 1, 0),
                        "normal", "reuse", "standard", 41, (1.5, 0.75, 2.0))
    want = Decision(7, 12, 0, "g/normal", "g", 2.5, 1.5, None, None,
                    {"probationary": 3, "normal": 1, "reuse": 0},
                    {"segment": "normal", "class": "reuse", "freed_seq": 41,
                     "global_fallback": False, "owner_contract": "standard",
                     "owner_raw_debt": 1.5, "owner_norm_debt": 0.75})
    assert ps == want and want == ps and [ps] == [want] and ps.decision() == want
    assert list(ps.rank) == list(want.rank) and list(ps.segments) == list(want.segments)
    ps2 = mod.PSDecision(Decision, 7, 12, "g/normal", "g", 2.5, 1.5, "h", 0.5, (3, 1, 0),
                         "normal", "reuse", "standard", 41, (1.5, 0.75, 2.0))
    assert (ps2.runner_up, ps2.runner_up_p) == ("h", 0.5) and ps2 != want
    lru = LRUDecision(3, 9, 1_500_000_000)
    assert lru == Decision(3, 9, 0, "lru", rank={"freed_t": 1.5})
    assert lru != Decision(3, 9, 0, "lru", rank={"freed_t": 1.25})
    assert (lru.victim, lru.num_candidates, lru.position, lru.queue, lru.segments,
            lru.responsible) == (3, 9, 0, "lru", None, None)
    assert LRUDecision(3, 9, 2**60 + 1).rank == {"freed_t": (2**60 + 1) / 10**9}
    with pytest.raises(TypeError):
        hash(lru)


def test_a_compiled_decision_between_rows_of_the_same_numbers(monkeypatch, tmp_path):
    """A row coded from its fields leaves no number behind that it did not write: the
    rows before and after it carry the same p and runner-up p, which it leaves empty
    (lru's row, prefixshield's without a runner-up)."""
    mod = _compiled()
    same = Decision(1, 2, 0, "g/normal", "g", 2.5, 1.5, "h", 0.5)
    between = [LRUDecision(2, 3, 5_000_000_000),
               mod.PSDecision(Decision, 2, 3, "g/normal", "g", 2.5, 1.5, None, 0.0,
                              (1, 0, 0), "normal", "normal", "standard", 4, (1.0, 1.0, 1.0))]
    for d in between:
        _compiled()                     # the last pass left PSGATE_CORE=0

        def write(w: LedgerWriter) -> None:
            ds = [same, d, same]
            if os.environ.get("PSGATE_CORE") == "0":
                ds = [x if type(x) is Decision else x.decision() for x in ds]
            w.start_run("candidate", "prefixshield")
            w.eviction_batch(1_000_000, _Req("r"), ds, [1, 2, 3], ["a", "b", "c"], ["g"] * 3)

        got = _compact_both_ways(monkeypatch, tmp_path, write)
        assert got["compiled"] == got["python"]


def test_compact_eviction_rows_code_from_fields(monkeypatch, tmp_path):
    """A replay's compact ledger goes through encode_evictions (not the CSV rows) where
    the core is built, and decodes to the CSV the plain writer writes."""
    mod = _compiled()
    calls = []
    real = mod.CompactCoder.encode_evictions

    class Spy(mod.CompactCoder):
        def encode_evictions(self, *a):
            calls.append(len(a[0]))
            return real(self, *a)

    monkeypatch.setattr(mod, "CompactCoder", Spy)
    ds = [Decision(victim=b, num_candidates=9 - b, position=0, queue="g/probationary",
                   responsible="g", responsible_p_before=5.0 - b, responsible_p_after=4.0 - b,
                   segments={"normal": 0, "probationary": 9 - b, "reuse": 0},
                   rank={"freed_seq": b, "segment": "probationary", "debt": 1.5})
          for b in range(4)]
    texts = {}
    for comp in ("compact", "none"):
        path = tmp_path / f"l.{comp}"
        w = LedgerWriter(path, compression=comp)
        w.start_run("candidate", "prefixshield")
        w.eviction_batch(7, _Req("r1"), ds, [0, 1, 2, 3], ["h0", "h1", "h2", "h0"],
                         ["g"] * 4)
        w.admission(7, _Req("r1"), 0, 4, 4, {"charged": 4})
        w.close()
        texts[comp] = ("".join(open_compact(path)) if comp == "compact"
                       else path.read_text())
    assert calls == [4]
    assert texts["compact"] == texts["none"]


# -- building and falling back ---------------------------------------------------------

def test_the_core_refuses_arrays_of_another_item_type():
    """The loops read the flat arrays through raw pointers (psgate.flat): an array whose
    items are not the C type a loop expects is refused, not misread."""
    from array import array
    from types import SimpleNamespace
    from psgate.engines import pool_work
    from psgate.invariants import checker as checker_mod
    _compiled()
    pool = SimpleNamespace(ref=array("i", [1]) * 4, key=array("i", [0]) * 4,
                           owner=array("i", [0]) * 4)
    with pytest.raises(TypeError, match="expected an array of C long longs \\('q'\\), found 'i'"):
        pool_work.release(pool, [1])    # compiled (the core cimports it)
    pool.key = [0] * 4
    with pytest.raises(TypeError):
        pool_work.release(pool, [1])
    pool.key, pool.ref = array("q", [0]) * 4, array("q", [1]) * 4
    with pytest.raises(TypeError, match="expected an array of C ints \\('i'\\), found 'q'"):
        pool_work.release(pool, [1])
    checker = checker_mod.InvariantChecker(4, lambda k: checker_mod.NO_KEY)
    checker.key = array("i", [0]) * 4
    with pytest.raises(TypeError, match="expected an array of C long longs \\('q'\\), found 'i'"):
        checker_mod.release(checker, [1])          # compiled (the core cimports it)
    with pytest.raises(TypeError, match="InvariantChecker"):
        checker_mod.release(SimpleNamespace(ref=array("i", [1]) * 4), [1])


def test_a_missing_core_is_said_once_and_the_python_engine_replays(monkeypatch, tmp_path,
                                                                  capsys):
    import sys
    monkeypatch.setitem(sys.modules, "psgate._core", None)     # import fails as if unbuilt
    monkeypatch.setattr(core, "_state", {})
    assert core.get() is None and core.get() is None
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "compiled core is not built" in err
    assert "Python engine" in err
    out = tmp_path / "out"
    api.replay(api.ReplayConfig(trace=str(EXAMPLE), baseline="lru", candidate="prefixshield",
                                capacity=192, out=out, force=True, contracts=CONTRACT_NAMES))
    assert json.loads((out / "receipt.json").read_text())["environment"]["replay_code"] == \
        "python"
    assert capsys.readouterr().err == ""


def test_switched_off_the_core_says_nothing(monkeypatch, capsys):
    monkeypatch.setenv("PSGATE_CORE", "0")
    monkeypatch.setattr(core, "_state", {})
    assert core.get() is None and core.describe() == "python"
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("policy", ["prefixshield", "prefixshield-nogate"])
def test_a_group_whose_heavier_debt_clears_is_ranked_at_its_new_weight(monkeypatch,
                                                                        tmp_path, policy):
    """W_g is the largest weight among g's buckets in debt: group a owes on a critical
    bucket (weight 4, clears at 0.69 s) and a best-effort one (weight 1, owes for 10 s).
    Its victims at 0.5 s lower its P by 1/4 each; at 1 s, after the critical debt has
    cleared with no charge to a in between, by 1 each; at 1.2 s, after a charge at 1.1 s
    put the critical bucket back in debt, by 1/4 again."""
    _compiled()
    events = [{"t": 0.0, "id": "a1", "group": "a", "contract": "critical", "done_t": 0.001,
               "blocks": [f"a1{j:04x}" for j in range(300)]},
              {"t": 0.01, "id": "a2", "group": "a", "contract": "best-effort",
               "done_t": 0.011, "blocks": [f"a2{j:04x}" for j in range(300)]}]
    for i, t in enumerate((0.5, 1.0, 1.2)):
        events.append({"t": t, "id": f"x{i}", "group": "x", "contract": "critical",
                       "done_t": t + 0.001, "blocks": [f"e{i}{j:04x}" for j in range(40)]})
    events.insert(4, {"t": 1.1, "id": "a3", "group": "a", "contract": "critical",
                      "done_t": 1.101, "blocks": [f"a3{j:04x}" for j in range(280)]})
    trace = write(tmp_path, events, name="weights.jsonl")
    files = _replay_both(monkeypatch, tmp_path, trace, 620, "lru", policy)
    assert "error" not in files, files
    drops = {}
    for r in csv.DictReader(io.StringIO(files["ledger.csv"].decode())):
        if r["kind"] == "evict" and r["run"] == "candidate" and r["responsible"] == "a":
            drops.setdefault(r["t"][:3], set()).add(
                round(float(r["responsible_p_before"]) - float(r["responsible_p_after"]), 9))
    assert {t: drops.get(t) for t in ("0.5", "1.0", "1.2")} == {
        "0.5": {0.25}, "1.0": {1.0}, "1.2": {0.25}}, drops


def test_the_loops_take_the_arrays_again_after_each_call_into_python(monkeypatch,
                                                                     tmp_path):
    """The compiled loops hold pointers into the pool's and the checker's arrays; a call
    back into Python (the pool's index_add/index_drop, the checker's drop_copy) may
    resize them, which moves them. Here each such call leaves every array replaced by a
    copy (as a resize would), and the replay must end in the state it ends in without.
    (The Python engine holds the arrays in locals across such calls, so the comparison
    is with the compiled replay of arrays that stay.)"""
    from psgate.bench.traces import load
    from psgate.engines.pool import BlockPool
    from psgate.invariants.checker import InvariantChecker
    _compiled()
    # two scopes over the same hashes (a slot another namespace owns goes through
    # index_add/index_drop) and generated tokens (keys the checker keeps outside its
    # tables, dropped through drop_copy)
    events = []
    for i in range(40):
        events.append({"t": i * 0.01, "id": f"r{i}", "scope": "ab"[i % 2], "out": 9,
                       "blocks": [f"{i % 5:x}{j:03x}" for j in range(6)] + [f"e{i:03x}"],
                       "done_t": i * 0.01 + 0.005})
    loaded = load(write(tmp_path, events, name="moving.jsonl"))
    monkeypatch.delenv("PSGATE_CORE", raising=False)
    policies = ("lru", "prefixshield")
    staying = [_engine_state(loaded, policy, 24, "step") for policy in policies]
    calls = {"index_add": 0, "index_drop": 0, "drop_copy": 0}

    def moving(cls, method, names):
        original = getattr(cls, method)

        def call(self, *args):
            out = original(self, *args)
            for name in names:
                old = getattr(self, name)
                setattr(self, name, type(old)(old.typecode, old) if hasattr(
                    old, "typecode") else type(old)(old))
            calls[method] += 1
            return out
        monkeypatch.setattr(cls, method, call)

    pool_arrays = ("key", "ref", "owner", "slot_ns", "slot_blk", "slot_lost")
    moving(BlockPool, "index_add", pool_arrays)
    moving(BlockPool, "index_drop", pool_arrays)
    # the checker is a cdef class: its drop_copy is overridden in a subclass the engines
    # build instead (the loops call it as a Python method)
    class MovingChecker(InvariantChecker):
        pass
    moving(MovingChecker, "drop_copy", ("key", "ref", "parent_table", "res_ns", "res_cnt"))
    from psgate.engines import base, sched
    monkeypatch.setattr(base, "InvariantChecker", MovingChecker)
    monkeypatch.setattr(sched, "InvariantChecker", MovingChecker)
    for policy, want in zip(policies, staying):
        got = _engine_state(loaded, policy, 24, "step")
        assert got["evictions"] > 0
        for k in want:
            assert got[k] == want[k], f"{policy}: {k} differs"
    assert all(calls.values()), calls
