"""psgate calibrate --from-receipt: the step model fitted to a real engine's timed steps.

Runs in the base test environment: the lockstep receipt is built here from a step-scheduler
replay (its outputs and their digests untouched) whose engine fields are set to what
``--engine vllm --pacing lockstep`` records, with step rows timed by known coefficients.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import jsonschema
import numpy as np
import orjson
import pytest

from psgate import api
from psgate.calibrate.from_receipt import RECEIPT_HOLDOUT, receipt_document
from psgate.engines.cost import load_cost_model, load_step_cost_model
from psgate.engines.step_cost import STEP_COEFFICIENTS, SchedulerParams
from psgate.errors import InputError
from psgate.receipt.receipt import dumps
from psgate.report.receipts import read_receipt_file
from psgate.report.verify import recorded_outputs_difference

from test_cli import assert_one_line_error, psgate, small_trace

ROOT = Path(__file__).resolve().parents[1]
TRUE = {"fixed_ms": 3.0, "per_prefill_token_ms": 0.05, "per_context_token_ms": 0.004,
        "per_decode_ms": 0.7, "per_decode_context_token_ms": 0.001}
COLUMNS = ["prefill_tokens", "context_tokens", "decodes", "decode_context_tokens", "wall_ms"]


def _true_ms(p, c, d, k):
    return (TRUE["fixed_ms"] + TRUE["per_prefill_token_ms"] * p
            + TRUE["per_context_token_ms"] * c + TRUE["per_decode_ms"] * d
            + TRUE["per_decode_context_token_ms"] * k)


def timed_rows(n: int, seed: int) -> list[list]:
    """Steps of a random kind (prefill chunks alone, decodes alone, both), timed exactly
    by TRUE."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n):
        kind = int(rng.integers(0, 3))
        p, c = (int(rng.integers(8, 600)), int(rng.integers(0, 2000))) if kind != 1 else (0, 0)
        d = int(rng.integers(1, 24)) if kind != 0 else 0
        k = d * int(rng.integers(8, 800)) if d else 0
        rows.append([p, c, d, k, _true_ms(p, c, d, k)])
    return rows


@pytest.fixture(scope="module")
def sim_receipt(tmp_path_factory):
    """A step-scheduler replay's receipt directory (engine sim)."""
    d = tmp_path_factory.mktemp("sim")
    trace = small_trace(d)
    api.replay(api.ReplayConfig(trace=str(trace), baseline="lru", candidate="lru",
                                capacity=16, engine="sim", scheduler="step", out=d / "out",
                                force=True, allow_unexercised=True))
    return d / "out"


def make_lockstep(src, dst, pacing="lockstep", rows=None):
    """``src`` rewritten as a real-engine receipt of ``pacing``: its outputs (and so their
    recorded SHA-256) unchanged, each run given ``rows`` (default timed_rows) as its
    observed step timings."""
    shutil.copytree(src, dst)
    r = orjson.loads((dst / "receipt.json").read_bytes())
    r["config"]["engine"] = "vllm"
    r["config"]["engine_info"] = {
        "vllm": "0.32.0", "torch": "2.13.0+cpu", "device": "cpu", "model": "tiny-qwen2",
        "model_config_sha256": "ab" * 32, "architectures": ["Qwen2ForCausalLM"],
        "weights": "dummy (random)", "pacing": pacing, "scheduler": SchedulerParams().to_json(),
        "step_cost_model": {"label": "modeled", "form": "step", **{k: 1.0 for k in TRUE}}}
    for i, run in enumerate(sorted(r["runs"])):
        r["runs"][run]["observed"] = {
            "predicted_by": "vllm-pool", "num_requests": 40, "num_equal": 40,
            "differences_by_class": {}, "differences": [], "pacing": pacing,
            "step_wall_ms": {"columns": COLUMNS,
                             "rows": timed_rows(30, seed=i) if rows is None else rows}}
    (dst / "receipt.json").write_bytes(dumps(r))
    return dst


def _doc(path):
    return receipt_document(path, read_receipt=read_receipt_file,
                            outputs_difference=recorded_outputs_difference)


def test_fit_recovers_the_coefficients_the_steps_were_timed_by(sim_receipt, tmp_path):
    rcpt = make_lockstep(sim_receipt, tmp_path / "r")
    out = tmp_path / "m.json"
    proc = psgate("calibrate", "--from-receipt", rcpt, "-o", out)
    assert proc.returncode == 0, proc.stderr
    doc = orjson.loads(out.read_bytes())
    for k in STEP_COEFFICIENTS:
        assert doc["fit"][k] == pytest.approx(TRUE[k], rel=1e-6), k
    assert doc["fit"]["holdout_max_rel_error"] < 1e-9
    # every step of both runs, one in three (the second, fifth, ...) held out
    assert len(doc["points"]) == doc["method"]["num_steps"] == 60
    assert [p["split"] == "holdout" for p in doc["points"]] == [i % 3 == 1 for i in range(60)]
    assert doc["fit"]["num_holdout_points"] == 20 and doc["method"]["holdout"] == RECEIPT_HOLDOUT
    assert [p["run"] for p in doc["points"]] == ["baseline"] * 30 + ["candidate"] * 30
    # both loaders read it: the step model is the fit, the per-request one derived from it
    step = load_step_cost_model(out)
    assert step.coefficients() == pytest.approx(TRUE, rel=1e-6)
    assert step.origin["dtype"] == "auto" and step.origin["model"] == "tiny-qwen2"
    req = load_cost_model(out)
    assert req.per_uncached_token_ms == pytest.approx(TRUE["per_prefill_token_ms"], rel=1e-6)
    assert req.per_cached_token_ms == pytest.approx(TRUE["per_context_token_ms"], rel=1e-6)
    assert req.prefill_ms(100, 50) == pytest.approx(_true_ms(100, 50, 0, 0), rel=1e-6)
    contexts = [r[3] / r[2] for i in (0, 1) for r in timed_rows(30, seed=i) if r[2]]
    assert req.per_output_token_ms == pytest.approx(
        _true_ms(0, 0, 1, float(np.median(contexts))), rel=1e-6)
    assert doc["request_fit"]["derived"].startswith("derived from the step fit")
    # a step replay priced by it records the file in its receipt
    proc = psgate("replay", "--trace", small_trace(tmp_path), "--baseline", "lru",
                  "--candidate", "lru", "--capacity", 16, "--allow-unexercised",
                  "--cost-model", out, "--out", tmp_path / "o", "--quiet")
    assert proc.returncode == 0, proc.stderr
    recorded = orjson.loads((tmp_path / "o" / "receipt.json").read_bytes())["config"]
    assert recorded["step_cost_model"]["file"]["name"] == "m.json"
    assert recorded["step_cost_model"]["fixed_ms"] == pytest.approx(TRUE["fixed_ms"], rel=1e-6)


def test_method_says_where_the_timings_came_from(sim_receipt, tmp_path):
    import hashlib

    rcpt = make_lockstep(sim_receipt, tmp_path / "r")
    doc = _doc(rcpt / "receipt.json")            # the file itself as well as its directory
    m, r = doc["method"], orjson.loads((rcpt / "receipt.json").read_bytes())
    assert (m["source"], m["engine"], m["pacing"]) == ("receipt", "vllm", "lockstep")
    assert (m["vllm"], m["torch"], m["device"]) == ("0.32.0", "2.13.0+cpu", "cpu")
    assert m["receipt"]["sha256"] == hashlib.sha256(
        (rcpt / "receipt.json").read_bytes()).hexdigest()
    assert m["trace"]["sha256"] == r["environment"]["trace_sha256"]
    assert m["trace"]["canonical_sha256"] == r["trace"]["canonical_sha256"]
    assert m["scheduler"] == SchedulerParams().to_json()
    assert doc["model"]["config_sha256"] == "ab" * 32


def test_output_validates_against_both_schema_copies(sim_receipt, tmp_path):
    doc = _doc(make_lockstep(sim_receipt, tmp_path / "r"))
    for path in (ROOT / "schemas" / "cost-model.schema.json",
                 ROOT / "psgate" / "data" / "schemas" / "cost-model.schema.json"):
        jsonschema.Draft202012Validator(orjson.loads(path.read_bytes())).validate(doc)
    bad = dict(doc, method=dict(doc["method"], pacing="wall"))
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft202012Validator(orjson.loads(path.read_bytes())).validate(bad)


def test_same_receipt_gives_byte_identical_files(sim_receipt, tmp_path):
    rcpt = make_lockstep(sim_receipt, tmp_path / "r")
    moved = shutil.copytree(rcpt, tmp_path / "elsewhere" / "r2")
    outs = [tmp_path / "a.json", tmp_path / "b.json", tmp_path / "c.json"]
    for src, out in zip((rcpt, rcpt, moved), outs):
        proc = psgate("calibrate", "--from-receipt", src, "-o", out, "--quiet")
        assert proc.returncode == 0, proc.stderr
    assert outs[0].read_bytes() == outs[1].read_bytes() == outs[2].read_bytes()


def test_altered_output_is_refused_naming_file_and_digests(sim_receipt, tmp_path):
    rcpt = make_lockstep(sim_receipt, tmp_path / "r")
    with open(rcpt / "requests.csv", "a") as f:
        f.write("extra,row\n")
    out = tmp_path / "m.json"
    proc = psgate("calibrate", "--from-receipt", rcpt, "-o", out)
    assert_one_line_error(proc, 2, "requests.csv", "SHA-256", "the receipt records")
    assert not out.exists()


def test_altered_receipt_off_its_schema_is_refused(sim_receipt, tmp_path):
    rcpt = make_lockstep(sim_receipt, tmp_path / "r")
    r = orjson.loads((rcpt / "receipt.json").read_bytes())
    del r["outputs"]
    (rcpt / "receipt.json").write_bytes(dumps(r))
    with pytest.raises(InputError, match="receipt.json"):
        _doc(rcpt)


@pytest.mark.parametrize("case", ["wall", "sim", "no-rows", "bad-row", "too-few"])
def test_receipts_that_time_no_steps_are_refused(sim_receipt, tmp_path, case):
    if case == "sim":
        rcpt, needle = sim_receipt, "found engine 'sim'"
    elif case == "wall":
        rcpt, needle = make_lockstep(sim_receipt, tmp_path / "r", "wall"), "found 'wall'"
    elif case == "too-few":
        rcpt = make_lockstep(sim_receipt, tmp_path / "r", rows=timed_rows(3, seed=0))
        needle = "6 timed steps in all"
    else:
        rcpt = make_lockstep(sim_receipt, tmp_path / "r")
        r = orjson.loads((rcpt / "receipt.json").read_bytes())
        if case == "no-rows":
            del r["runs"]["candidate"]["observed"]["step_wall_ms"]
            needle = "runs.candidate.observed.step_wall_ms"
        else:
            r["runs"]["baseline"]["observed"]["step_wall_ms"]["rows"][4][4] = -1.0
            needle = "runs.baseline.observed.step_wall_ms.rows.4"
        (rcpt / "receipt.json").write_bytes(dumps(r))
    out = tmp_path / "m.json"
    proc = psgate("calibrate", "--from-receipt", rcpt, "-o", out)
    assert_one_line_error(proc, 2, "receipt.json", needle)
    assert not out.exists()


def test_exactly_one_mode(sim_receipt, tmp_path):
    proc = psgate("calibrate", "--from-receipt", sim_receipt, "--convert", "x.json",
                  "-o", tmp_path / "m.json")
    assert_one_line_error(proc, 2, "exactly one of", "--from-receipt")
