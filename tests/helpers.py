"""Shared test helpers: write traces, generate random ones, replay in-process and collect
what happened."""

from __future__ import annotations

import gc
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest

from hypothesis import strategies as st

from psgate.engines import engine_class
from psgate.engines.base import NullRecorder
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


class NoteLog(EventLog):
    """EventLog that also keeps each admission's ledger note."""

    def __init__(self) -> None:
        super().__init__()
        self.notes: dict[str, dict] = {}

    def admission(self, now_ns, req, hits, allocated, new_blocks, note) -> None:
        super().admission(now_ns, req, hits, allocated, new_blocks, note)
        self.notes[req.id] = note


def write_lines(tmp_path: Path, lines, name: str = "t.jsonl") -> Path:
    """Write trace lines (header first) as JSONL under tmp_path."""
    p = tmp_path / name
    p.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return p


def write(tmp_path: Path, events, block_size: int = 4, name: str = "t.jsonl", **header) -> Path:
    """Write a trace: a header (block_size and any extra header fields) and the events,
    requests filled in with defaults (group g, contract standard, scope m, tail 0, out 0)."""
    lines = [{"psgate_trace": 1, "block_size": block_size, **header}]
    for e in events:
        e = dict(e)
        if e.get("op", "request") == "request":
            e.setdefault("op", "request")
            e.setdefault("group", "g")
            e.setdefault("contract", "standard")
            e.setdefault("scope", "m")
            e.setdefault("tail", 0)
            e.setdefault("out", 0)
        lines.append(e)
    return write_lines(tmp_path, lines, name)


def random_traces(chains, *, groups=("g",), max_requests: int = 30,
                  gaps=(0, 0.001, 0.01, 0.05, 0.3), cancel_one_in: int = 13,
                  extra_name: str = "f{i:x}{j}", extras_on_partial: bool = True,
                  max_out: int = 6, extra_fields=None, block_size: int = 4):
    """A hypothesis strategy for random trace lines (header first).

    Each of 1..max_requests steps advances t by one of ``gaps``, then is a cancel of an
    earlier request (one in ``cancel_one_in``) or a request whose blocks are a prefix of
    one of ``chains`` plus 0-2 unique blocks named by ``extra_name`` (with
    ``extras_on_partial`` false, those are kept only after a whole chain). A single entry in
    ``groups`` is used without a draw. ``extra_fields(draw, t, request)`` may add fields
    after ``out`` is drawn; about half the requests get a ``done_t``.
    """
    @st.composite
    def traces(draw):
        n = draw(st.integers(1, max_requests))
        t = 0.0
        lines = [{"psgate_trace": 1, "block_size": block_size}]
        ids = []
        for i in range(n):
            t = round(t + draw(st.sampled_from(gaps)), 3)
            if ids and draw(st.integers(0, cancel_one_in - 1)) == 0:
                lines.append({"t": t, "op": "cancel", "id": draw(st.sampled_from(ids))})
                continue
            chain = draw(st.sampled_from(chains))
            k = draw(st.integers(0, len(chain)))
            extra = [extra_name.format(i=i, j=j) for j in range(draw(st.integers(0, 2)))]
            if extras_on_partial or k == len(chain) or not extra:
                blocks = chain[:k] + extra
            else:
                blocks = chain[:k]
            tail = draw(st.integers(0, block_size - 1))
            if not blocks and tail == 0:
                tail = 1
            group = groups[0] if len(groups) == 1 else draw(st.sampled_from(groups))
            r = {"t": t, "op": "request", "id": f"r{i}", "group": group,
                 "contract": "standard", "scope": "m", "blocks": blocks, "tail": tail,
                 "out": draw(st.integers(0, max_out))}
            if extra_fields is not None:
                extra_fields(draw, t, r)
            if draw(st.booleans()):
                r["done_t"] = round(t + draw(st.sampled_from([0, 0.001, 0.02, 0.1, 0.5])), 3)
            lines.append(r)
            ids.append(r["id"])
        return lines

    return traces()


def chat_traces(*, max_sessions: int = 4, max_turns: int = 4, groups=("g", "h"),
                block_size: int = 4, max_user: int = 9, max_out: int = 14,
                answers: bool = True, cancel_one_in: int = 0):
    """A hypothesis strategy for multi-turn chat trace lines (header first): each turn's
    prompt is the conversation so far (every earlier prompt and answer) plus a new user
    message, and (with ``answers``) each request carries the hashes of its answer's full
    blocks, so a later turn re-sends blocks its predecessor cached while decoding. Turns
    of one session arrive in order, sessions interleave; one request in
    ``cancel_one_in`` (0: none) is cancelled a moment later."""
    from psgate.workloads.common import chain

    @st.composite
    def traces(draw):
        num_sessions = draw(st.integers(1, max_sessions))
        events = []
        for s in range(num_sessions):
            group = draw(st.sampled_from(groups))
            t = draw(st.sampled_from([0, 0.001, 0.01, 0.05]))
            said: list[str] = []       # full blocks of the conversation so far
            num_said = 0               # its tokens
            for j in range(draw(st.integers(1, max_turns))):
                prompt = num_said + draw(st.integers(1, max_user))
                out = draw(st.integers(1, max_out))
                blocks = said + chain(f"s{s}/u{j}", prompt // block_size - len(said),
                                      parent=said[-1] if said else None, start=len(said))
                answer = chain(f"s{s}/a{j}", (prompt + out) // block_size - len(blocks),
                               parent=blocks[-1] if blocks else None, start=len(blocks))
                r = {"t": round(t, 3), "op": "request", "id": f"s{s}t{j}", "group": group,
                     "contract": "standard", "scope": "m", "blocks": blocks,
                     "tail": prompt % block_size, "out": out}
                if answers and answer:
                    r["answer"] = answer
                events.append(r)
                if cancel_one_in and draw(st.integers(0, cancel_one_in - 1)) == 0:
                    events.append({"t": round(t + 0.002, 3), "op": "cancel", "id": r["id"]})
                said, num_said = blocks + answer, prompt + out
                t += draw(st.sampled_from([0.001, 0.01, 0.03, 0.1]))
        events.sort(key=lambda e: e["t"])     # stable: a cancel stays after its request
        return [{"psgate_trace": 1, "block_size": block_size}] + events

    return traces()


def replay_file(path: Path | str, capacity: int, policy: str = "lru", paranoid: bool = False,
                params: dict | None = None, cost=None, recorder=None, setup=None,
                engine: str = "sim"):
    """Replay with sim (or another engine by name); returns (RunResult, EventLog, engine).

    ``recorder`` replaces the fresh EventLog (it must keep EventLog's fields);
    ``setup(engine, log)`` runs just before the replay, to instrument the engine.
    """
    path = str(path)
    hashes = HashTable()
    header, summary = validate_trace(path, hashes)
    log = EventLog() if recorder is None else recorder
    pol = make_policy(policy, params)
    if pol.needs_future:
        from psgate.trace.future import future_uses
        pol.set_future(future_uses(TraceSource(path, Path(path)), hashes))
    engine = engine_class(engine)(header=header, hashes=hashes, capacity=capacity,
                                  policy=pol, contracts=CONTRACTS,
                                  done_ids=summary.done_ids, recorder=log, paranoid=paranoid,
                                  cost=cost, trace_path=path, groups=summary.groups)
    log.block_ids = {}
    admit = engine.try_admit

    def spy(r):
        status = admit(r)
        if status == "ok":
            log.block_ids[r.ev.id] = list(r.blocks)
        return status

    engine.try_admit = spy
    if setup is not None:
        setup(engine, log)
    with TraceReader(TraceSource(path, Path(path)), hashes) as reader:
        result = engine.run(reader.events())
    return result, log, engine


def replay_checked(path: Path | str, capacity: int, policy: str = "lru",
                   params: dict | None = None):
    """replay_file, paranoid, checking that the run completed with every invariant
    holding; returns (RunResult, EventLog, engine)."""
    result, log, engine = replay_file(path, capacity=capacity, policy=policy, paranoid=True,
                                      params=params)
    assert result.aborted is None
    assert all(v.holds for v in result.invariants.values()), result.invariants
    return result, log, engine


def run_events(tmp_path: Path, events, cap: int, policy: str, **params):
    """Write events (see write) and replay_checked them; params go to the policy."""
    return replay_checked(write(tmp_path, events), cap, policy, params or None)


_INTERPRETED: dict[str, object] = {}


def interpreted(module):
    """``module``, written in Cython's pure-Python mode, loaded again from its ``.py``
    under another name: its interpreted form, whether the installed one is compiled or
    not (loaded once per test session)."""
    from psgate import core
    name = module.__name__.replace(".", "_") + "_interpreted"
    if name not in _INTERPRETED:
        spec = importlib.util.spec_from_file_location(name, core.source_file(module.__file__))
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        assert not mod.cython.compiled
        _INTERPRETED[name] = mod
    return _INTERPRETED[name]


def both_forms(*modules, scope: str = "module"):
    """A fixture ``form`` over the two forms of pure-mode modules: as installed (compiled
    where the install compiled them) and interpreted from their sources; its value is the
    module, or the tuple of them where several are given."""
    @pytest.fixture(scope=scope, params=["installed", "interpreted"])
    def form(request):
        mods = modules if request.param == "installed" else tuple(map(interpreted, modules))
        return mods if len(mods) > 1 else mods[0]
    return form


def heavy_python(name: str, modules: tuple[str, ...], install: str) -> str:
    """An interpreter that has ``modules``: $PSGATE_<NAME>_PYTHON, else this one if it has
    them. Without one the test skips, except under $PSGATE_REQUIRE_<NAME>=1 (CI), where
    it fails: CI builds that interpreter, so a skip there would hide missing work."""
    named = os.environ.get(f"PSGATE_{name}_PYTHON")
    if named:
        return named
    if all(importlib.util.find_spec(m) for m in modules):
        return sys.executable
    what = " and ".join(modules)
    if os.environ.get(f"PSGATE_REQUIRE_{name}") == "1":
        pytest.fail(f"PSGATE_REQUIRE_{name}=1 but no interpreter with {what}: set "
                    f"PSGATE_{name}_PYTHON")
    pytest.skip(f"{what} not installed here: {install}, then PSGATE_{name}_PYTHON=<its python>")


SHARED = Path(__file__).resolve().parents[2] / "shared" / "traces"
SAMPLES = Path(__file__).resolve().parents[1] / "examples" / "traces"


def shared_traces() -> Path:
    """The public traces beside the repository (``../shared/traces``), for checks over whole
    traces that the repository only samples. A clone has nothing beside it, so these checks
    skip there with the reason; CI lays the traces beside its clone and sets
    $PSGATE_REQUIRE_SHARED=1, where a missing directory fails instead of hiding the check."""
    if SHARED.is_dir():
        return SHARED
    if os.environ.get("PSGATE_REQUIRE_SHARED") == "1":
        pytest.fail(f"PSGATE_REQUIRE_SHARED=1 but {SHARED} is not there")
    pytest.skip(f"extra check over the public traces: {SHARED} is not present "
                f"(a clone of the repository alone has only the samples in examples/traces/)")


def structural_failures(receipt: dict) -> list[dict]:
    """The gate's failed checks other than the candidate-vs-baseline comparison
    (non-regression): completion, invariants, eviction exercised, and gate-file checks.
    A test about a policy's mechanics asserts none; whether the candidate is better than
    the baseline on that trace is a finding, asserted where it is the subject."""
    return [c for c in receipt["gate"]["checks"]
            if c["verdict"] == "fail" and not c["name"].startswith("non-regression")]


def ledger_csv(out: Path) -> bytes:
    """The CSV ledger a replay wrote to ``out``, whichever form the receipt names
    (``ledger.compact.csv.gz`` by default), decoded to the bytes ``--ledger-compression
    none`` writes."""
    from psgate.receipt.ledger import open_text
    name = json.loads((out / "receipt.json").read_text())["config"]["ledger"]["file"]
    with open_text(out / name) as fh:
        return "".join(fh).encode()


def replay_outputs(out: Path) -> dict[str, bytes]:
    """Everything a replay wrote to ``out``, by file name, for comparing two replays that
    ran different code: the receipt without its environment section, but with
    ``replay_code`` (which code ran, ``compiled`` or ``python``) at its top level, and the
    compact ledger's CSV as ``ledger.csv`` too."""
    files = {}
    for p in sorted(out.iterdir()):
        data = p.read_bytes()
        if p.name == "receipt.json":
            r = json.loads(data)
            r["replay_code"] = r.pop("environment")["replay_code"]
            data = json.dumps(r, sort_keys=True).encode()
        files[p.name] = data
    if "ledger.compact.csv.gz" in files:
        files["ledger.csv"] = ledger_csv(out)
    return files


def shell_blocks(text: str) -> list[list[str]]:
    """The shell code blocks of a Markdown text: ```sh fences and indented blocks (4 spaces
    after a blank line), each as its lines."""
    lines, out, i, prev_blank = text.split("\n"), [], 0, True
    while i < len(lines):
        m = re.match(r"^```(\w*)", lines[i])
        if m:
            j = i + 1
            while j < len(lines) and not lines[j].startswith("```"):
                j += 1
            if m.group(1) in ("sh", "bash", "shell", "console"):
                out.append(lines[i + 1:j])
            i, prev_blank = j + 1, False
            continue
        if lines[i].startswith("    ") and prev_blank:
            body = []
            while i < len(lines) and (lines[i].startswith("    ") or not lines[i].strip()):
                body.append(lines[i][4:])
                i += 1
            out.append(body)
            prev_blank = True
            continue
        prev_blank = not lines[i].strip()
        i += 1
    return out


def actionlint_path() -> str | None:
    here = Path(sys.executable).parent / "actionlint"
    return str(here) if here.is_file() else shutil.which("actionlint")


def assert_actionlint(workflow: Path) -> None:
    """The workflow passes actionlint (required in CI, where the test extra installs it)."""
    exe = actionlint_path()
    if exe is None:
        if os.environ.get("CI"):
            pytest.fail("actionlint is missing in CI: the test extra installs it")
        pytest.skip("actionlint not installed here (pip install -e '.[test]')")
    proc = subprocess.run([exe, "-no-color", str(workflow)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def traced_peak(fn) -> int:
    """Peak bytes Python allocated while ``fn()`` ran (tracemalloc), after a collection."""
    gc.collect()
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


# -- ledger row values: what the row writers must write as csv.writer and orjson do -----

from psgate.policy.base import Decision  # noqa: E402 - the strategies below only

csv_texts = st.text(alphabet=st.sampled_from('ab,"\n\r xé'), max_size=6)
row_numbers = st.one_of(st.none(), st.integers(-3, 3), st.floats(allow_nan=True),
                        st.sampled_from([0.0, -0.0, 1e-7, 1e16, 123.4567891234, 2.5e-5]))
json_values = st.one_of(st.integers(-2**70, 2**70), st.booleans(), st.none(),
                        st.floats(allow_nan=False), st.sampled_from([1e-7, 1e300, 5e-324]),
                        csv_texts, st.sampled_from(["probationary", "best-effort", "t\u00e9",
                                                    "a\\b", "tab\tx", "\x7f"]))
ranks = st.one_of(st.none(), st.dictionaries(st.one_of(st.sampled_from(
    ["freed_t", "debt", "a_b", "Z9", "k\u00e9", "q\"", "b\\s"]), st.just("x")), json_values,
    max_size=4))


@st.composite
def decisions(draw):
    """A Decision whose every ledger field may need quotes, be of an odd type, or (its
    JSON columns) hold a value the fast JSON path must hand to orjson."""
    return Decision(
        victim=draw(st.integers(1, 50)), num_candidates=draw(st.one_of(st.integers(0, 9),
                                                                       csv_texts)),
        position=draw(st.integers(0, 5)), queue=draw(st.one_of(csv_texts, st.just("lru"))),
        responsible=draw(st.one_of(st.none(), csv_texts)),
        responsible_p_before=draw(row_numbers), responsible_p_after=draw(row_numbers),
        runner_up=draw(st.one_of(st.none(), csv_texts)), runner_up_p=draw(row_numbers),
        segments=draw(st.one_of(st.none(), st.dictionaries(
            st.sampled_from(["hot", "cold", "x\"y"]), st.integers(0, 9), max_size=3))),
        rank=draw(ranks) or {})


close_values = st.sampled_from([0, 1, True, False, 1.0, 0.0, -0.0, None, "x", 0.5, 2**70,
                                1e-7, "a\\b"])


@st.composite
def close_ranks(draw):
    """Rank dicts that mostly repeat the last one's keys, order and values: the case a
    JSON column's memo shortcuts, with the values it must tell apart (0 and False, 1 and
    1.0 and True, 0.0 and -0.0) and ones it hands to csv_json."""
    keys = draw(st.sampled_from([("seg", "debt", "n")] * 3 + [("debt", "seg", "n"), ("n",)]))
    return {k: draw(close_values) for k in keys}
