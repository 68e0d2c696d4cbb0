"""Cost-model files and psgate calibrate.

The fit, the file format, --cost-model on replay and trace gen, and the errors run in
the base test environment (numpy comes with matplotlib). The real calibration needs
torch and transformers: it runs in the interpreter PSGATE_CALIBRATE_PYTHON names (CI
builds one with scripts/install-calibrate.sh and sets PSGATE_REQUIRE_CALIBRATE=1, so
there it can never be skipped), or in this one if it has them.
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

from psgate.calibrate.fit import FORMS, fit_prefill
from psgate.calibrate.grid import holdout_mask
from psgate.calibrate.measure import Timings
from psgate.calibrate.run import GRIDS, CalibrateConfig, build_document, write_document
from psgate.engines.cost import COEFFICIENTS, CostModel, load_cost_model
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
    """The default model (DESIGN section 3): a 1,536-token miss costs 97.16 ms; one-touch's
    prompts are a 1,536-token prefix plus a 32-token suffix (99.08 ms), so its C_prefill
    is 10.09 requests/s."""
    cost = CostModel()
    assert cost.prefill_ms(1536, 0) == pytest.approx(97.16)
    assert unique_prefill_rate(cost, 1536) == pytest.approx(1000 / 97.16)
    one_touch = generate("one-touch", {})[0]["generator"]["derived"]
    assert one_touch["c_prefill_per_s"] == pytest.approx(1000 / 99.08, abs=1e-6)
    assert "cost_model" not in one_touch


# -- the file ------------------------------------------------------------------------

def synthetic_document(tmp_path, coef=TRUE, name="synthetic.json", noise=0.0):
    cfg = CalibrateConfig(model_config=str(MODELS / "tiny-qwen2"), device="cpu",
                          out=tmp_path / name)
    cfg.resolve()
    g = cfg.grid
    rng = np.random.default_rng(0)
    prefill = []
    for c in g["cached"]:
        for u in g["uncached"]:
            y = float(_grid_points([c], [u], coef)[2][0])
            prefill.append((c, u, [y * (1 + noise * rng.standard_normal())
                                   for _ in range(g["repeats"])]))
    timings = Timings(prefill, [(ctx, [7.0 + 0.001 * ctx] * g["repeats"]) for ctx in g["decode"]])
    raw = (MODELS / "tiny-qwen2" / "config.json").read_bytes()
    doc = build_document(cfg, json.loads(raw), raw, "tiny-qwen2", timings,
                         num_parameters=123, device_name="test cpu",
                         software={"python": "3", "torch": "x", "transformers": "y",
                                   "psgate": "z", "attn_implementation": "sdpa"})
    write_document(doc, cfg.out, force=False)
    return cfg.out, doc


def test_document_round_trips_through_the_loader(tmp_path):
    path, doc = synthetic_document(tmp_path)
    assert doc["fit"]["holdout_median_rel_error"] < 1e-9          # noiseless: exact fit
    assert doc["fit"]["num_holdout_points"] == sum(p["split"] == "holdout" for p in doc["points"])
    assert all(len(p["times_ms"]) == GRIDS["cpu"]["repeats"] for p in doc["points"])
    cost = load_cost_model(path)
    for k, v in TRUE.items():
        assert getattr(cost, k) == pytest.approx(v, rel=1e-6, abs=1e-12)
    assert cost.per_output_token_ms == pytest.approx(7.0 + 0.001 * 640)   # median of 256, 1024
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
    prompt = header["generator"]["params"]["prefix_tokens"] + header["generator"]["params"]["suffix_tokens"]
    assert derived["c_prefill_per_s"] == pytest.approx(unique_prefill_rate(cost, prompt), abs=1e-6)
    assert derived["c_prefill_per_s"] != pytest.approx(1000 / 99.08, abs=1e-3)
    assert derived["cost_model"]["sha256"] == cost.origin["sha256"]
    validate_trace(str(out))
    for kind in ("low-and-slow", "two-pass-replay", "sharegpt", "cold"):
        lines = generate(kind, {}, cost=cost)
        assert lines[0]["generator"]["derived"]["cost_model"]["name"] == "synthetic.json", kind


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

    case("negative", lambda d: d["fit"].__setitem__("per_cached_token_ms", -1.0),
         "fit.per_cached_token_ms")
    case("missing", lambda d: d["fit"].pop("fixed_ms"), "fit")
    case("format", lambda d: d.__setitem__("format", "other"), "format")
    case("version", lambda d: d.__setitem__("version", 2), "version")
    case("points", lambda d: d["points"][0].__setitem__("median_ms", 0), "points[0].median_ms")
    (tmp_path / "notjson.json").write_text("{nope")
    cases["notjson"] = (tmp_path / "notjson.json", "not valid JSON")
    cases["absent"] = (tmp_path / "absent.json", "no such cost-model file")
    return cases


def test_bad_cost_model_files_are_one_line_errors(tmp_path):
    for name, (p, needle) in _bad_files(tmp_path).items():
        with pytest.raises(InputError) as exc:
            load_cost_model(p)
        assert str(p) in str(exc.value) and needle in str(exc.value), (name, str(exc.value))
    p, needle = _bad_files(tmp_path / "again")["negative"]
    proc = psgate("replay", "--baseline", "lru", "--candidate", "lru",
                  "--trace", small_trace(tmp_path), "--out", tmp_path / "o",
                  "--cost-model", p)
    assert_one_line_error(proc, 2, str(p), needle)
    assert not (tmp_path / "o").exists()


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
        (["--repeats", "0"], "--repeats"),
        (["--uncached", "8,16,4000"], "max_position_embeddings"),
    ]:
        proc = psgate("calibrate", "--model-config", cfg, "-o", tmp_path / "c.json", *args)
        assert_one_line_error(proc, 2, needle)
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
def test_calibrate_tiny_config_on_cpu(tmp_path):
    python = heavy_python("CALIBRATE", ("torch", "transformers"),
                          "bash scripts/install-calibrate.sh .venv-calibrate")
    out = tmp_path / "tiny.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    # Wall-clock timing on a machine that may be shared: a second calibration is allowed
    # when the first one's held-out error is over the target (both are reported).
    errors_seen = []
    for attempt in range(2):
        proc = subprocess.run([python, "-m", "psgate", "calibrate", "--model-config",
                               str(MODELS / "tiny-qwen2"), "--device", "cpu", "-o", str(out),
                               "--force"],
                              capture_output=True, text=True, timeout=900, env=env, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-3000:]
        summary = json.loads(proc.stdout)
        errors_seen.append(summary["holdout_median_rel_error"])
        if summary["holdout_median_rel_error"] <= 0.10:
            break
    print(f"held-out median relative error per attempt: {errors_seen}")
    cost = load_cost_model(out)                       # validates against the schema
    doc = json.loads(out.read_text())
    fit = doc["fit"]
    assert doc["device"]["kind"] == "cpu" and doc["dtype"] == "float32"
    assert doc["model"]["name"] == "tiny-qwen2" and doc["model"]["num_parameters"] > 0
    assert all(len(p["times_ms"]) == GRIDS["cpu"]["repeats"] for p in doc["points"])
    assert fit["num_holdout_points"] >= 3
    # Monotone: nondecreasing in uncached and in cached tokens across the grid's range.
    grid_u, grid_c = np.meshgrid(np.arange(1, 1025, 8.0), np.arange(0, 2049, 16.0))
    pred = (cost.fixed_ms + cost.per_uncached_token_ms * grid_u
            + cost.per_cached_token_ms * grid_c + cost.per_uncached_token_sq_ms * grid_u ** 2
            + cost.per_uncached_cached_token_ms * grid_u * grid_c)
    assert np.all(np.diff(pred, axis=1) >= 0) and np.all(np.diff(pred, axis=0) >= 0)
    # The held-out error is recomputed here from the raw timings, not read from the file.
    held = [p for p in doc["points"] if p["split"] == "holdout"]
    errors = [abs(cost.prefill_ms(p["uncached_tokens"], p["cached_tokens"]) - p["median_ms"])
              / p["median_ms"] for p in held]
    assert float(np.median(errors)) == pytest.approx(fit["holdout_median_rel_error"])
    assert fit["holdout_median_rel_error"] <= 0.10, (errors_seen, fit)
    assert summary["holdout_median_rel_error"] == fit["holdout_median_rel_error"]
    assert all(k in fit for k in COEFFICIENTS) and cost.per_output_token_ms > 0


@pytest.mark.parametrize("path", sorted((ROOT / "examples" / "cost-models").glob("*.json")),
                         ids=lambda p: p.name)
def test_committed_cost_models(path):
    """The shipped calibrations load, are monotone, and their held-out error, recomputed
    from the raw timings they keep, is what they claim and within 10%."""
    cost = load_cost_model(path)
    doc = json.loads(path.read_text())
    assert all(getattr(cost, k) >= 0 for k in COEFFICIENTS)
    for p in doc["points"]:
        assert p["median_ms"] == pytest.approx(float(np.median(p["times_ms"])))
        assert len(p["times_ms"]) == doc["method"]["repeats"]
    held = [p for p in doc["points"] if p["split"] == "holdout"]
    mask = holdout_mask(sorted({p["cached_tokens"] for p in doc["points"]}),
                        sorted({p["uncached_tokens"] for p in doc["points"]}))
    assert [p["split"] == "holdout" for p in doc["points"]] == mask
    errors = [abs(cost.prefill_ms(p["uncached_tokens"], p["cached_tokens"]) - p["median_ms"])
              / p["median_ms"] for p in held]
    assert float(np.median(errors)) == pytest.approx(doc["fit"]["holdout_median_rel_error"])
    assert doc["fit"]["holdout_median_rel_error"] <= 0.10
    # Refitting the kept points reproduces the coefficients: nothing was edited by hand.
    kept = [p for p in doc["points"] if p["split"] == "fit"]
    refit = fit_prefill([p["uncached_tokens"] for p in kept], [p["cached_tokens"] for p in kept],
                        [p["median_ms"] for p in kept], form=doc["fit"]["form"])
    for k, v in refit.coefficients.items():
        assert doc["fit"][k] == pytest.approx(v, rel=1e-6, abs=1e-12), k
