"""Cost-model files and psgate calibrate.

The fits (step and per-request), the file format (versions 1 and 2), the step and
service loaders, --cost-model on replay and trace gen, and the errors run in the base test
environment (numpy comes with matplotlib). The real calibration (batched steps timed on a
tiny grid) needs torch and transformers: it runs in the interpreter PSGATE_CALIBRATE_PYTHON
names (CI builds one with scripts/install-calibrate.sh and sets PSGATE_REQUIRE_CALIBRATE=1,
so there it can never be skipped), or in this one if it has them.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import orjson
import pytest

from psgate.calibrate.fit import FORMS, fit_prefill, fit_step
from psgate.calibrate.grid import holdout_mask, step_grid, step_holdout_mask
from psgate.calibrate.measure import Timings
from psgate.calibrate.run import GRIDS, CalibrateConfig, build_document, write_document
from psgate.engines.cost import (COEFFICIENTS, V1_STEP_RULE, CostModel, load_cost_model,
                                 load_step_cost_model, step_cost_from_params)
from psgate.engines.step_cost import STEP_COEFFICIENTS, StepCostModel, StepWork
from psgate.errors import InputError
from psgate.trace.reader import validate_trace
from psgate.workloads import generate
from psgate.workloads.common import unique_prefill_rate

from helpers import heavy_python

from test_cli import assert_one_line_error, psgate, small_trace

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "examples" / "models"
TRUE = {"fixed_ms": 4.0, "per_uncached_token_ms": 0.05, "per_cached_token_ms": 0.001,
        "per_uncached_token_sq_ms": 2e-6, "per_uncached_cached_token_ms": 1e-6}


def _grid_points(cached, uncached, coef):
    u, c = np.meshgrid(np.array(uncached, float), np.array(cached, float))
    u, c = u.ravel(), c.ravel()
    y = (coef["fixed_ms"] + coef["per_uncached_token_ms"] * u + coef["per_cached_token_ms"] * c
         + coef.get("per_uncached_token_sq_ms", 0) * u * u
         + coef.get("per_uncached_cached_token_ms", 0) * u * c)
    return u, c, y


# -- the fit -------------------------------------------------------------------------

@pytest.mark.parametrize("form", sorted(FORMS))
def test_fit_recovers_known_coefficients(form):
    coef = dict(TRUE)
    if form == "linear":
        coef["per_uncached_token_sq_ms"] = coef["per_uncached_cached_token_ms"] = 0.0
    u, c, y = _grid_points([0, 256, 1024, 4096], [16, 64, 256, 1024, 2048], coef)
    fit = fit_prefill(u, c, y, form=form)
    for k, v in coef.items():
        assert fit.coefficients[k] == pytest.approx(v, rel=1e-6, abs=1e-12), k
    assert np.allclose(fit.predict(u, c), y, rtol=1e-9)


def test_fit_is_nonnegative_and_monotone_when_the_data_are_not():
    # A negative cached-token slope (noise can produce one) must not enter the model.
    u, c, y = _grid_points([0, 512, 2048], [32, 128, 512, 2048],
                           {**TRUE, "per_cached_token_ms": -0.0005})
    fit = fit_prefill(u, c, y)
    assert all(v >= 0 for v in fit.coefficients.values())
    grid_u, grid_c = np.meshgrid(np.arange(1, 4097, 64.0), np.arange(0, 8193, 128.0))
    pred = fit.predict(grid_u, grid_c)
    assert np.all(np.diff(pred, axis=1) >= 0) and np.all(np.diff(pred, axis=0) >= 0)


def test_linear_form_uses_only_the_design_terms():
    u, c, y = _grid_points([0, 512, 2048], [32, 128, 512, 2048], TRUE)
    fit = fit_prefill(u, c, y, form="linear")
    assert fit.coefficients["per_uncached_token_sq_ms"] == 0.0
    assert fit.coefficients["per_uncached_cached_token_ms"] == 0.0


@pytest.mark.parametrize("shape", [(2, 3), (2, 4), (3, 3), (4, 4), (6, 8)])
def test_holdout_mask_keeps_corners_and_holds_something_out(shape):
    cached, uncached = list(range(shape[0])), list(range(shape[1]))
    mask = holdout_mask(cached, uncached)
    assert mask == holdout_mask(cached, uncached)
    n_u = shape[1]
    corners = {0, n_u - 1, (shape[0] - 1) * n_u, shape[0] * n_u - 1}
    assert not any(mask[k] for k in corners)
    assert 1 <= sum(mask) <= max(1, len(mask) // 3)


def test_cost_model_defaults_and_c_prefill():
    """The default model (docs/design.md section 3): a 1,536-token miss costs 97.16 ms; one-touch's
    prompts are a 1,536-token prefix plus a 32-token suffix (99.08 ms), so its C_prefill
    is 10.09 requests/s."""
    cost = CostModel()
    assert cost.prefill_ms(1536, 0) == pytest.approx(97.16)
    assert unique_prefill_rate(cost, 1536) == pytest.approx(1000 / 97.16)
    one_touch = generate("one-touch", {})[0]["generator"]["derived"]
    assert one_touch["c_prefill_per_s"] == pytest.approx(1000 / 99.08, abs=1e-6)
    assert "cost_model" not in one_touch


# -- the step model's fit and grid -----------------------------------------------------

TRUE_STEP = {"fixed_ms": 6.0, "per_prefill_token_ms": 0.04, "per_context_token_ms": 0.002,
             "per_decode_ms": 0.3, "per_decode_context_token_ms": 0.0001}
CPU_STEPS = step_grid(GRIDS["cpu"]["cached"], GRIDS["cpu"]["uncached"],
                      GRIDS["cpu"]["decodes"], GRIDS["cpu"]["decode"])


def _step_ms(coef, p, c, d, k):
    return (coef["fixed_ms"] + coef["per_prefill_token_ms"] * p + coef["per_context_token_ms"] * c
            + coef["per_decode_ms"] * d + coef["per_decode_context_token_ms"] * k)


def _step_cols(steps):
    p, c, d, x = (np.array(v, float) for v in zip(*steps))
    return p, c, d, d * x


def test_step_fit_recovers_known_coefficients():
    p, c, d, k = _step_cols(CPU_STEPS)
    y = _step_ms(TRUE_STEP, p, c, d, k)
    fit = fit_step(p, c, d, k, y)
    assert list(fit.coefficients) == list(STEP_COEFFICIENTS)
    for name, v in TRUE_STEP.items():
        assert fit.coefficients[name] == pytest.approx(v, rel=1e-6, abs=1e-12), name
    assert np.allclose(fit.predict(p, c, d, k), y, rtol=1e-9)


def test_step_fit_with_noise_stays_close_and_nonnegative():
    """2% multiplicative noise (seeded): every step's prediction within 5% of the truth,
    and a coefficient the data push below zero is clamped, never negative."""
    p, c, d, k = _step_cols(CPU_STEPS)
    rng = np.random.default_rng(7)
    y = _step_ms(TRUE_STEP, p, c, d, k) * (1 + 0.02 * rng.standard_normal(len(p)))
    fit = fit_step(p, c, d, k, y)
    truth = _step_ms(TRUE_STEP, p, c, d, k)
    assert np.max(np.abs(fit.predict(p, c, d, k) - truth) / truth) < 0.05
    neg = _step_ms({**TRUE_STEP, "per_decode_context_token_ms": -0.00002}, p, c, d, k)
    clamped = fit_step(p, c, d, k, neg)
    assert all(v >= 0 for v in clamped.coefficients.values())
    assert clamped.coefficients["per_decode_context_token_ms"] == 0.0


def test_step_grid_families_and_holdout():
    g = GRIDS["cpu"]
    n_pre, n_dec = len(g["cached"]) * len(g["uncached"]), len(g["decodes"]) * len(g["decode"])
    assert len(CPU_STEPS) == 2 * n_pre + n_dec and len(set(CPU_STEPS)) == len(CPU_STEPS)
    alone = [s for s in CPU_STEPS if s[2] == 0]
    assert alone == [(u, c, 0, 0) for c in g["cached"] for u in g["uncached"]]
    mixed = [s for s in CPU_STEPS if s[0] and s[2]]
    assert {(s[2], s[3]) for s in mixed} == {(d, x) for d in g["decodes"] for x in g["decode"]}
    assert {s[0] for s in mixed} == set(g["uncached"])
    mask = step_holdout_mask(CPU_STEPS)
    held = [s for s, h in zip(CPU_STEPS, mask) if h]
    assert held and all(s[0] and s[2] for s in held)          # only mixed steps held out
    assert len(held) == len(mixed[1::3])


# -- the file ------------------------------------------------------------------------

def _request_truth(p, c, d, x):
    """Synthetic timings whose one-chunk steps follow TRUE (the per-request form) and whose
    one-decode steps cost 7 ms + 1 us per context token; the rest is a step model."""
    if d == 0:
        return float(_grid_points([c], [p], TRUE)[2][0])
    if p == 0 and d == 1:
        return 7.0 + 0.001 * x
    return _step_ms(TRUE_STEP, p, c, d, d * x)


def _step_truth(p, c, d, x):
    return _step_ms(TRUE_STEP, p, c, d, d * x)


SOFTWARE = {"python": "3", "torch": "x", "transformers": "y", "psgate": "z",
            "attn_implementation": "psgate_step"}


def synthetic_document(tmp_path, truth=_request_truth, name="synthetic.json", noise=0.0,
                       notes=None):
    cfg = CalibrateConfig(model_config=str(MODELS / "tiny-qwen2"), device="cpu",
                          out=tmp_path / name, notes=notes)
    cfg.resolve()
    g = cfg.grid
    rng = np.random.default_rng(0)
    steps = []
    for s in g["steps"]:
        y = truth(*s)
        steps.append((*s, [y * (1 + noise * rng.standard_normal()) for _ in range(g["repeats"])]))
    raw = (MODELS / "tiny-qwen2" / "config.json").read_bytes()
    doc = build_document(cfg, json.loads(raw), raw, "tiny-qwen2", Timings(steps),
                         num_parameters=123, device_name="test cpu", software=SOFTWARE,
                         load_before=[1.0, 1.0, 1.0], load_after=None)
    write_document(doc, cfg.out, force=False)
    return cfg.out, doc


def test_v2_document_round_trips_through_both_loaders(tmp_path):
    path, doc = synthetic_document(tmp_path, truth=_step_truth, notes="quiet machine")
    assert doc["version"] == 2 and doc["notes"] == "quiet machine"
    fit = doc["fit"]
    assert fit["form"] == "step" and fit["holdout_median_rel_error"] < 1e-9
    assert fit["num_holdout_points"] == sum(p["split"] == "holdout" for p in doc["points"]) >= 1
    assert doc["noise"]["rel_iqr_median"] == 0.0                # identical repeats
    step = load_step_cost_model(path)
    assert isinstance(step, StepCostModel)
    for k, v in TRUE_STEP.items():
        assert getattr(step, k) == pytest.approx(v, rel=1e-6, abs=1e-12), k
    assert step.origin["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert step.origin["name"] == "synthetic.json" and step.origin["model"] == "tiny-qwen2"
    assert StepCostModel.from_json(step.to_json()) == step
    assert step.to_json()["file"] == step.origin
    # The service model reads the same file's request_fit: a linear truth, exactly.
    cost = load_cost_model(path)
    assert cost.origin == step.origin
    assert cost.prefill_ms(300, 700) == pytest.approx(step.step_ms(StepWork(300, 700)))


def test_request_fit_round_trips_through_the_service_loader(tmp_path):
    path, doc = synthetic_document(tmp_path)
    assert doc["request_fit"]["holdout_median_rel_error"] < 1e-9   # noiseless: exact fit
    req_points = [p for p in doc["points"] if "request_split" in p]
    assert all(p["decodes"] == 0 for p in req_points)
    assert len(req_points) == len(GRIDS["cpu"]["cached"]) * len(GRIDS["cpu"]["uncached"])
    assert doc["request_fit"]["num_holdout_points"] == sum(
        p["request_split"] == "holdout" for p in req_points)
    assert all(len(p["times_ms"]) == GRIDS["cpu"]["repeats"] for p in doc["points"])
    cost = load_cost_model(path)
    for k, v in TRUE.items():
        assert getattr(cost, k) == pytest.approx(v, rel=1e-6, abs=1e-12)
    assert cost.per_output_token_ms == pytest.approx(7.0 + 0.001 * 576)   # median of 128, 1024
    assert cost.origin["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert cost.origin["name"] == "synthetic.json" and cost.origin["model"] == "tiny-qwen2"
    assert CostModel.from_json(cost.to_json()) == cost
    assert CostModel.from_json(cost.to_json()).origin == cost.origin
    with pytest.raises(InputError, match="already exists"):
        write_document(doc, path, force=False)


def test_replay_records_the_cost_model_file(tmp_path):
    path, _ = synthetic_document(tmp_path)
    trace = small_trace(tmp_path)
    proc = psgate("replay", "--baseline", "lru", "--candidate", "lru",
                  "--trace", trace, "--out", tmp_path / "o", "--cost-model", path,
                  "--quiet", "--allow-unexercised")
    assert proc.returncode in (0, 1), proc.stderr
    receipt = json.loads((tmp_path / "o" / "receipt.json").read_text())
    cm = receipt["config"]["cost_model"]
    assert cm["label"] == "modeled" and cm["source"] == "cost-model file"
    assert cm["file"]["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert cm["per_uncached_token_sq_ms"] == pytest.approx(TRUE["per_uncached_token_sq_ms"])
    # The receipt alone rebuilds the same model: verify replays it byte for byte.
    ver = psgate("verify", tmp_path / "o")
    assert ver.returncode == 0, ver.stderr + ver.stdout
    # Same file, same bytes: the receipt is deterministic with a calibrated model too.
    proc2 = psgate("replay", "--baseline", "lru", "--candidate", "lru",
                   "--trace", trace, "--out", tmp_path / "o2", "--cost-model", path,
                   "--quiet", "--allow-unexercised")
    assert proc2.returncode == proc.returncode
    from psgate.receipt.receipt import deterministic_part, dumps
    a = json.loads((tmp_path / "o" / "receipt.json").read_text())
    b = json.loads((tmp_path / "o2" / "receipt.json").read_text())
    assert dumps(deterministic_part(a)) == dumps(deterministic_part(b))


def test_trace_gen_derives_c_prefill_from_the_chosen_model(tmp_path):
    path, _ = synthetic_document(tmp_path)
    out = tmp_path / "ot.jsonl"
    proc = psgate("trace", "gen", "one-touch", "-o", out, "--cost-model", path)
    assert proc.returncode == 0, proc.stderr
    header = json.loads(out.read_text().splitlines()[0])
    derived = header["generator"]["derived"]
    cost = load_cost_model(path)
    params = header["generator"]["params"]
    prompt = params["prefix_tokens"] + params["suffix_tokens"]
    assert derived["c_prefill_per_s"] == pytest.approx(unique_prefill_rate(cost, prompt), abs=1e-6)
    assert derived["c_prefill_per_s"] != pytest.approx(1000 / 99.08, abs=1e-3)
    assert derived["cost_model"]["sha256"] == cost.origin["sha256"]
    validate_trace(str(out))
    for kind in ("low-and-slow", "two-pass-replay", "sharegpt", "cold"):
        lines = generate(kind, {}, cost=cost)
        assert lines[0]["generator"]["derived"]["cost_model"]["name"] == "synthetic.json", kind


# -- version 1 -----------------------------------------------------------------------

V1_LINEAR = {"fixed_ms": 5.0, "per_uncached_token_ms": 0.06, "per_cached_token_ms": 0.002,
             "per_uncached_token_sq_ms": 0.0, "per_uncached_cached_token_ms": 0.0,
             "per_output_token_ms": 10.0}


def write_v1(tmp_path, coef, name="v1.json"):
    """A version-1 file as psgate calibrate wrote them (single-request timings), with
    timings that follow ``coef`` exactly."""
    cached, uncached = [0, 256, 1024], [16, 64, 256, 1024]
    mask = holdout_mask(cached, uncached)
    points = []
    for (c, u), held in zip([(c, u) for c in cached for u in uncached], mask):
        y = float(_grid_points([c], [u], coef)[2][0])
        points.append({"cached_tokens": c, "uncached_tokens": u,
                       "split": "holdout" if held else "fit", "median_ms": y,
                       "times_ms": [y, y, y]})
    cfg = json.loads((MODELS / "tiny-qwen2" / "config.json").read_text())
    doc = {
        "format": "psgate-cost-model", "version": 1,
        "model": {"name": "tiny-qwen2", "config_sha256": "0" * 64,
                  "architecture": "Qwen2ForCausalLM", "model_type": "qwen2",
                  **{k: cfg[k] for k in ("num_hidden_layers", "hidden_size",
                                         "num_attention_heads", "num_key_value_heads",
                                         "intermediate_size", "vocab_size")},
                  "num_parameters": 123, "weights": "random"},
        "dtype": "float32", "device": {"kind": "cpu", "name": "test cpu", "threads": None},
        "software": SOFTWARE,
        "method": {"warmup": 1, "repeats": 3, "statistic": "median", "batch_size": 1,
                   "prefix_reuse": "cropped", "order": "interleaved", "timer": "wall clock",
                   "holdout": "v1 rule"},
        "points": points,
        "decode_points": [{"context_tokens": 512, "median_ms": coef["per_output_token_ms"],
                           "times_ms": [coef["per_output_token_ms"]] * 3}],
        "fit": {"form": "attention", "terms": list(FORMS["attention"]), "weighting": "relative",
                **coef, "num_fit_points": sum(not m for m in mask),
                "num_holdout_points": sum(mask), "fit_median_rel_error": 0.0,
                "holdout_median_rel_error": 0.0, "holdout_max_rel_error": 0.0},
    }
    path = tmp_path / name
    path.write_bytes(orjson.dumps(doc))
    return path, doc


def test_v1_file_still_gives_the_service_model_unchanged(tmp_path):
    path, _ = write_v1(tmp_path, {**TRUE, "per_output_token_ms": 9.0})
    cost = load_cost_model(path)
    assert cost == CostModel(**TRUE, per_output_token_ms=9.0)
    assert cost.origin["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()


def test_v1_linear_file_converts_to_a_step_model_exactly_on_one_request_steps(tmp_path):
    path, _ = write_v1(tmp_path, V1_LINEAR)
    notices = []
    step = load_step_cost_model(path, notice=notices.append)
    assert len(notices) == 1 and str(path) in notices[0] and "version-1" in notices[0]
    assert V1_STEP_RULE in notices[0]
    cost = load_cost_model(path)
    assert step.origin == cost.origin
    for u, c in [(16, 0), (1024, 0), (64, 4096), (1, 1)]:
        assert step.step_ms(StepWork(num_prefill_tokens=u, num_context_tokens=c)) == \
            pytest.approx(cost.prefill_ms(u, c))
    for ctx in (1, 512, 8192):
        assert step.step_ms(StepWork(num_decodes=1, num_decode_context_tokens=ctx)) == \
            pytest.approx(cost.per_output_token_ms)
    # A decode faster than the fixed cost cannot make per_decode_ms negative.
    path2, _ = write_v1(tmp_path, {**V1_LINEAR, "per_output_token_ms": 2.0}, "fast.json")
    assert load_step_cost_model(path2, notice=notices.append).per_decode_ms == 0.0


def test_v1_conversion_notice_goes_to_stderr(tmp_path, capsys):
    path, _ = write_v1(tmp_path, V1_LINEAR)
    load_step_cost_model(path)
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("psgate: ") and str(path) in err[0]


def test_v1_attention_file_is_refused_as_a_step_model_naming_file_and_field(tmp_path):
    path, _ = write_v1(tmp_path, {**TRUE, "per_output_token_ms": 9.0})
    with pytest.raises(InputError) as exc:
        load_step_cost_model(path, notice=pytest.fail)
    msg = str(exc.value)
    assert "\n" not in msg and msg.startswith(f"{path}: ")
    assert "fit.per_uncached_token_sq_ms" in msg and "psgate calibrate --convert" in msg


def test_convert_v1_refits_the_step_model_and_keeps_the_request_fit(tmp_path):
    coef = {**TRUE, "per_output_token_ms": 9.0}
    path, v1 = write_v1(tmp_path, coef)
    out = tmp_path / "v2.json"
    proc = psgate("calibrate", "--convert", path, "-o", out, "--notes", "converted here")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    assert doc["version"] == 2 and doc["notes"] == "converted here"
    assert doc["request_fit"] == v1["fit"]
    assert doc["converted_from"]["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert doc["converted_from"]["name"] == "v1.json"
    assert len(doc["points"]) == len(v1["points"]) + len(v1["decode_points"])
    assert load_cost_model(out) == load_cost_model(path)          # same service model
    step = load_step_cost_model(out, notice=pytest.fail)          # no conversion notice
    # Refitted to the timings: one-decode steps and one-chunk steps come out close.
    assert step.step_ms(StepWork(num_decodes=1, num_decode_context_tokens=512)) == \
        pytest.approx(9.0, rel=0.05)
    kept = [p for p in doc["points"] if p["split"] == "fit"]
    refit = fit_step(*([p[k] for p in kept] for k in (
        "prefill_tokens", "context_tokens", "decodes", "decode_context_tokens", "median_ms")))
    assert refit.coefficients == {k: doc["fit"][k] for k in STEP_COEFFICIENTS}
    again = psgate("calibrate", "--convert", out, "-o", tmp_path / "v3.json")
    assert_one_line_error(again, 2, str(out), "version")


# -- errors ----------------------------------------------------------------------------

def _bad_files(tmp_path):
    tmp_path.mkdir(exist_ok=True)
    path, doc = synthetic_document(tmp_path)
    cases = {}

    def case(name, mutate, needle):
        d = json.loads(json.dumps(doc))
        mutate(d)
        p = tmp_path / f"{name}.json"
        p.write_bytes(orjson.dumps(d))
        cases[name] = (p, needle)

    case("negative", lambda d: d["fit"].__setitem__("per_decode_ms", -1.0), "fit.per_decode_ms")
    case("negative_request", lambda d: d["request_fit"].__setitem__("per_cached_token_ms", -1.0),
         "request_fit.per_cached_token_ms")
    case("missing", lambda d: d["fit"].pop("fixed_ms"), "fit")
    case("no_request_fit", lambda d: d.pop("request_fit"), "request_fit")
    case("v1_fit_in_v2", lambda d: d.__setitem__("fit", d["request_fit"]), "fit")
    case("form", lambda d: d["fit"].__setitem__("form", "attention"), "fit.form")
    case("format", lambda d: d.__setitem__("format", "other"), "format")
    case("version", lambda d: d.__setitem__("version", 3), "version")
    case("v1_shape", lambda d: d.__setitem__("version", 1), "decode_points")
    case("points", lambda d: d["points"][0].__setitem__("median_ms", 0), "points[0].median_ms")
    case("decodes", lambda d: d["points"][3].__setitem__("decodes", -1), "points[3].decodes")
    case("times", lambda d: d["points"][1].__setitem__("times_ms", []), "points[1].times_ms")
    case("extra", lambda d: d.__setitem__("comment", "x"), "comment")
    case("huge", lambda d: d["fit"].__setitem__("fixed_ms", 1e300), "fit.fixed_ms")
    (tmp_path / "notjson.json").write_text("{nope")
    cases["notjson"] = (tmp_path / "notjson.json", "not valid JSON")
    cases["absent"] = (tmp_path / "absent.json", "no such cost-model file")
    return cases


def test_bad_cost_model_files_are_one_line_errors(tmp_path):
    for name, (p, needle) in _bad_files(tmp_path).items():
        loaders = [load_step_cost_model]
        if name != "huge":          # a step-fit value: the service model reads request_fit
            loaders.append(load_cost_model)
        for load in loaders:
            with pytest.raises(InputError) as exc:
                load(p)
            msg = str(exc.value)
            assert str(p) in msg and needle in msg and "\n" not in msg, (name, msg)
    p, needle = _bad_files(tmp_path / "again")["negative_request"]
    proc = psgate("replay", "--baseline", "lru", "--candidate", "lru",
                  "--trace", small_trace(tmp_path), "--out", tmp_path / "o",
                  "--cost-model", p)
    assert_one_line_error(proc, 2, str(p), needle)
    assert not (tmp_path / "o").exists()


def test_step_cost_from_params():
    assert step_cost_from_params({}) == StepCostModel()
    m = step_cost_from_params({"fixed_ms": 2, "per_decode_ms": 0.5})
    assert (m.fixed_ms, m.per_decode_ms, m.origin) == (2.0, 0.5, None)
    assert type(m.fixed_ms) is float
    for params, needle in [({"per_uncached_token_ms": 1.0}, "unknown cost-model parameter"),
                           ({"fixed_ms": -1}, "'fixed_ms' must be a number"),
                           ({"fixed_ms": "fast"}, "'fixed_ms' must be a number"),
                           ({"fixed_ms": 1e7}, "'fixed_ms' must be a number")]:
        with pytest.raises(InputError, match=needle) as exc:
            step_cost_from_params(params)
        assert str(exc.value).startswith("--cost-param: ")


def test_cost_options_conflict_and_unused_cost_model(tmp_path):
    path, _ = synthetic_document(tmp_path)
    proc = psgate("replay", "--baseline", "lru", "--candidate", "lru",
                  "--trace", small_trace(tmp_path), "--out", tmp_path / "o",
                  "--cost-model", path, "--cost-param", "fixed_ms=1")
    assert_one_line_error(proc, 2, "--cost-param", "exclusive")
    proc = psgate("trace", "gen", "steady", "-o", tmp_path / "s.jsonl", "--cost-model", path)
    assert_one_line_error(proc, 2, "--cost-model", "one-touch")
    assert not (tmp_path / "s.jsonl").exists()


def test_calibrate_bad_options(tmp_path):
    cfg = str(MODELS / "tiny-qwen2")
    for args, needle in [
        (["--device", "tpu"], "--device"),
        (["--dtype", "int8"], "--dtype"),
        (["--form", "cubic"], "--form"),
        (["--cached", "0,x"], "--cached"),
        (["--uncached", "64,32,128"], "--uncached"),
        (["--cached", "0", "--uncached", "8,16,32"], "--cached/--uncached"),
        (["--decodes", "2,4"], "--decodes"),
        (["--decodes", "1,1"], "--decodes"),
        (["--decode-context", "0,8"], "--decode-context"),
        (["--repeats", "0"], "--repeats"),
        (["--uncached", "8,16,4000"], "max_position_embeddings"),
        (["--decode-context", "8,5000"], "max_position_embeddings"),
        (["--convert", "x.json"], "exactly one of"),
    ]:
        proc = psgate("calibrate", "--model-config", cfg, "-o", tmp_path / "c.json", *args)
        assert_one_line_error(proc, 2, needle)
    proc = psgate("calibrate", "-o", tmp_path / "c.json")
    assert_one_line_error(proc, 2, "--model-config", "exactly one of")
    bad = tmp_path / "cfg.json"
    bad.write_text(json.dumps({"model_type": "qwen2", "hidden_size": 0}))
    proc = psgate("calibrate", "--model-config", bad, "-o", tmp_path / "c.json")
    assert_one_line_error(proc, 2, str(bad), "num_hidden_layers")
    assert not (tmp_path / "c.json").exists()


def test_calibrate_without_torch_exits_3_with_the_install_command(tmp_path):
    # torch is made unimportable in the child, whatever this environment has.
    code = ("import sys; sys.modules['torch'] = None; sys.modules['transformers'] = None; "
            "sys.modules['numpy'] = None; "
            "from psgate.cli import main; sys.argv[0] = 'psgate'; main()")
    proc = subprocess.run([sys.executable, "-c", code, "calibrate", "--model-config",
                           str(MODELS / "tiny-qwen2"), "-o", str(tmp_path / "c.json")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3, proc.stderr
    assert "install-calibrate.sh" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "c.json").exists()


def test_replay_and_trace_gen_never_import_torch_or_vllm(tmp_path):
    code = ("import sys\n"
            "from psgate import api, cli\n"
            "from psgate.engines.cost import load_cost_model\n"
            f"api.replay(api.ReplayConfig(out=__import__('pathlib').Path({str(tmp_path / 'o')!r})))\n"
            "from psgate.workloads import generate\n"
            "generate('one-touch', {})\n"
            "bad = [m for m in ('torch', 'transformers', 'numpy', 'vllm') if m in sys.modules]\n"
            "assert not bad, bad\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr


def test_example_model_configs():
    """The paper's two architectures (published Qwen2.5 configs) and the tiny CPU one."""
    from psgate.calibrate.run import read_model_config
    want = {"qwen2.5-1.5b-instruct": (28, 1536, 12, 2, 8960, 151936),
            "qwen2.5-7b-instruct": (28, 3584, 28, 4, 18944, 152064)}
    for name, shape in want.items():
        cfg, _, got_name = read_model_config(str(MODELS / name))
        assert got_name == name
        assert (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["num_attention_heads"],
                cfg["num_key_value_heads"], cfg["intermediate_size"], cfg["vocab_size"]) == shape


# -- the real thing ------------------------------------------------------------------

@pytest.mark.heavy
def test_calibrate_times_batched_steps_on_a_tiny_grid(tmp_path):
    """Real batched steps of the tiny config. Wall-clock times on a shared machine: the
    checks are structure, nonnegativity and orderings with a 4x margin, never speed."""
    python = heavy_python("CALIBRATE", ("torch", "transformers"),
                          "bash scripts/install-calibrate.sh .venv-calibrate")
    out = tmp_path / "tiny.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    grid = ["--cached", "0,128", "--uncached", "16,64,256", "--decodes", "1,8",
            "--decode-context", "64,512", "--warmup", "1", "--repeats", "3", "--threads", "1"]
    proc = subprocess.run([python, "-m", "psgate", "calibrate", "--model-config",
                           str(MODELS / "tiny-qwen2"), "--device", "cpu", "-o", str(out),
                           *grid], capture_output=True, text=True, timeout=900, env=env,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout)
    step = load_step_cost_model(out)                     # validates against the schema
    cost = load_cost_model(out)
    doc = json.loads(out.read_text())
    assert doc["version"] == 2 and doc["device"]["kind"] == "cpu" and doc["dtype"] == "float32"
    assert doc["model"]["name"] == "tiny-qwen2" and doc["model"]["num_parameters"] > 0
    assert doc["device"]["threads"] == 1
    steps = step_grid([0, 128], [16, 64, 256], [1, 8], [64, 512])
    got = [(p["prefill_tokens"], p["context_tokens"], p["decodes"], p["decode_context_tokens"])
           for p in doc["points"]]
    assert got == [(p, c, d, d * x) for p, c, d, x in steps]
    assert [p["split"] == "holdout" for p in doc["points"]] == step_holdout_mask(steps)
    assert all(len(p["times_ms"]) == 3 and p["median_ms"] == float(np.median(p["times_ms"]))
               for p in doc["points"])
    assert all(getattr(step, k) >= 0 for k in STEP_COEFFICIENTS)
    assert all(getattr(cost, k) >= 0 for k in COEFFICIENTS) and cost.per_output_token_ms > 0
    # 256 prompt tokens are 16 times the work of 16: their medians must order, with room.
    med = {(p["prefill_tokens"], p["context_tokens"], p["decodes"]): p["median_ms"]
           for p in doc["points"]}
    assert sum(med[(256, c, 0)] for c in (0, 128)) > sum(med[(16, c, 0)] for c in (0, 128))
    # The fit reproduces its own kept points to within a factor of 4 (noise, not speed).
    kept = [p for p in doc["points"] if p["split"] == "fit"]
    for p in kept:
        pred = step.step_ms(StepWork(p["prefill_tokens"], p["context_tokens"], p["decodes"],
                                     p["decode_context_tokens"]))
        assert p["median_ms"] / 4 <= pred <= p["median_ms"] * 4, (p, pred)
    held = [p for p in doc["points"] if p["split"] == "holdout"]
    errors = [abs(step.step_ms(StepWork(p["prefill_tokens"], p["context_tokens"], p["decodes"],
                                        p["decode_context_tokens"])) - p["median_ms"])
              / p["median_ms"] for p in held]
    assert float(np.median(errors)) == pytest.approx(doc["fit"]["holdout_median_rel_error"])
    assert summary["holdout_median_rel_error"] == doc["fit"]["holdout_median_rel_error"]
    assert summary["step"] == {k: doc["fit"][k] for k in STEP_COEFFICIENTS}
    assert doc["noise"]["rel_iqr_median"] >= 0 and "load_average_before" in doc["noise"]
    print(f"tiny step fit: {summary['step']}, held-out median error "
          f"{summary['holdout_median_rel_error']:.1%}, noise {doc['noise']}")


def _step_work(p):
    return StepWork(p["prefill_tokens"], p["context_tokens"], p["decodes"],
                    p["decode_context_tokens"])


@pytest.mark.parametrize("path", sorted((ROOT / "examples" / "cost-models").glob("*.json")),
                         ids=lambda p: p.name)
def test_committed_cost_models(path):
    """The shipped calibrations are version 2, load as both models, and every fit in them
    is what its raw timings give: held-out errors recomputed from the timings they keep,
    coefficients refitted from their kept points (nothing was edited by hand)."""
    step = load_step_cost_model(path, notice=pytest.fail)
    cost = load_cost_model(path)
    doc = json.loads(path.read_text())
    assert doc["version"] == 2
    assert all(getattr(step, k) >= 0 for k in STEP_COEFFICIENTS)
    from_receipt = doc["method"].get("source") == "receipt"
    for p in doc["points"]:
        assert p["median_ms"] == pytest.approx(float(np.median(p["times_ms"])))
        # A real engine's steps are each timed once (calibrate --from-receipt).
        assert len(p["times_ms"]) == (1 if from_receipt else doc["method"]["repeats"])
    if from_receipt:
        # One step in three held out, in the receipt's step order; single steps of a real
        # engine scatter more than medians of repeated passes.
        assert [p["split"] for p in doc["points"]] == [
            "holdout" if i % 3 == 1 else "fit" for i in range(len(doc["points"]))]
        assert doc["fit"]["holdout_median_rel_error"] <= 0.25
        assert doc["request_fit"]["derived"]
    elif "converted_from" in doc:
        # Converted from version 1: the step fit holds out what the version-1 fit held out.
        assert [p["split"] for p in doc["points"]] == [p.get("request_split", "fit")
                                                       for p in doc["points"]]
        assert doc["request_fit"]["holdout_median_rel_error"] <= 0.10
    else:
        steps = [(p["prefill_tokens"], p["context_tokens"], p["decodes"],
                  p["decode_context_tokens"] // max(1, p["decodes"])) for p in doc["points"]]
        assert [p["split"] == "holdout" for p in doc["points"]] == step_holdout_mask(steps)
        assert doc["fit"]["holdout_median_rel_error"] <= 0.15
    held = [p for p in doc["points"] if p["split"] == "holdout"]
    errors = [abs(step.step_ms(_step_work(p)) - p["median_ms"]) / p["median_ms"] for p in held]
    assert float(np.median(errors)) == pytest.approx(doc["fit"]["holdout_median_rel_error"])
    kept = [p for p in doc["points"] if p["split"] == "fit"]
    refit = fit_step(*([p[k] for p in kept] for k in (
        "prefill_tokens", "context_tokens", "decodes", "decode_context_tokens", "median_ms")))
    for k, v in refit.coefficients.items():
        assert doc["fit"][k] == pytest.approx(v, rel=1e-6, abs=1e-12), k
    if from_receipt:
        # Its per-request fit is derived from the step fit: one prefill chunk alone.
        rf, sf = doc["request_fit"], doc["fit"]
        assert (rf["fixed_ms"], rf["per_uncached_token_ms"], rf["per_cached_token_ms"]) == (
            sf["fixed_ms"], sf["per_prefill_token_ms"], sf["per_context_token_ms"])
        return
    # The per-request fit, likewise, on the one-chunk steps.
    req = [p for p in doc["points"] if "request_split" in p]
    mask = holdout_mask(sorted({p["context_tokens"] for p in req}),
                        sorted({p["prefill_tokens"] for p in req}))
    assert [p["request_split"] == "holdout" for p in req] == mask
    rheld = [p for p in req if p["request_split"] == "holdout"]
    rerr = [abs(cost.prefill_ms(p["prefill_tokens"], p["context_tokens"]) - p["median_ms"])
            / p["median_ms"] for p in rheld]
    assert float(np.median(rerr)) == pytest.approx(doc["request_fit"]["holdout_median_rel_error"])
    rkept = [p for p in req if p["request_split"] == "fit"]
    rrefit = fit_prefill([p["prefill_tokens"] for p in rkept],
                         [p["context_tokens"] for p in rkept],
                         [p["median_ms"] for p in rkept], form=doc["request_fit"]["form"])
    for k, v in rrefit.coefficients.items():
        assert doc["request_fit"][k] == pytest.approx(v, rel=1e-6, abs=1e-12), k
