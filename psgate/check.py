"""psgate's policy contract as a library: run it against any policy (``psgate check-policy``).

A policy named by a spec (:mod:`psgate.policies`: a built-in name, an entry point,
``module:Class`` or ``path/to/file.py:Class``) is constructed, replayed on generated traces
under the paranoid invariant checker with both schedulers, compared with itself and
replayed end to end. psgate's built-in policies are held to this same code
(tests/test_check.py), so a user's policy meets exactly the bar they meet. Each
contract ends as pass, fail (one line: what broke, where, on which trace) or skip (why it
does not apply):

    params-validated        an unknown parameter is refused, the defaults given explicitly
                            are accepted, describe() names the policy and records the
                            parameters given, as JSON
    runs-cleanly            every replay of the generated traces runs to its end: no hook
                            raises, runs past the time limit or returns what the engine cannot
                            use (a FAIL names the hook, the exception and file:line)
    victims-are-candidates  every victim is a candidate when chosen: never pinned, never a
                            block without content, never the same twice; evict_batch returns
                            as many victims as asked for
    hard-invariants         every hard invariant (and the policy's own auditors' ones) holds
                            under paranoid checking on generated traces with cancels, done
                            events, several groups, contracts, scopes and priorities, under the
                            service and the step scheduler, down to capacities that preempt
    work-conserving         a policy that declares itself work-conserving never refuses an
                            admission nor forces evictions over truly free blocks (skip for
                            one declaring work_conserving = False)
    ledger-fields           every Decision explains its ledger row: num_candidates is the
                            number of candidates when it was made, position is >= 0, queue
                            is a name, rank a small JSON object of finite numbers, and it
                            names the block evicted; end_admit returns None or such an object
    select-victim-pure      select_victim changes nothing: a replay calling it once more,
                            discarded, before every eviction decides as the plain replay; two
                            calls in a row give equal decisions; candidates() and
                            num_candidates are unchanged by it
    evict-batch-consistent  a class's own evict_batch is select_victim + on_evict repeated:
                            the same victims and decision fields, and without a recorder the
                            same outcomes (skip for a class that batches nothing)
    receipt-valid           a full replay (psgate.api) with the policy as candidate against lru
                            writes a schema-valid receipt, a well-formed ledger and
                            requests.csv, with the candidate run complete and its invariants
                            holding
    deterministic           the same replay twice in one process writes byte-identical
                            ledgers and requests.csv (a FAIL names the first differing row)
    hash-seed-independent   the replay in two fresh interpreters with different PYTHONHASHSEED
                            writes the ledgers written here: set and dict order, hash(),
                            unseeded randomness and the wall clock show up as the first
                            differing row (run, seq, both lines)
    hypothesis-traces       runs-cleanly, victims-are-candidates, hard-invariants, ledger-fields
                            and work-conserving on hypothesis-generated traces, a failure
                            shrunk to a minimal trace (skip where hypothesis is not
                            installed: it is not a dependency of psgate)

Loading is not a contract: a spec that does not resolve, or a policy whose constructor
refuses the parameters given, raises :class:`~psgate.errors.InputError` (exit 2, one line),
as replay does. A policy declaring ``needs_future`` gets each trace's future, as replay
gives it.

Time. Each contract runs under ``time_limit_s`` seconds of wall clock: a timer in the main
thread (``signal.setitimer``) raises a :class:`BaseException` the policy cannot swallow
with ``except Exception``, and the contract fails as "timed out after N s in <hook>
(file:line)"; every later contract that would run the policy again is skipped. The
subprocess replays of hash-seed-independent are killed at the same limit instead. Off the
main thread there is no timer. The traces are small (a few to 40 requests, capacities of a
few blocks to a few dozen), so for a policy with O(log n) hooks the whole suite takes
seconds.

What a check reports depends on the policy, ``seed`` and ``examples`` alone, not on the
machine or the hash seed (traces come from string-seeded ``random.Random``; hypothesis is
seeded and shrinks for a fixed number of examples; results carry no times), except where
a time limit cut a contract short.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from psgate.api import ReplayConfig, replay
from psgate.engines import engine_class
from psgate.engines.base import NullRecorder
from psgate.errors import InputError, PsgateError
from psgate.invariants.checker import NO_KEY
from psgate.policies import (BUILTIN, PolicySource, construct, innermost_frame,
                             policy_code_files, resolve)
from psgate.policy import DEFAULT_CONTRACTS, Decision, EvictionPolicy
from psgate.receipt.ledger import LEDGER_COLUMNS, REQUEST_COLUMNS
from psgate.receipt.receipt import validate_receipt
from psgate.trace.future import future_uses
from psgate.trace.reader import HashTable, TraceReader, TraceSource, validate_trace
from psgate.trace.writer import write_trace
from psgate.workloads import generate

PASS, FAIL, SKIP = "pass", "fail", "skip"

CONTRACTS: tuple[str, ...] = (
    "params-validated", "runs-cleanly", "victims-are-candidates", "hard-invariants",
    "work-conserving", "ledger-fields", "select-victim-pure", "evict-batch-consistent",
    "receipt-valid", "deterministic", "hash-seed-independent", "hypothesis-traces",
)
# The contracts one paranoid replay judges (the corpus pass and each hypothesis example).
_REPLAY_CONTRACTS = ("runs-cleanly", "victims-are-candidates", "hard-invariants",
                     "work-conserving", "ledger-fields")

DEFAULT_EXAMPLES = 100
DEFAULT_TIME_LIMIT_S = 60.0
SCHEDULERS = ("service", "step")
# Hash seeds of the two fresh interpreters (any two different values would do).
HASH_SEEDS = ("1", "2")
# Hypothesis examples tried after the first failure, to shrink it (a count, not a time,
# so what is reported does not depend on the machine).
SHRINK_EXAMPLES = 400
# A rank (or an end_admit note) is one ledger cell: small enough to read in one row.
MAX_RANK_KEYS = 32
MAX_RANK_CHARS = 1024
MAX_NOTE_CHARS = 2048
_UNKNOWN_PARAM = "psgate_check_unknown_parameter"
_MAX_JSON_INT = 2 ** 63 - 1          # what orjson, which writes the ledger, can write
_DECISION_FIELDS = tuple(f.name for f in dataclasses.fields(Decision))

# Hooks the probe watches: every public method an engine calls on a policy instance.
_HOOKS = ("bind", "on_admit", "on_hit", "on_touch", "touch_queues", "touch_hits",
          "select_victim", "on_evict", "evict_batch", "on_cached", "end_admit", "on_free",
          "on_allocated", "on_released", "admission_allowed", "capacity_for",
          "reclaim_first", "candidates", "set_future", "claims", "invariant_auditors",
          "contract_table", "audit", "describe")


@dataclass(frozen=True)
class ContractResult:
    """One contract's verdict (pass, fail or skip) and one line saying why; ``example``
    is the generated trace a failure was found on (its lines, capacity and scheduler), so
    ``psgate replay --trace`` can reproduce it."""

    name: str
    verdict: str
    detail: str
    example: dict | None = None

    def to_json(self) -> dict:
        out = {"name": self.name, "verdict": self.verdict, "detail": self.detail}
        if self.example is not None:
            out["example"] = self.example
        return out


@dataclass
class CheckReport:
    """Every contract's result, in :data:`CONTRACTS` order, for one policy."""

    spec: str
    policy: dict
    seed: int
    examples: int
    time_limit_s: float
    results: list[ContractResult] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        """True when no contract failed (skips allowed)."""
        return all(r.verdict != FAIL for r in self.results)

    def counts(self) -> dict[str, int]:
        return {v: sum(r.verdict == v for r in self.results) for v in (PASS, FAIL, SKIP)}

    def result(self, name: str) -> ContractResult:
        return next(r for r in self.results if r.name == name)

    def to_json(self) -> dict:
        return {"spec": self.spec, "policy": self.policy, "seed": self.seed,
                "examples": self.examples, "time_limit_s": self.time_limit_s,
                "passed": self.passed, "counts": self.counts(),
                "contracts": [r.to_json() for r in self.results]}


def check_policy(spec: str, params: dict | None = None, *, seed: int = 0,
                 examples: int = DEFAULT_EXAMPLES,
                 time_limit_s: float = DEFAULT_TIME_LIMIT_S,
                 on_result: Callable[[ContractResult], None] | None = None) -> CheckReport:
    """Run every contract against the policy ``spec`` names, constructed with ``params``.

    ``examples``: how many traces are generated (each replayed under both schedulers) and
    how many hypothesis examples are tried; ``seed`` picks them. ``on_result`` is called
    with each result as soon as it is known, in :data:`CONTRACTS` order. Raises
    InputError for a spec that does not load or parameters its constructor refuses."""
    if type(seed) is not int or seed < 0:
        raise InputError(f"expected an integer >= 0, found {seed!r}", path="--seed")
    if type(examples) is not int or not 1 <= examples <= 100_000:
        raise InputError(f"expected an integer in 1..100000, found {examples!r}",
                         path="--examples")
    if type(time_limit_s) not in (int, float) or not 0 < time_limit_s <= 86_400:
        raise InputError(f"expected seconds in (0, 86400], found {time_limit_s!r}",
                         path="--time-limit")
    params = dict(params or {})
    source = resolve(spec)
    checker = _Checker(source, params, seed, examples, float(time_limit_s))
    checker.load()
    report = CheckReport(spec=spec, policy=checker.policy_record(), seed=seed,
                         examples=examples, time_limit_s=float(time_limit_s))
    for result in checker.run():
        report.results.append(result)
        if on_result is not None:
            on_result(result)
    return report


# -- signals from inside a replay ------------------------------------------------------
class _TimedOut(BaseException):
    """The contract's time ran out (raised by the timer, wherever the main thread was)."""


class _ShrinkDone(BaseException):
    """Enough examples spent shrinking a hypothesis failure: report the smallest so far."""


class _Violation(BaseException):
    """A contract broken in the middle of a replay, by what a hook returned: the replay
    cannot go on. A BaseException, so neither the engine nor the policy catches it."""

    def __init__(self, contract: str, detail: str) -> None:
        super().__init__(detail)
        self.contract = contract
        self.detail = detail


def _one_line(text: str, limit: int = 240) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _shown_path(path: str) -> str:
    """A file as a user would name it: relative to the working directory when inside it."""
    try:
        rel = Path(path).resolve().relative_to(Path.cwd().resolve())
    except (ValueError, OSError):
        return path
    return rel.as_posix()


def _short(value, limit: int = 120) -> str:
    try:
        text = repr(value)
    except Exception as exc:   # noqa: BLE001 - a user's __repr__
        text = f"<{type(value).__name__}: repr raised {type(exc).__name__}>"
    return _one_line(text, limit)


def _json_problem(value, what: str, depth: int = 0) -> str | None:
    """Why ``value`` is not plain JSON with finite numbers (what a ledger cell or a receipt
    can hold and read back as written), or None."""
    t = type(value)
    if value is None or t is bool or t is str:
        return None
    if t is int:
        return None if abs(value) <= _MAX_JSON_INT else f"{what} is {value}, beyond 64 bits"
    if t is float:
        return None if math.isfinite(value) else f"{what} is {value!r}, not a finite number"
    if depth > 8:
        return f"{what} nests deeper than 8 levels"
    if t in (list, tuple):
        for i, v in enumerate(value):
            p = _json_problem(v, f"{what}[{i}]", depth + 1)
            if p is not None:
                return p
        return None
    if t is dict:
        for k, v in value.items():
            if type(k) is not str:
                return f"{what} has the key {k!r}, not a string"
            p = _json_problem(v, f"{what}['{k}']", depth + 1)
            if p is not None:
                return p
        return None
    return f"{what} is a {t.__module__}.{t.__qualname__} ({_short(value, 60)}), not JSON"


def _object_problem(value, what: str, max_keys: int, max_chars: int) -> str | None:
    if type(value) is not dict:
        return f"{what} is {_short(value, 60)}, expected a dict"
    p = _json_problem(value, what)
    if p is not None:
        return p
    if len(value) > max_keys:
        return f"{what} has {len(value)} fields, more than {max_keys}"
    size = len(json.dumps(value, sort_keys=True))
    if size > max_chars:
        return f"{what} is {size} characters of JSON, more than {max_chars}"
    return None


def _number_problem(value, what: str) -> str | None:
    if value is None:
        return None
    if type(value) not in (int, float) or not math.isfinite(value):
        return f"{what} is {_short(value, 60)}, expected a finite number or None"
    return None


def decision_problem(d, block: int | None = None, num_candidates: int | None = None
                     ) -> str | None:
    """Why one Decision cannot explain its ledger row, or None. ``block``: the block the
    engine evicted for it; ``num_candidates``: how many candidates there were."""
    if not _is_decision(d):
        return f"a decision is {_short(d, 60)}, expected a psgate.policy.Decision"
    nc, pos = d.num_candidates, d.position
    if type(nc) is not int or nc < 1:
        return f"num_candidates is {_short(nc, 40)}, expected an integer >= 1"
    if num_candidates is not None and nc != num_candidates:
        return f"num_candidates is {nc}, but {num_candidates} blocks were candidates"
    # (no upper bound: a walk that passes blocks more than once, s3fifo's, counts them all)
    if type(pos) is not int or pos < 0:
        return f"position is {_short(pos, 40)}, expected an integer >= 0"
    if type(d.queue) is not str or not d.queue:
        return f"queue is {_short(d.queue, 40)}, expected a non-empty string"
    if block is not None and d.victim != block:
        return f"the decision names block {_short(d.victim, 40)}, but block {block} was evicted"
    for name in ("responsible", "runner_up"):
        v = getattr(d, name)
        if v is not None and type(v) is not str:
            return f"{name} is {_short(v, 40)}, expected a string or None"
    for name in ("responsible_p_before", "responsible_p_after", "runner_up_p"):
        p = _number_problem(getattr(d, name), name)
        if p is not None:
            return p
    if d.segments is not None:
        seg = d.segments
        if type(seg) is not dict or any(type(k) is not str or type(v) is not int
                                        for k, v in seg.items()):
            return f"segments is {_short(seg, 60)}, expected a dict of names to integers"
    return _object_problem(d.rank, "rank", MAX_RANK_KEYS, MAX_RANK_CHARS)


def _is_decision(d) -> bool:
    """A Decision, or an object standing for one with all its fields (psgate's compiled
    policies hand over such objects, built lazily)."""
    return isinstance(d, Decision) or all(hasattr(d, f) for f in _DECISION_FIELDS)


def _same_decision(a, b) -> bool:
    """Equal fields; a NaN equals a NaN here (ledger-fields judges NaNs, not this)."""
    return a == b or _short(a, 10_000) == _short(b, 10_000)


def _decision_difference(a, b) -> str:
    """The first field two decisions differ in, with both values."""
    for f in _DECISION_FIELDS:
        x, y = getattr(a, f, None), getattr(b, f, None)
        if not (x == y or _short(x, 10_000) == _short(y, 10_000)):
            return f"{f} {_short(x, 80)}, then {_short(y, 80)}"
    return f"{_short(a, 80)}, then {_short(b, 80)}"


# -- generated traces ------------------------------------------------------------------
@dataclass
class _Case:
    """One generated trace and the capacity to replay it at."""

    name: str
    lines: list[dict]
    capacity: int
    path: Path | None = None
    hashes: HashTable | None = None
    header: object = None
    summary: object = None

    def example(self, scheduler: str) -> dict:
        return {"trace": self.lines, "capacity": self.capacity, "scheduler": scheduler}

    def where(self, scheduler: str) -> str:
        return f"{self.name}, {scheduler} scheduler, {self.capacity} blocks"


def _blocks_needed(lines: list[dict]) -> int:
    bs = lines[0]["block_size"]
    return max([-(-(len(e["blocks"]) * bs + e["tail"] + e["out"]) // bs)
                for e in lines[1:] if e.get("op") == "request"] or [1])


def _finish_trace(lines: list[dict], rng: random.Random, contracts: tuple[str, ...],
                  done_events: bool = True) -> list[dict]:
    """A generated trace made to exercise more: about half the requests that carry done_t
    get a separate ``done`` event instead, and contracts are renamed onto the policy's
    own table (a policy with its own contract names refuses any other)."""
    head, events = dict(lines[0]), [dict(e) for e in lines[1:]]
    dones = []
    for e in events:
        if e.get("op") != "request":
            continue
        if e["contract"] not in contracts:
            e["contract"] = contracts[sum(map(ord, e["contract"])) % len(contracts)]
        if done_events and "done_t" in e and rng.random() < 0.5:
            dones.append({"t": e.pop("done_t"), "op": "done", "id": e["id"]})
    # stable: a done event follows every line of its time, its request's included
    return [head] + sorted(events + dones, key=lambda e: e["t"])


def _corpus(seed: int, n: int, contracts: tuple[str, ...]) -> list[_Case]:
    """``n`` small random traces and capacities, from ``seed`` alone. Capacities run from
    ones some requests cannot fit (rejections) through just enough for the largest
    request (the step scheduler preempts) to roomy."""
    cases = []
    for i in range(n):
        rng = random.Random(f"psgate-check/{seed}/{i}")
        params = {"seed": rng.randrange(2 ** 31), "block_size": rng.choice((2, 4, 4)),
                  "requests": rng.randint(4, 40), "groups": rng.randint(1, 4),
                  "chains": rng.randint(1, 6), "max_chain_blocks": rng.randint(1, 6),
                  "cancel_fraction": rng.choice((0.0, 0.08, 0.2))}
        lines = _finish_trace(generate("random", params), rng, contracts)
        need = _blocks_needed(lines)
        capacity = rng.choice((need + 1, need + 1, need + 2, need + 1 + rng.randint(1, need),
                               max(2, need // 2 + 1), 3 * need + 1))
        cases.append(_Case(f"trace-{i}", lines, capacity))
    return cases


def _receipt_case(seed: int, contracts: tuple[str, ...]) -> _Case:
    """The trace the end-to-end replays use: long enough that both policies evict."""
    rng = random.Random(f"psgate-check/{seed}/receipt")
    params = {"seed": rng.randrange(2 ** 31), "block_size": 4, "requests": 80, "groups": 3,
              "chains": 5, "max_chain_blocks": 6, "cancel_fraction": 0.08}
    lines = _finish_trace(generate("random", params), rng, contracts)
    return _Case("receipt-trace", lines, _blocks_needed(lines) + 3)


def _hypothesis_cases(st, contracts: tuple[str, ...]):
    """A hypothesis strategy for (trace lines, capacity, scheduler): shared chains so
    prefixes hit, unique blocks after them, cancels, done_t and done events, three groups,
    two scopes, prefix labels and priorities."""
    chains = (("a1", "a2", "a3", "a4"), ("b1", "b2"), ("c1", "c2", "c3"), ("d1",))

    @st.composite
    def cases(draw):
        bs = draw(st.sampled_from((1, 2, 4)))
        head = {"psgate_trace": 1, "block_size": bs, "source": "psgate check-policy"}
        events, dones, ids = [], [], []
        t = 0.0
        for i in range(draw(st.integers(1, 20))):
            t = round(t + draw(st.sampled_from((0, 0, 0.001, 0.01, 0.05, 0.3))), 3)
            if ids and draw(st.integers(0, 9)) == 0:
                events.append({"t": t, "op": "cancel", "id": draw(st.sampled_from(ids))})
                continue
            chain = draw(st.sampled_from(chains))
            blocks = list(chain[:draw(st.integers(0, len(chain)))])
            # unique to the request (hex, as trace hashes are): e, i in hex, f, j
            blocks += [f"e{i:x}f{j}" for j in range(draw(st.integers(0, 2)))]
            tail = draw(st.integers(0, bs - 1))
            if not blocks and tail == 0:
                blocks = [f"e{i:x}f0"]
            r = {"t": t, "op": "request", "id": f"r{i}",
                 "group": draw(st.sampled_from(("g0", "g1", "g2"))),
                 "contract": draw(st.sampled_from(contracts)),
                 "scope": draw(st.sampled_from(("m", "m", "m2"))), "blocks": blocks,
                 "tail": tail, "out": draw(st.integers(0, 3 * bs))}
            prefix = draw(st.sampled_from((None, None, "p0", "p1")))
            if prefix is not None:
                r["prefix"] = prefix
            if draw(st.booleans()):
                r["priority"] = draw(st.integers(0, 100))
                r["priority_until"] = round(t + draw(st.sampled_from((0.01, 0.1, 1.0))), 3)
            end = draw(st.sampled_from((None, "done_t", "done")))
            if end is not None:
                done_t = round(t + draw(st.sampled_from((0, 0.001, 0.02, 0.1, 0.5))), 3)
                if end == "done_t":
                    r["done_t"] = done_t
                else:
                    dones.append({"t": done_t, "op": "done", "id": r["id"]})
            events.append(r)
            ids.append(r["id"])
        lines = [head] + sorted(events + dones, key=lambda e: e["t"])
        return lines, draw(st.integers(2, 24)), draw(st.sampled_from(SCHEDULERS))

    return cases()


# -- watching a policy instance -------------------------------------------------------
class _Probe:
    """Wraps the hooks of one policy instance (instance attributes, so the engine and the
    policy's own calls go through them): which hook runs now (for a time-out), the last
    exception a hook let out, values its hooks return that a contract forbids, and the
    admission refusals and forced evictions work-conserving counts."""

    def __init__(self, policy: EvictionPolicy) -> None:
        self.policy = policy
        self.stack: list[str] = []
        # the last exception a hook let out, and the hook: the replay's fault only if it
        # is the one that stopped the replay (the policy may catch its own)
        self.fault: tuple[str, BaseException] | None = None
        self.last: str | None = None
        self.refused = 0
        self.forced = 0
        self.note_problem: str | None = None
        posts = {"select_victim": self._post_select, "end_admit": self._post_end_admit,
                 "admission_allowed": self._post_allowed, "reclaim_first": self._post_reclaim,
                 "capacity_for": self._post_capacity}
        for name in _HOOKS:
            fn = getattr(policy, name)
            if name == "evict_batch":
                setattr(policy, name, self._batch_hook(fn))
            else:
                setattr(policy, name, self._hook(name, fn, posts.get(name)))

    def _hook(self, name: str, fn, post):
        stack = self.stack

        def hook(*args, **kw):
            stack.append(name)
            try:
                out = fn(*args, **kw)
            except Exception as exc:
                # the innermost hook it left (an outer one sees the same exception)
                if self.fault is None or self.fault[1] is not exc:
                    self.fault = (name, exc)
                raise
            finally:
                stack.pop()
            self.last = name
            if post is not None:
                post(out, args)
            return out
        return hook

    def _batch_hook(self, fn):
        inner = self._hook("evict_batch", fn, None)

        def evict_batch(req, now_ns, num_blocks, decisions):
            before = None if decisions is None else len(decisions)
            victims = inner(req, now_ns, num_blocks, decisions)
            if type(victims) is not list or any(type(v) is not int for v in victims):
                raise _Violation("runs-cleanly", f"evict_batch returned {_short(victims)}, "
                                 f"expected a list of block ids (int)")
            if decisions is not None:
                made = decisions[before:]
                if len(made) != len(victims):
                    raise _Violation("ledger-fields", f"evict_batch returned {len(victims)} "
                                     f"victims and appended {len(made)} decisions (request "
                                     f"{req.id})")
            return victims
        return evict_batch

    def _post_select(self, d, args) -> None:
        if not _is_decision(d) or type(d.victim) is not int:
            raise _Violation("runs-cleanly", f"select_victim returned {_short(d)}, expected a "
                             f"psgate.policy.Decision whose victim is a block id (int)")

    def _post_end_admit(self, note, args) -> None:
        if note is not None and self.note_problem is None:
            p = _object_problem(note, "end_admit's note", MAX_RANK_KEYS, MAX_NOTE_CHARS)
            if p is not None:
                self.note_problem = f"{p} (request {args[0].id})"

    def _post_allowed(self, ok, args) -> None:
        if not ok:
            self.refused += 1

    def _post_reclaim(self, n, args) -> None:
        if type(n) is not int or not 0 <= n <= args[1]:
            raise _Violation("runs-cleanly", f"reclaim_first returned {_short(n, 40)}, "
                             f"expected an integer in 0..{args[1]}")
        if n:
            self.forced += 1

    def _post_capacity(self, cap, args) -> None:
        if cap is not None and (type(cap) is not int or cap < 0):
            raise _Violation("runs-cleanly", f"capacity_for returned {_short(cap, 40)}, "
                             f"expected None or an integer >= 0")


class _Log(NullRecorder):
    """The recorder of an in-process replay: victims, decisions and requests in order, and
    the first decision whose fields do not explain its row, judged against the pool as it
    was when the decision was made (called before the engine drops the victim's content)."""

    hits = False

    def __init__(self, judge: bool = True) -> None:
        self.victims: list[int] = []
        self.decisions: list = []
        self.requests: list[str] = []
        self.judge = judge
        self.problem: str | None = None
        self.engine = None

    def eviction(self, now_ns, req, decision, block, hash_name, owner) -> None:
        self.victims.append(block)
        self.decisions.append(decision)
        self.requests.append(req.id)
        if self.judge and self.problem is None and self.engine is not None:
            eng = self.engine
            ref, key = eng.ref, eng.key
            n = sum(1 for b in range(1, eng.num_blocks) if ref[b] == 0 and key[b] != NO_KEY)
            p = decision_problem(decision, block, n)
            if p is not None:
                self.problem = f"eviction {len(self.victims)} (request {req.id}): {p}"


@dataclass
class _Run:
    """What one in-process replay gave: the engine's result (None when it did not finish),
    its log and probe, and each problem found as (contract, detail), first first."""

    result: object
    log: _Log | None
    probe: _Probe
    problems: list[tuple[str, str]]

    def first(self, contract: str) -> str | None:
        return next((d for c, d in self.problems if c == contract), None)

    @property
    def completed(self) -> bool:
        return self.result is not None and self.result.aborted is None and not any(
            c == "runs-cleanly" for c, _ in self.problems)

    def outcomes(self) -> list[tuple]:
        return [(o.id, o.state, o.cached_tokens, o.release_ns) for o in self.result.requests]


def _outcome_text(o: tuple) -> str:
    rid, state, cached, release_ns = o
    return f"request {rid} {state} with {cached} cached tokens, released at {release_ns} ns"


def _outcome_difference(a: _Run, b: _Run, what_a: str, what_b: str) -> str | None:
    """The first request that ended otherwise in b than in a, or None."""
    oa, ob = a.outcomes(), b.outcomes()
    for x, y in zip(oa, ob):
        if x != y:
            return f"{what_a}: {_outcome_text(x)}; {what_b}: {_outcome_text(y)}"
    if len(oa) != len(ob):
        return f"{len(oa)} requests ended {what_a}, {len(ob)} {what_b}"
    if a.result.evictions != b.result.evictions:
        return f"{a.result.evictions} evictions {what_a}, {b.result.evictions} {what_b}"
    return None


def _first_difference(a: _Run, b: _Run, what_a: str, what_b: str) -> str | None:
    """The first eviction, decision or outcome in which two replays of one trace differ."""
    va, vb = a.log.victims, b.log.victims
    for i, (x, y) in enumerate(zip(va, vb)):
        if x != y:
            return (f"eviction {i + 1} (request {a.log.requests[i]}) took block {x} "
                    f"{what_a} and block {y} {what_b}")
    if len(va) != len(vb):
        return f"{len(va)} evictions {what_a}, {len(vb)} {what_b}"
    for i, (x, y) in enumerate(zip(a.log.decisions, b.log.decisions)):
        if not _same_decision(x, y):
            return (f"eviction {i + 1} (request {a.log.requests[i]}, block {va[i]}): "
                    f"{what_a}, then {what_b}: {_decision_difference(x, y)}")
    return _outcome_difference(a, b, what_a, what_b)


def _strict_json(text: str):
    def refuse(constant):
        raise ValueError(f"{constant} is not JSON")
    return json.loads(text, parse_constant=refuse)


def _ledger_problem(path: Path) -> tuple[str | None, int]:
    """Whether ledger.csv is what a reader expects: the header, whole rows, per run
    increasing seq, known kinds, rank cells that are JSON objects, and eviction rows with
    their candidate fields; and how many eviction rows the candidate run has."""
    col = {c: i for i, c in enumerate(LEDGER_COLUMNS)}
    evictions = 0
    if not path.is_file():
        return "the replay wrote no ledger.csv", 0
    with open(path, newline="", encoding="utf-8") as fh:
        rows = csv.reader(fh)
        if next(rows, None) != list(LEDGER_COLUMNS):
            return "ledger.csv does not start with psgate's ledger header", 0
        last: dict[str, int] = {}
        for n, row in enumerate(rows, 2):
            where = f"ledger.csv line {n}"
            if len(row) != len(LEDGER_COLUMNS):
                return f"{where}: {len(row)} fields, expected {len(LEDGER_COLUMNS)}", evictions
            run, kind = row[col["run"]], row[col["kind"]]
            try:
                seq = int(row[col["seq"]])
            except ValueError:
                return f"{where}: seq {row[col['seq']]!r} is not an integer", evictions
            if seq <= last.get(run, 0):
                return f"{where}: seq {seq} does not follow {last.get(run, 0)}", evictions
            last[run] = seq
            if kind not in ("evict", "admit", "hit"):
                return f"{where}: unknown kind {kind!r}", evictions
            cell = row[col["rank"]]
            if cell:
                try:
                    rank = _strict_json(cell)
                except ValueError as exc:
                    return f"{where}: the rank cell is not JSON ({_one_line(exc, 80)})", \
                        evictions
                if type(rank) is not dict:
                    return f"{where}: the rank cell is not a JSON object", evictions
            if kind == "evict":
                nc, pos = row[col["num_candidates"]], row[col["position"]]
                if not (nc.isdigit() and int(nc) >= 1 and pos.isdigit() and row[col["queue"]]):
                    return (f"{where}: eviction row with num_candidates {nc!r}, position "
                            f"{pos!r}, queue {row[col['queue']]!r}"), evictions
                evictions += run == "candidate"
    if "candidate" not in last:
        return "ledger.csv has no row of the candidate run", evictions
    return None, evictions


def _requests_problem(path: Path) -> str | None:
    if not path.is_file():
        return "the replay wrote no requests.csv"
    with open(path, newline="", encoding="utf-8") as fh:
        rows = csv.reader(fh)
        if next(rows, None) != list(REQUEST_COLUMNS):
            return "requests.csv does not start with psgate's requests header"
        for n, row in enumerate(rows, 2):
            if len(row) != len(REQUEST_COLUMNS):
                return (f"requests.csv line {n}: {len(row)} fields, expected "
                        f"{len(REQUEST_COLUMNS)}")
    return None


def _outputs_difference(a: Path, b: Path, what_a: str, what_b: str) -> str | None:
    """The first row in which two replays' ledger.csv (then requests.csv) differ: its run
    and seq (request id), and both lines; or None when both files are identical."""
    for name, ident in (("ledger.csv", ("seq", 2)), ("requests.csv", ("request", 2))):
        xa, xb = (a / name).read_bytes(), (b / name).read_bytes()
        if xa == xb:
            continue
        la = xa.decode("utf-8", "replace").splitlines()
        lb = xb.decode("utf-8", "replace").splitlines()
        for i, (x, y) in enumerate(zip(la, lb)):
            if x != y:
                row = next(csv.reader([x]), [""] * 3) + [""] * 3
                return (f"{name} line {i + 1} (run {row[0]}, {ident[0]} {row[ident[1]]}) "
                        f"differs: {what_a} {_one_line(x, 200)!r}, {what_b} "
                        f"{_one_line(y, 200)!r}")
        return f"{name} has {len(la)} lines {what_a} and {len(lb)} {what_b}"
    return None


def _stopped(run: _Run) -> str:
    """Why a replay did not complete, in one line."""
    if run.problems:
        return run.problems[0][1]
    return _one_line(run.result.aborted)


def _names_fault(aborted: str, exc: BaseException) -> bool:
    """Whether the engine's abort message is about exc (policy_fault's wording)."""
    return f"raised {type(exc).__name__}: {exc}" in aborted


def _is_policy_fault(message: str) -> bool:
    """The engine's PolicyFault messages: a victim that was no candidate, or a batch of
    the wrong size."""
    return "which is not an eviction candidate" in message or " blocks where " in message


def _is_rank_fault(message: str) -> bool:
    """The engine's refusal of a user's decision whose ranking fields the ledger cannot
    write (ReplayEngine.check_decisions)."""
    return " with rank " in message and ("is not JSON" in message or "not finite" in message
                                         or "expected a dict" in message)


# -- the checks ------------------------------------------------------------------------
class _Checker:
    def __init__(self, source: PolicySource, params: dict, seed: int, examples: int,
                 limit: float) -> None:
        self.source = source
        self.cls = source.cls
        self.params = params
        self.seed = seed
        self.examples = examples
        self.limit = limit
        # psgate's built-in policies included: check-policy holds them to the contract too
        self.files = policy_code_files(self.cls)
        self.has_candidates = self.cls.candidates is not EvictionPolicy.candidates
        self.probe: _Probe | None = None       # the instance replaying now (for the timer)
        self.stuck: str | None = None          # the contract that timed out
        self.contracts: tuple[str, ...] = tuple(DEFAULT_CONTRACTS)
        self.tmp: Path | None = None
        self.cases: list[_Case] = []
        self.receipt_case: _Case | None = None  # the end-to-end replays' trace
        self.here: Path | None = None          # the first end-to-end replay's output

    # -- loading --------------------------------------------------------------------
    def load(self) -> None:
        """Construct the policy once, under the time limit: a constructor that refuses
        the parameters, raises or never returns is a spec that does not load (exit 2)."""
        try:
            with self._time_limit():
                policy = construct(self.source, self.params, "--param")
                table = policy.contract_table()
        except _TimedOut as exc:
            raise InputError(f"policy '{self.source.spec}': constructing it {exc}") from None
        except PsgateError:
            raise
        except Exception as exc:   # noqa: BLE001 - a built-in's constructor or a table
            what = self._fault_text("constructing it", exc)
            raise InputError(f"policy '{self.source.spec}': {what}") from None
        if table is not None:
            names = [c for c in table if type(c) is str and c]
            if not names:
                raise InputError(f"policy '{self.source.spec}': contract_table() names no "
                                 f"contract, so no trace can be replayed under it")
            self.contracts = tuple(sorted(names))

    def policy_record(self) -> dict:
        src = self.source
        return {"name": self.cls.name, "class": src.class_name, "kind": src.kind,
                "api_version": self.cls.api_version, "sha256": src.sha256,
                "params": self.params}

    # -- the run --------------------------------------------------------------------
    def run(self):
        """Each contract's result, in CONTRACTS order, as it is known."""
        with tempfile.TemporaryDirectory(prefix="psgate-check-") as tmp:
            self.tmp = Path(tmp)
            yield from self._guarded(("params-validated",), self._params_validated,
                                     runs_policy=False)
            self.cases = _corpus(self.seed, self.examples, self.contracts)
            yield from self._guarded(_REPLAY_CONTRACTS, self._replays)
            yield from self._guarded(("select-victim-pure",), self._select_victim_pure)
            yield from self._guarded(("evict-batch-consistent",), self._evict_batch)
            yield from self._guarded(("receipt-valid",), self._receipt_valid)
            yield from self._guarded(("deterministic",), self._deterministic)
            yield self._hash_seed_independent()
            yield from self._guarded(("hypothesis-traces",), self._hypothesis)

    def _guarded(self, names: tuple[str, ...], fn, runs_policy: bool = True):
        """fn's results for ``names`` under the time limit; a time-out fails the first
        name and skips the rest, and every later contract that would run the policy."""
        if runs_policy and self.stuck is not None:
            for name in names:
                yield ContractResult(name, SKIP, f"not run: the policy timed out in "
                                     f"{self.stuck}")
            return
        try:
            with self._time_limit():
                results = fn()
        except _TimedOut as exc:
            self.stuck = names[0]
            yield ContractResult(names[0], FAIL, str(exc))
            for name in names[1:]:
                yield ContractResult(name, SKIP, f"not judged: the replays timed out "
                                     f"({names[0]})")
            return
        for result in results:
            yield result

    @contextmanager
    def _time_limit(self):
        if threading.current_thread() is not threading.main_thread() or \
                not hasattr(signal, "setitimer"):
            yield
            return
        limit = self.limit

        def expired(signum, frame):
            raise _TimedOut(f"timed out after {limit:g} s{self._stuck_where(frame)}")

        unraisable = sys.unraisablehook

        def ignored(u) -> None:
            # Raised where Python ignores exceptions (a gc callback, a __del__): the timer
            # fires again shortly, so this one is dropped, not printed as a traceback.
            if not isinstance(u.exc_value, _TimedOut):
                unraisable(u)

        previous = signal.signal(signal.SIGALRM, expired)
        sys.unraisablehook = ignored
        signal.setitimer(signal.ITIMER_REAL, limit, 0.25)
        try:
            yield
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
            sys.unraisablehook = unraisable

    def _stuck_where(self, frame) -> str:
        """' in <hook> (file:line)': the hook running and the innermost line of the
        policy's code on the stack when time ran out."""
        loc = None
        f = frame
        while f is not None:
            if f.f_code.co_filename in self.files:
                loc = f
                break
            f = f.f_back
        probe = self.probe
        hook = probe.stack[-1] if probe is not None and probe.stack else None
        if hook is None and loc is not None:
            outer = loc
            f = loc.f_back
            while f is not None:         # the outermost frame of the policy's code
                if f.f_code.co_filename in self.files:
                    outer = f
                f = f.f_back
            hook = outer.f_code.co_name
        if hook is None:
            return " (outside the policy's hooks: raise --time-limit for a slow policy)"
        where = (f" ({_shown_path(loc.f_code.co_filename)}:{loc.f_lineno})"
                 if loc is not None else "")
        return f" in {hook}{where}"

    def _locate(self, tb) -> str:
        """file:line of the innermost frame of the policy's code in a traceback, else of
        the innermost frame."""
        last = tb
        while last is not None and last.tb_next is not None:
            last = last.tb_next
        at = innermost_frame(tb, self.files) or last
        if at is None:
            return "an unknown place"
        return f"{_shown_path(at.tb_frame.f_code.co_filename)}:{at.tb_lineno}"

    def _fault_text(self, hook: str, exc: BaseException) -> str:
        return (f"{hook} raised {type(exc).__name__}: {_one_line(exc, 160)} at "
                f"{self._locate(exc.__traceback__)}")

    # -- one in-process replay -------------------------------------------------------
    def _prepare(self, case: _Case) -> None:
        if case.path is None:
            case.path = self.tmp / f"{case.name}.jsonl"
            write_trace(case.path, case.lines)
            case.hashes = HashTable()
            case.header, case.summary = validate_trace(str(case.path), case.hashes)

    def _new_policy(self) -> EvictionPolicy:
        return construct(self.source, self.params, "--param")

    def _replay(self, case: _Case, scheduler: str, *, log: _Log | None = None,
                paranoid: bool = True, batch: bool | None = None,
                wrap: Callable[[EvictionPolicy], None] | None = None) -> _Run:
        """One replay of case in this process with a fresh, probed policy: ``batch``
        False makes the engine call select_victim/on_evict itself, ``wrap`` may wrap the
        probed hooks further."""
        self._prepare(case)
        policy = self._new_policy()
        probe = _Probe(policy)
        if wrap is not None:
            wrap(policy)
        problems: list[tuple[str, str]] = []
        result = None
        src = TraceSource(case.name, case.path)
        self.probe = probe
        try:
            if policy.needs_future:
                policy.set_future(future_uses(src, case.hashes))
            engine = engine_class("sim", scheduler)(
                header=case.header, hashes=case.hashes, capacity=case.capacity,
                policy=policy, contracts=self.contracts, done_ids=case.summary.done_ids,
                recorder=log, paranoid=paranoid, trace_path=case.name,
                groups=case.summary.groups)
            if batch is not None:
                engine.batch_evictions = batch and engine.batch_evictions
            if log is not None:
                log.engine = engine
            if paranoid and not self.has_candidates:
                # The paranoid recount compares candidates() with the checker's set; a
                # policy without it is checked by its num_candidates count alone.
                policy.candidates = lambda: [b for b in range(1, engine.num_blocks)
                                             if engine.ref[b] == 0
                                             and engine.key[b] != NO_KEY]
            with TraceReader(src, case.hashes, validated=case.summary) as reader:
                result = engine.run(reader.events())
        except _Violation as v:
            problems.append((v.contract, v.detail))
        except PsgateError as exc:
            problems.append(("runs-cleanly", f"the replay stopped: {_one_line(exc)}"))
        except Exception as exc:   # noqa: BLE001 - the policy's, or what it returned
            problems.append(("runs-cleanly", self._crash_text(probe, exc)))
        finally:
            self.probe = None
        if result is not None:
            if result.aborted is not None:
                if probe.fault is not None and _names_fault(result.aborted, probe.fault[1]):
                    problems.append(("runs-cleanly", self._fault_text(*probe.fault)))
                elif _is_policy_fault(result.aborted):
                    problems.append(("victims-are-candidates", _one_line(result.aborted)))
                elif _is_rank_fault(result.aborted):
                    problems.append(("ledger-fields", _one_line(result.aborted)))
                else:
                    problems.append(("runs-cleanly", _one_line(result.aborted)))
            for name, verdict in sorted(result.invariants.items()):
                if not verdict.holds:
                    contract = ("victims-are-candidates" if name == "no_pinned_eviction"
                                else "hard-invariants")
                    problems.append((contract, f"invariant {name} broke: "
                                     f"{_one_line(verdict.first_violation)}"))
        if self.cls.work_conserving and (probe.refused or probe.forced):
            held = ([f"refused {probe.refused} admission(s)"] if probe.refused else []) + (
                [f"forced evictions over truly free blocks in {probe.forced} allocation(s)"]
                if probe.forced else [])
            problems.append(("work-conserving", f"the policy declares work_conserving but "
                             f"{' and '.join(held)}"))
        if log is not None and log.problem is not None:
            problems.append(("ledger-fields", log.problem))
        if probe.note_problem is not None:
            problems.append(("ledger-fields", probe.note_problem))
        suffix = f" ({case.where(scheduler)})"
        return _Run(result, log, probe, [(c, d + suffix) for c, d in problems])

    def _crash_text(self, probe: _Probe, exc: BaseException) -> str:
        if probe.fault is not None and probe.fault[1] is exc:
            return self._fault_text(*probe.fault)
        last = f"; the policy's last hook: {probe.last}" if probe.last else ""
        return (f"the replay failed with {type(exc).__name__}: {_one_line(exc, 160)} at "
                f"{self._locate(exc.__traceback__)}{last}")

    # -- contracts -------------------------------------------------------------------
    def _params_validated(self) -> list[ContractResult]:
        name = "params-validated"
        cls = self.cls

        def fail(detail: str) -> list[ContractResult]:
            return [ContractResult(name, FAIL, detail)]

        try:
            construct(self.source, {**self.params, _UNKNOWN_PARAM: 1}, "--param")
        except InputError:
            pass
        except Exception as exc:   # noqa: BLE001 - a built-in's constructor
            return fail(self._fault_text("__init__", exc))
        else:
            return fail(f"{cls.__name__}(**params) accepted an unknown parameter "
                        f"'{_UNKNOWN_PARAM}'; refuse what defaults does not declare "
                        f"(EvictionPolicy.__init__(**params) does)")
        given = {**cls.defaults, **self.params}
        try:
            policy = construct(self.source, given, "--param")
        except InputError as exc:
            return fail(f"constructing it with its defaults given explicitly was refused: "
                        f"{_one_line(exc)}")
        except Exception as exc:   # noqa: BLE001
            return fail(self._fault_text("__init__", exc))
        try:
            desc = policy.describe()
        except Exception as exc:   # noqa: BLE001 - the user's describe()
            return fail(self._fault_text("describe", exc))
        if type(desc) is not dict or desc.get("name") != cls.name:
            return fail(f"describe() returned {_short(desc)}, expected a dict whose 'name' "
                        f"is the policy's name '{cls.name}'")
        recorded = desc.get("params")
        if type(recorded) is not dict:
            return fail(f"describe()['params'] is {_short(recorded)}, expected a dict of the "
                        f"parameters used")
        problem = _json_problem(desc, "describe()")
        if problem is not None:
            return fail(f"{problem} (a receipt records describe() as JSON)")
        for key, value in sorted(given.items()):
            if key not in recorded or _short(recorded[key], 10_000) != _short(value, 10_000):
                return fail(f"constructed with {key}={_short(value, 60)}, describe() records "
                            f"{key}={_short(recorded.get(key, '<missing>'), 60)}")
        return [ContractResult(name, PASS, f"unknown parameter refused; describe() records "
                               f"{len(recorded)} parameter(s) as JSON")]

    def _replays(self) -> list[ContractResult]:
        """The corpus pass: every case under both schedulers, paranoid, probed and logged;
        per contract the first problem found, with its trace."""
        first: dict[str, tuple[str, dict]] = {}
        runs = completed = evictions = preemptions = cancels = dones = rejected = 0
        decisions = 0
        for case in self.cases:
            for scheduler in SCHEDULERS:
                run = self._replay(case, scheduler, log=_Log())
                runs += 1
                for contract, detail in run.problems:
                    first.setdefault(contract, (detail, case.example(scheduler)))
                decisions += len(run.log.decisions)
                if run.completed:
                    completed += 1
                    counts = run.result.counts
                    evictions += run.result.evictions
                    preemptions += counts.get("preemptions", 0)
                    cancels += counts["cancelled"] + counts["dropped"]
                    rejected += counts["rejected"]
            dones += sum(1 for e in case.lines if e.get("op") == "done")
        over = f"over {completed} replays"
        if completed < runs:
            over += f" (of {runs}: the others stopped early, see the failures)"
        passes = {
            "runs-cleanly": f"{runs} paranoid replays of {len(self.cases)} generated traces "
                            f"(seed {self.seed}, service and step schedulers) ran to their end",
            "victims-are-candidates": f"{evictions} victims, each a candidate when chosen, "
                                      f"{over}",
            "hard-invariants": f"every hard invariant held {over}: {evictions} evictions, "
                               f"{preemptions} preemptions, {cancels} cancels, {dones} done "
                               f"events, {rejected} rejections"
                               + ("" if self.has_candidates else "; candidates() is not "
                                  "implemented, so the candidate set was checked by count"),
            "work-conserving": f"no admission refused, no eviction forced over free blocks, "
                               f"{over}",
            "ledger-fields": f"{decisions} decisions and every end_admit note explained their "
                             f"ledger rows, {over}",
        }
        results = []
        for contract in _REPLAY_CONTRACTS:
            if contract == "work-conserving" and not self.cls.work_conserving:
                results.append(ContractResult(contract, SKIP, "the policy declares "
                                              "work_conserving = False"))
            elif contract in first:
                detail, example = first[contract]
                results.append(ContractResult(contract, FAIL, detail, example))
            elif completed == 0:
                results.append(ContractResult(contract, SKIP, "not judged: no replay ran to "
                                              "its end (runs-cleanly)"))
            else:
                results.append(ContractResult(contract, PASS, passes[contract]))
        return results

    def _pairs(self, share: int = 2):
        """(case, scheduler) for the comparison contracts: the first 1/share of the
        corpus, both schedulers."""
        for case in self.cases[:max(1, len(self.cases) // share)]:
            for scheduler in SCHEDULERS:
                yield case, scheduler

    def _select_victim_pure(self) -> list[ContractResult]:
        name = "select-victim-pure"
        has_candidates = self.has_candidates

        def twice(policy: EvictionPolicy) -> None:
            inner = policy.select_victim
            candidates = policy.candidates

            def select_victim(req, now_ns):
                before = list(candidates()) if has_candidates else None
                count = policy.num_candidates
                d1 = inner(req, now_ns)
                after = list(candidates()) if has_candidates else None
                if before != after:
                    raise _Violation(name, f"candidates() changed across one select_victim "
                                     f"call (request {req.id}): {_short(before, 80)} became "
                                     f"{_short(after, 80)}")
                if policy.num_candidates != count:
                    raise _Violation(name, f"num_candidates went from {count} to "
                                     f"{policy.num_candidates} across one select_victim call "
                                     f"(request {req.id})")
                d2 = inner(req, now_ns)
                if not _same_decision(d1, d2):
                    raise _Violation(name, f"two select_victim calls in a row (request "
                                     f"{req.id}) gave {_decision_difference(d1, d2)}")
                return d2
            policy.select_victim = select_victim

        compared = 0
        for case, scheduler in self._pairs():
            plain = self._replay(case, scheduler, log=_Log(judge=False), paranoid=False,
                                 batch=False)
            if not plain.completed:
                continue        # runs-cleanly or victims-are-candidates says why
            doubled = self._replay(case, scheduler, log=_Log(judge=False), paranoid=False,
                                   batch=False, wrap=twice)
            compared += 1
            mine = doubled.first(name)
            if mine is None and not doubled.completed:
                mine = (f"calling select_victim once more before each eviction broke the "
                        f"replay: {_stopped(doubled)}")
            if mine is None:
                diff = _first_difference(plain, doubled, "in the plain replay",
                                         "with select_victim called twice")
                if diff is not None:
                    mine = f"{diff} ({case.where(scheduler)})"
            if mine is not None:
                return [ContractResult(name, FAIL, mine, case.example(scheduler))]
        if not compared:
            return [ContractResult(name, SKIP, "not judged: no plain replay ran to its end "
                                   "(runs-cleanly)")]
        extra = "" if has_candidates else "; candidates() not implemented, not compared"
        return [ContractResult(name, PASS, f"{compared} replays with every select_victim "
                               f"called twice decided as the plain ones{extra}")]

    def _evict_batch(self) -> list[ContractResult]:
        name = "evict-batch-consistent"
        cls = self.cls
        if cls.evict_batch is EvictionPolicy.evict_batch:
            return [ContractResult(name, SKIP, "the class does not override evict_batch")]
        if not cls.batches_evictions():
            return [ContractResult(name, SKIP, "evict_batch is not used: select_victim or "
                                   "on_evict is overridden below the class that defines it")]
        compared = 0
        for case, scheduler in self._pairs():
            batched = self._replay(case, scheduler, log=_Log())
            single = self._replay(case, scheduler, log=_Log(), batch=False)
            if not single.completed:
                continue
            if not batched.completed:
                return [ContractResult(name, FAIL, f"evict_batch broke a replay that "
                                       f"select_victim + on_evict complete: "
                                       f"{_stopped(batched)}", case.example(scheduler))]
            compared += 1
            diff = _first_difference(single, batched, "by select_victim + on_evict",
                                     "by evict_batch")
            if diff is None:
                quiet = self._replay(case, scheduler, paranoid=False)
                if not quiet.completed:
                    diff = (f"evict_batch without a recorder (decisions=None) broke the "
                            f"replay: {_stopped(quiet)}")
                elif quiet.outcomes() != single.outcomes() or \
                        quiet.result.evictions != single.result.evictions:
                    diff = _outcome_difference(single, quiet, "by select_victim + on_evict",
                                               "by evict_batch without a recorder")
            if diff is not None:
                return [ContractResult(name, FAIL, f"{diff} ({case.where(scheduler)})",
                                       case.example(scheduler))]
        if not compared:
            return [ContractResult(name, SKIP, "not judged: no replay ran to its end "
                                   "(runs-cleanly)")]
        return [ContractResult(name, PASS, f"{compared} replays: the same victims, decisions "
                               f"and outcomes as select_victim + on_evict")]

    def _receipt_valid(self) -> list[ContractResult]:
        name = "receipt-valid"
        case = _receipt_case(self.seed, self.contracts)
        self._prepare(case)
        self.receipt_case = case
        out = self.tmp / "replay-here-1"
        failed = self._end_to_end(case, out)
        if failed is not None:
            return [ContractResult(name, FAIL, failed, case.example("step"))]
        receipt = json.loads((out / "receipt.json").read_text(encoding="utf-8"))
        try:
            validate_receipt(receipt)
        except RuntimeError as exc:
            return [ContractResult(name, FAIL, _one_line(exc), case.example("step"))]
        run = receipt["runs"]["candidate"]
        if run["aborted"] is not None:
            return [ContractResult(name, FAIL, f"the candidate run aborted: "
                                   f"{_one_line(run['aborted'])}", case.example("step"))]
        broken = sorted(n for n, v in run["invariants"].items() if not v["holds"])
        if broken:
            v = run["invariants"][broken[0]]
            return [ContractResult(name, FAIL, f"invariant {broken[0]} broke in the candidate "
                                   f"run: {_one_line(v['first_violation'])}",
                                   case.example("step"))]
        problem, evictions = _ledger_problem(out / "ledger.csv")
        if problem is None:
            problem = _requests_problem(out / "requests.csv")
        if problem is not None:
            return [ContractResult(name, FAIL, problem, case.example("step"))]
        self.here = out
        return [ContractResult(name, PASS, f"receipt valid against its schema; ledger: "
                               f"{evictions} eviction rows of the candidate, every row "
                               f"well-formed")]

    def _replay_config(self, case: _Case, out: Path) -> ReplayConfig:
        """The end-to-end replay as a user runs it; not paranoid (the corpus pass is, and
        a paranoid replay calls candidates(), which a policy need not implement)."""
        return ReplayConfig(trace=str(case.path), trace_label=case.name, baseline="lru",
                            candidate=self.source.spec,
                            candidate_params=dict(self.params), capacity=case.capacity,
                            out=out, ledger_compression="none", allow_unexercised=True,
                            scheduler="step")

    def _end_to_end(self, case: _Case, out: Path) -> str | None:
        """One psgate.api replay into out; a one-line failure, or None."""
        try:
            replay(self._replay_config(case, out))
        except PsgateError as exc:
            return f"the replay stopped: {_one_line(exc)}"
        except Exception as exc:   # noqa: BLE001 - the policy's, or what it returned
            return (f"the replay failed with {type(exc).__name__}: {_one_line(exc, 160)} at "
                    f"{self._locate(exc.__traceback__)}")
        return None

    def _deterministic(self) -> list[ContractResult]:
        name = "deterministic"
        first = self.here
        if first is None:
            return [ContractResult(name, SKIP, "not judged: the end-to-end replay did not "
                                   "complete (receipt-valid)")]
        case = self.receipt_case
        out = self.tmp / "replay-here-2"
        failed = self._end_to_end(case, out)
        if failed is not None:
            return [ContractResult(name, FAIL, f"the same replay again: {failed}",
                                   case.example("step"))]
        diff = _outputs_difference(first, out, "in the first replay", "in the second")
        if diff is not None:
            return [ContractResult(name, FAIL, diff, case.example("step"))]
        return [ContractResult(name, PASS, "two replays in one process wrote byte-identical "
                               "ledger.csv and requests.csv")]

    def _hash_seed_independent(self) -> ContractResult:
        name = "hash-seed-independent"
        if self.stuck is not None:
            return ContractResult(name, SKIP, f"not run: the policy timed out in {self.stuck}")
        here = self.here
        if here is None:
            return ContractResult(name, SKIP, "not judged: the end-to-end replay did not "
                                  "complete (receipt-valid)")
        src = self.source
        if src.kind == BUILTIN and not self.cls.__module__.startswith("psgate.policies."):
            return ContractResult(name, SKIP, "the policy is registered at run time only, so "
                                  "a fresh interpreter cannot load it by name")
        case = self.receipt_case
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p or os.getcwd() for p in sys.path)
        procs = []
        for hash_seed in HASH_SEEDS:
            out = self.tmp / f"replay-hashseed-{hash_seed}"
            cmd = [sys.executable, "-m", "psgate", "replay", "--trace", str(case.path),
                   "--baseline", "lru", "--candidate", src.spec, "--capacity",
                   str(case.capacity), "--out", str(out), "--ledger-compression", "none",
                   "--scheduler", "step", "--allow-unexercised", "--quiet"]
            for key, value in self.params.items():
                cmd += ["--candidate-param", f"{key}={json.dumps(value)}"]
            procs.append((hash_seed, out, subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE, env={**env, "PYTHONHASHSEED": hash_seed})))
        outs = {}
        failure = None
        deadline = time.monotonic() + self.limit       # both run at once, under one limit
        try:
            for hash_seed, out, proc in procs:
                try:
                    _, stderr = proc.communicate(timeout=max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    self.stuck = name
                    return ContractResult(name, FAIL, f"timed out after {self.limit:g} s in "
                                          f"the replay under PYTHONHASHSEED={hash_seed}",
                                          case.example("step"))
                if proc.returncode not in (0, 1) and failure is None:
                    lines = stderr.decode("utf-8", "replace").strip().splitlines()
                    failure = (f"the replay under PYTHONHASHSEED={hash_seed} exited "
                               f"{proc.returncode}: {_one_line(lines[-1] if lines else '')}")
                outs[hash_seed] = out
        finally:        # a time-out, an interrupt: no interpreter is left running
            for _, _, proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.communicate()
        if failure is not None:
            return ContractResult(name, FAIL, failure, case.example("step"))
        a, b = HASH_SEEDS
        diff = (_outputs_difference(outs[a], outs[b], f"under PYTHONHASHSEED={a}",
                                    f"under PYTHONHASHSEED={b}")
                or _outputs_difference(here, outs[a], "in this process",
                                       f"under PYTHONHASHSEED={a}"))
        if diff is not None:
            return ContractResult(name, FAIL, diff, case.example("step"))
        return ContractResult(name, PASS, f"replays under PYTHONHASHSEED={a} and {b} wrote "
                              f"the ledgers written here")

    def _hypothesis(self) -> list[ContractResult]:
        name = "hypothesis-traces"
        try:
            import hypothesis
            from hypothesis import strategies as st
        except ImportError:
            return [ContractResult(name, SKIP, "hypothesis is not installed (pip install "
                                   "hypothesis); the other contracts ran on seeded traces")]
        failures: list[tuple[str, str, dict, int]] = []   # ..., the example's number
        examples = [0]
        judged = set(_REPLAY_CONTRACTS)

        def prop(drawn) -> None:
            if failures and examples[0] - failures[0][3] >= SHRINK_EXAMPLES:
                raise _ShrinkDone()
            lines, capacity, scheduler = drawn
            examples[0] += 1
            case = _Case("hypothesis-trace", lines, capacity)
            case.path = self.tmp / "hypothesis-trace.jsonl"
            write_trace(case.path, lines)
            case.hashes = HashTable()
            case.header, case.summary = validate_trace(str(case.path), case.hashes)
            run = self._replay(case, scheduler, log=_Log())
            problems = [(c, d) for c, d in run.problems if c in judged]
            if problems:
                contract, detail = problems[0]
                failures.append((contract, detail, case.example(scheduler), examples[0]))
                raise AssertionError(f"{contract}: {detail}")

        checks = [h for h in (getattr(hypothesis.HealthCheck, n, None)
                              for n in ("too_slow", "filter_too_much", "data_too_large",
                                        "large_base_example")) if h is not None]
        test = hypothesis.settings(max_examples=self.examples, deadline=None, database=None,
                                   verbosity=hypothesis.Verbosity.quiet,
                                   suppress_health_check=checks, print_blob=False)(
            hypothesis.seed(self.seed)(hypothesis.given(
                _hypothesis_cases(st, self.contracts))(prop)))
        from hypothesis.configuration import set_hypothesis_home_dir
        # Hypothesis keeps caches under its home directory (./.hypothesis by default):
        # check-policy leaves nothing in the user's working directory.
        set_hypothesis_home_dir(self.tmp / "hypothesis-home")
        try:
            test()
        except (_TimedOut, _ShrinkDone) as exc:
            if not failures:
                raise
            contract, detail, example, _ = failures[-1]
            why = ("time ran out while shrinking it" if isinstance(exc, _TimedOut)
                   else f"shrunk for {SHRINK_EXAMPLES} examples")
            return [ContractResult(name, FAIL, f"{contract}: {detail}; {why}", example)]
        except Exception as exc:   # noqa: BLE001 - the property's failure, or hypothesis'
            if not failures:
                return [ContractResult(name, FAIL, f"hypothesis stopped: "
                                       f"{type(exc).__name__}: {_one_line(exc)}")]
            contract, detail, example, _ = failures[-1]
            requests = sum(1 for e in example["trace"] if e.get("op") == "request")
            return [ContractResult(name, FAIL, f"{contract}: {detail}; shrunk to "
                                   f"{requests} request(s)", example)]
        finally:
            set_hypothesis_home_dir(None)     # back to hypothesis' own choice
        return [ContractResult(name, PASS, f"{examples[0]} hypothesis-generated traces "
                               f"(seed {self.seed}): every replay complete, every victim a "
                               f"candidate, every invariant and ledger field held")]
