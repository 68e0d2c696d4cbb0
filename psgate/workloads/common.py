"""Helpers shared by the generators: parameters and their checks, request lines,
synthetic chained block hashes, arrivals, headers."""

from __future__ import annotations

import hashlib
import random
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

from psgate.engines.cost import CostModel
from psgate.engines.step_cost import SchedulerParams, StepCostModel, StepWork
from psgate.errors import InputError

SYNTHETIC_HASHING = "synthetic-blake2b-128"


def chain(label: str, num_blocks: int, parent: str | None = None, start: int = 0) -> list[str]:
    """Chained hashes for synthetic content: block j of ``label`` after ``parent``.

    Generators have no tokens; hashing (parent, label, j) gives what real hashing
    gives: equal content at equal depth after equal parents is equal, and a
    hash determines its parent.
    """
    out = []
    prev = bytes.fromhex(parent) if parent else bytes(16)
    for j in range(start, start + num_blocks):
        h = hashlib.blake2b(prev + f"{label}/{j}".encode(), digest_size=16).digest()
        out.append(h.hex())
        prev = h
    return out


def poisson(rng: random.Random, start: float, end: float, rate: float) -> Iterator[float]:
    """Arrival times of a Poisson process of ``rate`` per second in [start, end)."""
    t = start
    while True:
        t += rng.expovariate(rate)
        if t >= end:
            return
        yield t


def cost_or_default(cost: CostModel | None) -> CostModel:
    return cost if cost is not None else CostModel()


def cost_provenance(cost: CostModel) -> dict:
    """For a header's ``derived``: which calibrated file set the rates (nothing for the
    defaults, so default traces stay byte-identical)."""
    if cost.origin is None:
        return {}
    return {"cost_model": {k: cost.origin[k] for k in ("name", "sha256", "model", "dtype",
                                                       "device")}}


def unique_prefill_rate(cost: CostModel, prompt_tokens: int, n: int = 32) -> float:
    """C_prefill: requests/s when ``n`` distinct-prefix requests of ``prompt_tokens``
    (no hits) are served back to back by one FIFO prefill server under ``cost``."""
    total_ms = n * cost.prefill_ms(prompt_tokens, 0)
    return n / (total_ms / 1000.0)


RATES = ("service", "step")
C_PREFILL_REQUESTS = 32


@dataclass(frozen=True)
class StepRates:
    """The step model a generator derives its rates from (``rates=step``): vLLM's scheduler
    with ``sched`` on ``step_cost``'s clock, the model a ``--scheduler step`` replay runs."""

    step_cost: StepCostModel = field(default_factory=StepCostModel)
    sched: SchedulerParams = field(default_factory=SchedulerParams)

    @property
    def origin(self) -> dict | None:
        """The calibrated file behind the coefficients (None for the defaults), as a
        CostModel's: what an experiment's source records."""
        return self.step_cost.origin


def rate_model(kind: str, p: dict, cost) -> CostModel | StepRates:
    """The model that sets ``kind``'s rates: parameter ``rates`` picks the form, ``cost``
    (a CostModel for service, a StepRates for step; None for the defaults) its numbers. A
    CostModel given with ``rates=step`` is the replay's per-request model, which says
    nothing about steps: the step defaults apply."""
    need(kind, p["rates"] in RATES, "rates", f"one of {', '.join(RATES)}", p["rates"])
    if p["rates"] == "service":
        if isinstance(cost, StepRates):
            raise InputError(f"workload '{kind}': a step model sets the rates only with "
                             f"rates=step", path="--param")
        return cost_or_default(cost)
    return cost if isinstance(cost, StepRates) else StepRates()


def header_params(p: dict) -> dict:
    """A header's ``params``: ``rates`` only when it is not the service default and
    ``answers`` only when true, so traces generated before they existed stay
    byte-identical."""
    return {k: v for k, v in p.items()
            if not (k == "rates" and v == "service" or k == "answers" and v is False)}


def rate_provenance(model: CostModel | StepRates, measured: dict | None = None) -> dict:
    """For a header's ``derived``: which model set the rates. The per-request model keeps
    its old record (its file's provenance, nothing for the defaults); the step model names
    its kind, scheduler settings and coefficients (or file), and ``measured``, the run
    behind C_prefill."""
    if isinstance(model, CostModel):
        return cost_provenance(model)
    out = {"kind": "step", "scheduler": model.sched.to_json(),
           "step_cost": model.step_cost.to_json()}
    if measured:
        out["c_prefill_measured"] = measured
    return {"rate_model": out}


def step_makespan_ns(model: StepRates, n: int, prompt_tokens: int, out_tokens: int,
                     block_size: int, capacity: int) -> int:
    """Nanoseconds from t = 0 until the last of ``n`` requests with distinct prompts of
    ``prompt_tokens`` (nothing cached, nothing shared), all arriving at t = 0, finishes
    its ``out_tokens`` (at least one) under vLLM's scheduler on ``capacity`` configured
    blocks.

    Why a recurrence of its own: a workload may not run a replay engine, and with nothing
    shared the block pool is a counter (a freed block is dead content, so every policy
    evicts alike). It follows psgate/engines/sched.py, which reproduces vLLM 0.32's
    ``Scheduler.schedule`` (v1/core/sched/scheduler.py:656-868 running requests first,
    one decode token or the rest of a chunk within the token budget; 900-1370 waiting
    requests FCFS while the budget and max_num_seqs allow) and ``allocate_slots``
    (v1/core/kv_cache_manager.py:522-539: a request leaving the queue must have room for
    its whole sequence; 561-579: blocks for the tokens computed so far). Steps cost what
    the step model says, rounded to whole nanoseconds as the replay clock is. One
    simplification: a preempted request (a decode with no free block; scheduler.py:792-
    858) recomputes its prompt, where the replay may still find its freed blocks cached;
    the defaults never preempt. Raises ValueError when a request can never run (its
    sequence does not fit the cache, or, without chunked prefill, the token budget)."""
    sched, bs = model.sched, block_size
    usable = capacity - 1                      # one block is vLLM's null block
    out = max(1, out_tokens)
    if -(-prompt_tokens // bs) > usable or -(-(prompt_tokens + out - 1) // bs) > usable:
        raise ValueError(f"a {prompt_tokens}-token request does not fit {capacity} blocks")
    if not sched.enable_chunked_prefill and prompt_tokens + out > sched.max_num_batched_tokens:
        raise ValueError("a request is longer than the token budget without chunked prefill")
    watermark = int(sched.watermark * capacity)
    # per request: [tokens computed, tokens so far (prompt + sampled), blocks held, sampled]
    waiting = deque([0, prompt_tokens, 0, 0] for _ in range(n))
    running: list[list[int]] = []
    held = now = 0
    while waiting or running:
        budget = sched.max_num_batched_tokens
        thr = sched.long_prefill_token_threshold if len(running) + len(waiting) > 1 else 0
        scheduled: list[tuple[list[int], int]] = []
        preempted = False
        i = 0
        while i < len(running) and budget > 0:
            r = running[i]
            k = r[1] - r[0]
            k = min(thr if 0 < thr < k else k, budget)
            more = max(0, -(-(r[0] + k) // bs) - r[2])
            while more > usable - held:            # preempt the last running request
                v = running.pop()
                held -= v[2]
                v[0] = v[2] = 0
                waiting.appendleft(v)
                preempted = True
                if v is r:
                    break
            if r[2] == 0 and r[0] == 0 and more:   # r itself was preempted
                break
            r[2] += more
            held += more
            scheduled.append((r, k))
            budget -= k
            i += 1
        while not preempted and budget > 0 and waiting and len(running) < sched.max_num_seqs:
            r = waiting[0]
            k = r[1] - r[0]
            k = thr if 0 < thr < k else k
            if not sched.enable_chunked_prefill and k > budget:
                break
            k = min(k, budget)
            room = usable - held - (watermark if running else 0)
            if -(-r[1] // bs) > room:              # the whole sequence must fit
                break
            waiting.popleft()
            running.append(r)
            r[2] = -(-k // bs)
            held += r[2]
            scheduled.append((r, k))
            budget -= k
        if not scheduled:
            if preempted:
                continue
            raise ValueError("the step scheduler cannot run these requests")
        p_tok = c_tok = d_num = d_ctx = 0
        for r, k in scheduled:
            if k == 1 and r[3] and r[0] == r[1] - 1:     # a decode
                d_num += 1
                d_ctx += r[0]
            else:
                p_tok += k
                c_tok += r[0]
        now += model.step_cost.step_ns(StepWork(p_tok, c_tok, d_num, d_ctx))
        for r, k in scheduled:
            r[0] += k
            if r[0] < r[1]:
                continue
            r[3] += 1
            r[1] += 1
            if r[3] >= out:
                running.remove(r)
                held -= r[2]
    return now


def step_prefill_rate(model: StepRates, prompt_tokens: int, out_tokens: int, block_size: int,
                      capacity: int, n: int = C_PREFILL_REQUESTS) -> tuple[float, dict]:
    """C_prefill under the step model: ``n`` / makespan of ``n`` distinct-prefix requests
    of ``prompt_tokens`` and ``out_tokens`` arriving together, served by vLLM's scheduler
    on ``capacity`` configured blocks (``step_makespan_ns``).

    The per-request model's C_prefill counts one FIFO prefill server; under the step model
    prefill chunks and decodes share each step's token budget and, at a few hundred
    blocks, the cache bounds how many requests run at once, so capacity is what the
    scheduler achieves on the workload's own request shape, decode and memory included.
    Also returns what was measured, for the header."""
    ns = step_makespan_ns(model, n, prompt_tokens, out_tokens, block_size, capacity)
    rate = n / (ns / 1e9)
    return rate, {"requests": n, "prompt_tokens": prompt_tokens, "out_tokens": out_tokens,
                  "configured_blocks": capacity, "makespan_s": round(ns / 1e9, 9),
                  "rule": "c_prefill = requests / makespan: distinct prompts arriving "
                          "together, served by the step scheduler"}


def c_prefill_rate(model: CostModel | StepRates, prompt_tokens: int, out_tokens: int,
                   block_size: int, capacity: int) -> tuple[float, dict | None]:
    """C_prefill under either model (the per-request model ignores output and blocks)."""
    if isinstance(model, CostModel):
        return unique_prefill_rate(model, prompt_tokens), None
    return step_prefill_rate(model, prompt_tokens, out_tokens, block_size, capacity)


def resolve_params(kind: str, defaults: dict, overrides: dict) -> dict:
    """The defaults with ``overrides`` on top. generate() refuses unknown parameters
    first; a generator called directly refuses them the same way."""
    unknown = sorted(set(overrides) - set(defaults))
    if unknown:
        raise InputError(f"unknown parameter(s) for '{kind}': {', '.join(unknown)}; known: "
                         f"{', '.join(defaults)}", path="--param")
    return {**defaults, **overrides}


def need(kind: str, ok: bool, key: str, what: str, value) -> None:
    """Refuses parameter ``key`` of workload ``kind`` unless ``ok``: bad input, in the
    words of generate()'s own checks, so every refusal reads alike."""
    if not ok:
        raise InputError(f"workload '{kind}': '{key}' expects {what}, found {value!r}",
                         path="--param")


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def positive(kind: str, p: dict, *keys: str) -> None:
    for k in keys:
        need(kind, _number(p[k]) and p[k] > 0, k, "a value > 0", p[k])


def nonneg(kind: str, p: dict, *keys: str) -> None:
    for k in keys:
        need(kind, _number(p[k]) and p[k] >= 0, k, "a value >= 0", p[k])


def fraction(kind: str, p: dict, *keys: str) -> None:
    for k in keys:
        need(kind, _number(p[k]) and 0 <= p[k] <= 1, k, "a fraction in [0, 1]", p[k])


def ordered(kind: str, p: dict, lo: str, hi: str) -> None:
    need(kind, p[lo] <= p[hi], hi, f"a value >= {lo} ({p[lo]})", p[hi])


def whole_block(kind: str, p: dict, *keys: str) -> None:
    """Token counts that must hold at least one full block (a prompt's shared part)."""
    bs = p["block_size"]
    for k in keys:
        need(kind, p[k] >= bs, k, f"at least one block ({bs} tokens)", p[k])


def distinct(kind: str, p: dict, *keys: str) -> None:
    """Groups that must differ: a victim measured against itself measures nothing."""
    for i, k in enumerate(keys):
        need(kind, p[k] not in [p[j] for j in keys[:i]], k,
             f"a group other than {' and '.join(keys[:i])}", p[k])


def request(t: float, rid: str, group: str, contract: str, blocks: list[str], tail: int,
            out: int, prefix: str, role: str, *, measure: bool = True, scope: str = "m",
            **extra) -> dict:
    """A request line (``t`` to the microsecond); ``measure`` is written only when false
    and ``extra`` (priority hints, ...) last, so lines without them stay as they were."""
    r = {"t": round(t, 6), "op": "request", "id": rid, "group": group, "contract": contract,
         "scope": scope, "blocks": blocks, "tail": tail, "out": out, "prefix": prefix,
         "role": role}
    if not measure:
        r["measure"] = False
    r.update(extra)
    return r
