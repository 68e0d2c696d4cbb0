"""Rates from the step model (``rates=step``): C_prefill measured under vLLM's scheduler
(psgate.workloads.common.step_makespan_ns), checked by hand on tiny cases and against the
step scheduler itself; the header records which model set the rates; the per-request
model's traces stay as they were."""

from __future__ import annotations

import pytest

from psgate.bench.traces import load, make_engine
from psgate.engines.step_cost import SchedulerParams, StepCostModel
from psgate.errors import InputError
from psgate.experiment import ExperimentConfig, _plan
from psgate.api import ReplayConfig
from psgate.policies import make_policy
from psgate.trace.writer import dump_lines, header_line, write_trace
from psgate.workloads import generate
from psgate.workloads.common import (StepRates, chain, request, step_makespan_ns,
                                     step_prefill_rate)

RATE_KINDS = ("one-touch", "low-and-slow", "two-pass-replay", "sharegpt", "sharegpt-bursty",
              "cold")


def test_makespan_by_hand_one_step_of_prefill_then_decodes():
    # 2 x 32-token prompts, 2 output tokens, room for everything: step 1 prefills both
    # (64 tokens, no context): 10 + 0.06 x 64 = 13.84 ms and samples token 1 of each;
    # step 2 decodes both (contexts 32 + 32): 10 + 0.1 x 2 = 10.2 ms; together 24.04 ms.
    assert step_makespan_ns(StepRates(), 2, 32, 2, 16, 64) == 24_040_000
    rate, measured = step_prefill_rate(StepRates(), 32, 2, 16, 64, n=2)
    assert rate == pytest.approx(2 / 0.02404)
    assert measured["makespan_s"] == 0.02404 and measured["requests"] == 2


def test_makespan_by_hand_token_budget_chunks_the_second_prompt():
    # budget 40: step 1 = request 0's 32 tokens + 8 of request 1's (10 + 0.06 x 40 =
    # 12.4 ms; request 0 samples its only token and finishes); step 2 = request 1's other
    # 24 tokens after 8 of context: 10 + 0.06 x 24 + 0.002 x 8 = 11.456 ms.
    model = StepRates(sched=SchedulerParams(max_num_batched_tokens=40))
    assert step_makespan_ns(model, 2, 32, 1, 16, 64) == 12_400_000 + 11_456_000


def test_makespan_by_hand_the_cache_holds_one_request_at_a_time():
    # 3 configured blocks (2 usable), prompts of 2 blocks: the second waits for the first
    # to finish (its whole sequence must fit): two steps of 10 + 0.06 x 32 = 11.92 ms.
    assert step_makespan_ns(StepRates(), 2, 32, 1, 16, 3) == 2 * 11_920_000
    with pytest.raises(ValueError):
        step_makespan_ns(StepRates(), 1, 48, 1, 16, 3)      # 3 blocks never fit in 2


def _engine_makespan(tmp_path, n, prompt, out, capacity, model: StepRates) -> int:
    bs = 16
    lines = [header_line(bs, hashing="synthetic-blake2b-128", source="test")]
    lines += [request(0.0, f"r{i}", "g", "standard", chain(f"p{i}", prompt // bs),
                      prompt % bs, out, f"p{i}", "benign") for i in range(n)]
    path = tmp_path / f"t{n}-{prompt}-{out}-{capacity}.jsonl"
    write_trace(path, lines)
    loaded = load(path)
    eng = make_engine(loaded, make_policy("lru", {}), capacity, scheduler="step",
                      step_cost=model.step_cost, sched=model.sched)
    eng.run(loaded.events)
    assert eng.counts["preemptions"] == 0 and eng.counts["unfinished"] == 0
    return eng.now - eng.start_ns


@pytest.mark.parametrize("n, prompt, out, capacity, model", [
    (32, 1568, 32, 512, StepRates()),                   # one-touch's C_prefill at 512 blocks
    (32, 1568, 32, 100_000, StepRates()),               # the cache never binds
    (7, 3000, 40, 512, StepRates()),                    # prompts longer than the budget
    (9, 600, 5, 256, StepRates(StepCostModel(fixed_ms=3.0, per_decode_context_token_ms=0.01),
                               SchedulerParams(max_num_batched_tokens=512, max_num_seqs=4,
                                               long_prefill_token_threshold=200))),
])
def test_makespan_is_the_step_schedulers(tmp_path, n, prompt, out, capacity, model):
    assert step_makespan_ns(model, n, prompt, out, 16, capacity) == _engine_makespan(
        tmp_path, n, prompt, out, capacity, model)


def test_one_touch_header_records_the_step_model_and_its_rates():
    lines = generate("one-touch", {"rates": "step"})
    gen = lines[0]["generator"]
    d = gen["derived"]
    assert gen["params"]["rates"] == "step"
    rm = d["rate_model"]
    assert rm["kind"] == "step"
    assert rm["scheduler"] == SchedulerParams().to_json()
    assert rm["step_cost"] == StepCostModel().to_json()
    m = rm["c_prefill_measured"]
    assert (m["requests"], m["prompt_tokens"], m["out_tokens"], m["configured_blocks"]) == (
        32, 1568, 32, 512)
    ns = step_makespan_ns(StepRates(), 32, 1568, 32, 16, 512)
    assert d["c_prefill_per_s"] == round(32 / (ns / 1e9), 6)
    assert d["victim_rate_per_s"] == round(0.6 * 32 / (ns / 1e9), 6)
    # below the per-request model's 10.09/s: five such requests fit the cache at once
    assert 5.0 < d["c_prefill_per_s"] < 7.0
    # a step model given by the caller sets the rates, and the header says which
    slow = StepRates(StepCostModel(fixed_ms=20.0))
    d2 = generate("one-touch", {"rates": "step"}, cost=slow)[0]["generator"]["derived"]
    assert d2["rate_model"]["step_cost"]["fixed_ms"] == 20.0
    assert d2["c_prefill_per_s"] < d["c_prefill_per_s"]


@pytest.mark.parametrize("kind", RATE_KINDS)
def test_service_rates_stay_byte_identical_and_step_rates_differ(kind):
    small = {"cold": {"duration_s": 5.0}, "sharegpt": {"conversations": 20},
             "sharegpt-bursty": {"conversations": 20}}.get(kind, {"attack_requests": 20})
    plain = generate(kind, small)
    assert "rates" not in plain[0]["generator"]["params"]
    assert "rate_model" not in plain[0]["generator"]["derived"]
    assert dump_lines(generate(kind, {**small, "rates": "service"})) == dump_lines(plain)
    step = generate(kind, {**small, "rates": "step"})
    assert step[0]["generator"]["derived"]["rate_model"]["kind"] == "step"
    if kind != "cold":          # cold's rate is a parameter; only its derived figure moves
        assert [r["t"] for r in step[1:]] != [r["t"] for r in plain[1:]]


def test_sharegpt_hold_time_is_the_request_alone_under_the_step_scheduler():
    # a 100-token prompt with 3 output tokens alone: one prefill step (10 + 6 ms), then
    # two decode steps (10.1 ms each)
    assert step_makespan_ns(StepRates(), 1, 100, 3, 16, 512) == 36_200_000


def test_rates_refused_when_wrong():
    with pytest.raises(InputError, match="rates"):
        generate("one-touch", {"rates": "fast"})
    with pytest.raises(InputError, match="rates=step"):
        generate("one-touch", {}, cost=StepRates())


def test_an_experiment_takes_step_rates_from_its_replay_model(tmp_path):
    replay = ReplayConfig(scheduler="step", step_cost=StepCostModel(fixed_ms=20.0),
                          sched=SchedulerParams(max_num_seqs=8), out=tmp_path)
    cfg = ExperimentConfig(replay=replay, workload='one-touch:rates="step"', runs=1)
    _plan(cfg)
    assert cfg.cost_for_workload == StepRates(replay.step_cost, replay.sched)
    plain = ExperimentConfig(replay=replay, workload="one-touch", runs=1)
    _plan(plain)
    assert plain.cost_for_workload == replay.cost
