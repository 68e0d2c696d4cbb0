"""``psgate calibrate``: measure batched steps, fit, check, and write one cost-model file
atomically (format ``psgate-cost-model`` version 2).

    for each step on the grid (grid.step_grid: prefills alone, decode batches alone, mixed):
        time one forward pass over the step's batch (warm-ups, then interleaved repeats)
    fit step_ms(P, C, D, K) to the medians (relative least squares, coefficients >= 0)
    fit the per-request prefill model to the steps that hold one prefill chunk alone
    report each fit's error on held-out points it never saw

``--convert`` turns a version-1 file (single-request timings) into version 2 by refitting
the step model to the timings the file keeps; nothing is measured.
"""

from __future__ import annotations

import hashlib
import os
import platform
import statistics
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from psgate import __version__
from psgate.atomic import write_atomic
from psgate.engines.cost import COEFFICIENTS, COST_MODEL_FORMAT, COST_MODEL_VERSION
from psgate.engines.cost import validate_cost_model_doc
from psgate.engines.step_cost import STEP_COEFFICIENTS
from psgate.errors import InputError

GRIDS = {
    # Small enough for CI on two CPU cores with the tiny config.
    "cpu": {"cached": [0, 256, 512, 1024], "uncached": [32, 128, 256, 512],
            "decodes": [1, 8, 32], "decode": [128, 1024], "warmup": 1, "repeats": 7},
    # The paper's prompts (1,536-token prefixes) sit inside this range. The decode caches
    # (64 requests x 8,192 tokens) take about 15 GB for a 7B model in bfloat16.
    "cuda": {"cached": [0, 512, 1024, 2048, 4096, 8192],
             "uncached": [16, 64, 128, 256, 512, 1024, 2048, 4096],
             "decodes": [1, 8, 32, 64], "decode": [512, 2048, 8192], "warmup": 2,
             "repeats": 7},
}
MODEL_FIELDS = ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads",
                "intermediate_size", "vocab_size")
STEP_WEIGHTING = "relative (rows scaled by 1/median); coefficients >= 0"
REQUEST_WEIGHTING = "relative (rows scaled by 1/median); coefficients >= 0"
STEP_HOLDOUT = ("one mixed step (prefill chunk and decodes together) in three, the second, "
                "fifth, ... in grid order; never used by the step fit")
REQUEST_HOLDOUT = ("prefill-alone points (i, j) of cached x uncached with (i*n_uncached + j + i) "
                   "mod 4 == 2, corners excluded; never used by the request fit")
CONVERT_RULE = ("version 2 by refit: each version-1 prefill point (u, c) is a step of one "
                "prefill chunk (P=u, C=c, D=K=0), each decode point (x) a step of one decode "
                "(D=1, K=x); the step model is fitted to the points the version-1 fit kept "
                "and the decode points, checked on the points it held out; request_fit is "
                "the version-1 fit unchanged")


@dataclass
class CalibrateConfig:
    model_config: str
    device: str = "cpu"
    dtype: str | None = None            # default: float32 on cpu, bfloat16 on cuda
    out: Path = Path("cost-model.json")
    form: str = "attention"             # the request fit's form
    cached: list[int] | None = None
    uncached: list[int] | None = None
    decodes: list[int] | None = None
    decode: list[int] | None = None     # each decode's context length
    warmup: int | None = None
    repeats: int | None = None
    threads: int | None = None
    name: str | None = None
    notes: str | None = None
    force: bool = False
    grid: dict = field(init=False, default_factory=dict)

    def resolve(self) -> None:
        if self.device not in GRIDS:
            raise InputError(f"expected cpu or cuda, found '{self.device}'", path="--device")
        base = GRIDS[self.device]
        self.dtype = self.dtype or ("float32" if self.device == "cpu" else "bfloat16")
        from psgate.calibrate.measure import DTYPES
        if self.dtype not in DTYPES:
            raise InputError(f"expected one of {', '.join(DTYPES)}, found '{self.dtype}'",
                             path="--dtype")
        from psgate.calibrate.grid import FORMS
        if self.form not in FORMS:
            raise InputError(f"expected one of {', '.join(FORMS)}, found '{self.form}'",
                             path="--form")
        g = {}
        for key, opt, lo in (("cached", "--cached", 0), ("uncached", "--uncached", 1),
                             ("decodes", "--decodes", 1), ("decode", "--decode-context", 1)):
            vals = getattr(self, key) or base[key]
            if sorted(set(vals)) != list(vals) or vals[0] < lo:
                raise InputError(f"expected strictly increasing integers >= {lo}, found "
                                 f"{','.join(map(str, vals))}", path=opt)
            g[key] = list(vals)
        if g["decodes"][0] != 1:
            raise InputError("must include 1: a step of one decode is the per-request "
                             "model's time per output token", path="--decodes")
        if len(g["cached"]) < 2 or len(g["uncached"]) < 3:
            raise InputError("the grid needs at least 2 cached and 3 uncached sizes so that "
                             "points can be held out", path="--cached/--uncached")
        from psgate.calibrate.grid import holdout_mask, step_grid, step_holdout_mask
        mask = holdout_mask(g["cached"], g["uncached"])
        if len(mask) - sum(mask) < len(FORMS[self.form]):
            raise InputError(f"a {len(g['cached'])} x {len(g['uncached'])} grid leaves "
                             f"{len(mask) - sum(mask)} points to fit {len(FORMS[self.form])} "
                             f"terms; give more sizes", path="--cached/--uncached")
        steps = step_grid(g["cached"], g["uncached"], g["decodes"], g["decode"])
        if sum(step_holdout_mask(steps)) < 1:
            raise InputError("the grid has too few mixed steps to hold one out; give more "
                             "sizes", path="--cached/--uncached")
        g["steps"] = steps
        for key, opt, lo in (("warmup", "--warmup", 0), ("repeats", "--repeats", 1)):
            v = getattr(self, key)
            v = base[key] if v is None else v
            if v < lo:
                raise InputError(f"expected an integer >= {lo}, found {v}", path=opt)
            g[key] = v
        if self.threads is not None and self.threads < 1:
            raise InputError(f"expected a positive integer, found {self.threads}",
                             path="--threads")
        self.grid = g


def read_model_config(path: str) -> tuple[dict, bytes, str]:
    """A Hugging Face style config.json (or a directory holding one): (config, bytes, name)."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise InputError(f"cannot read the model config ({exc.strerror})", path=str(p)) from None
    try:
        cfg = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InputError(f"not valid JSON ({exc})", path=str(p)) from None
    if not isinstance(cfg, dict):
        raise InputError(f"expected a JSON object, found {type(cfg).__name__}", path=str(p))
    for k in ("model_type", *MODEL_FIELDS):
        if k not in cfg:
            raise InputError("missing (a Hugging Face model config names it)", path=str(p),
                             field=k)
    for k in MODEL_FIELDS:
        if type(cfg[k]) is not int or cfg[k] < 1:
            raise InputError(f"expected a positive integer, found {cfg[k]!r}", path=str(p),
                             field=k)
    name = p.parent.name if p.name == "config.json" else p.stem
    return cfg, raw, name


def _step_cols(ps):
    return ([p["prefill_tokens"] for p in ps], [p["context_tokens"] for p in ps],
            [p["decodes"] for p in ps], [p["decode_context_tokens"] for p in ps],
            [p["median_ms"] for p in ps])


def _errors(kept_err, held_err) -> dict:
    return {"fit_median_rel_error": float(statistics.median(kept_err)),
            "holdout_median_rel_error": float(statistics.median(held_err)),
            "holdout_max_rel_error": float(max(held_err))}


def step_fit_section(points: list[dict]) -> dict:
    """The step model fitted to the points whose split is "fit", with its errors."""
    from psgate.calibrate.fit import fit_step, relative_errors

    kept = [p for p in points if p["split"] == "fit"]
    held = [p for p in points if p["split"] == "holdout"]
    fit = fit_step(*_step_cols(kept))
    return {"form": "step", "terms": list(STEP_COEFFICIENTS), "weighting": STEP_WEIGHTING,
            **fit.coefficients, "num_fit_points": len(kept), "num_holdout_points": len(held),
            **_errors(relative_errors(fit, *_step_cols(kept)),
                      relative_errors(fit, *_step_cols(held)))}


def request_fit_section(points: list[dict], form: str) -> dict:
    """The per-request model of the service replay: prefill_ms fitted to the steps of one
    prefill chunk alone (their request_split), per_output_token_ms the median of the
    one-decode steps' medians."""
    from psgate.calibrate.fit import FORMS, fit_prefill, relative_errors

    def cols(ps):
        return ([p["prefill_tokens"] for p in ps], [p["context_tokens"] for p in ps],
                [p["median_ms"] for p in ps])

    kept = [p for p in points if p.get("request_split") == "fit"]
    held = [p for p in points if p.get("request_split") == "holdout"]
    fit = fit_prefill(*cols(kept), form=form)
    coefficients = dict(fit.coefficients)
    coefficients["per_output_token_ms"] = statistics.median(
        p["median_ms"] for p in points if p["prefill_tokens"] == 0 and p["decodes"] == 1)
    return {"form": form, "terms": list(FORMS[form]), "weighting": REQUEST_WEIGHTING,
            **{k: float(coefficients[k]) for k in COEFFICIENTS},
            "num_fit_points": len(kept), "num_holdout_points": len(held),
            **_errors(relative_errors(fit, *cols(kept)), relative_errors(fit, *cols(held)))}


def noise_section(points: list[dict], load_before, load_after) -> dict:
    """How noisy the timed passes were: each point's interquartile range over its median."""
    spreads = []
    for p in points:
        t = sorted(p["times_ms"])
        if len(t) >= 2:
            q = statistics.quantiles(t, n=4, method="inclusive")
            spreads.append((q[2] - q[0]) / p["median_ms"])
    return {"rel_iqr_median": float(statistics.median(spreads)) if spreads else 0.0,
            "rel_iqr_max": float(max(spreads)) if spreads else 0.0,
            "load_average_before": load_before, "load_average_after": load_after}


def _model_section(cfg_name, model_cfg: dict, model_raw: bytes, num_parameters: int) -> dict:
    return {"name": cfg_name, "config_sha256": hashlib.sha256(model_raw).hexdigest(),
            "architecture": (model_cfg.get("architectures") or ["?"])[0],
            "model_type": model_cfg["model_type"], **{k: model_cfg[k] for k in MODEL_FIELDS},
            "num_parameters": int(num_parameters),
            "weights": "random initialisation (no checkpoint: timings do not depend on "
                       "weight values)"}


def build_document(cfg: CalibrateConfig, model_cfg: dict, model_raw: bytes, model_name: str,
                   timings, *, num_parameters: int, device_name: str, software: dict,
                   load_before=None, load_after=None) -> dict:
    """The version-2 cost-model document for measured ``timings``: both fits on their kept
    points, errors on their held-out ones. Pure (no torch), so tests can feed it synthetic
    timings."""
    from psgate.calibrate.grid import holdout_mask, step_holdout_mask

    steps = [tuple(s[:4]) for s in timings.steps]
    held = step_holdout_mask(steps)
    request_held = iter(holdout_mask(cfg.grid["cached"], cfg.grid["uncached"]))
    points = []
    for (p, c, d, x, times), h in zip(timings.steps, held):
        point = {"prefill_tokens": p, "context_tokens": c, "decodes": d,
                 "decode_context_tokens": d * x, "split": "holdout" if h else "fit",
                 "median_ms": statistics.median(times), "times_ms": list(times)}
        if d == 0:
            point["request_split"] = "holdout" if next(request_held) else "fit"
        points.append(point)
    doc = {
        "format": COST_MODEL_FORMAT,
        "version": COST_MODEL_VERSION,
        "model": _model_section(cfg.name or model_name, model_cfg, model_raw, num_parameters),
        "dtype": cfg.dtype,
        "device": {"kind": cfg.device, "name": device_name, "threads": cfg.threads},
        "software": software,
        "method": {
            "warmup": cfg.grid["warmup"], "repeats": cfg.grid["repeats"],
            "statistic": "median",
            "steps": "one forward pass over a flattened batch, as a vLLM step: a prefill "
                     "chunk of P new tokens over C cached ones and D decodes, each over its "
                     "own context (K in all); the grid times prefills alone (cached x "
                     "uncached), decode batches alone (decodes x decode context) and mixed "
                     "steps pairing the i-th prefill with the (i mod n)-th decode batch",
            "attention": "per request, over preallocated per-layer KV caches the step's new "
                         "keys are written into (random values); logits only where vLLM "
                         "samples (the chunk's last token and each decode)",
            "order": "interleaved: every step once per round, warm-up rounds first, then "
                     "the timed rounds",
            "timer": "wall clock around one synchronised eager forward pass (no CUDA graphs, "
                     "no paged-attention kernels: a serving engine's fixed overhead differs)",
            "holdout": STEP_HOLDOUT,
            "request_holdout": REQUEST_HOLDOUT,
        },
        "points": points,
        "fit": step_fit_section(points),
        "request_fit": request_fit_section(points, cfg.form),
        "noise": noise_section(points, load_before, load_after),
    }
    if cfg.notes:
        doc["notes"] = cfg.notes
    validate_cost_model_doc(doc, str(cfg.out))
    return doc


def convert_v1(path: str | Path, notes: str | None = None) -> dict:
    """A version-1 file as version 2 (CONVERT_RULE). Its measurements, provenance and fit
    are kept; only the step fit is new."""
    from psgate.engines.cost import read_cost_model_doc

    doc, raw = read_cost_model_doc(path)
    if doc["version"] != 1:
        raise InputError(f"expected a version-1 file to convert, found version "
                         f"{doc['version']}", path=str(path), field="version")
    points = []
    for p in doc["points"]:
        points.append({"prefill_tokens": p["uncached_tokens"],
                       "context_tokens": p["cached_tokens"], "decodes": 0,
                       "decode_context_tokens": 0, "split": p["split"],
                       "request_split": p["split"], "median_ms": p["median_ms"],
                       "times_ms": list(p["times_ms"])})
    for p in doc["decode_points"]:
        points.append({"prefill_tokens": 0, "context_tokens": 0, "decodes": 1,
                       "decode_context_tokens": p["context_tokens"], "split": "fit",
                       "median_ms": p["median_ms"], "times_ms": list(p["times_ms"])})
    m = doc["method"]
    method = {"warmup": m["warmup"], "repeats": m["repeats"], "statistic": m["statistic"],
              "steps": "version-1 timings: single-request passes (batch size 1), a prefill "
                       "of u new tokens over c cached ones or one decode step; no batched "
                       f"step was timed. Prefix reuse: {m['prefix_reuse']}",
              "order": m.get("order", "not recorded"), "timer": m["timer"],
              "holdout": "the prefill points the version-1 fit held out (" + m["holdout"] + ")",
              "request_holdout": m["holdout"]}
    out = {"format": COST_MODEL_FORMAT, "version": COST_MODEL_VERSION, "model": doc["model"],
           "dtype": doc["dtype"], "device": doc["device"], "software": doc["software"],
           "method": method, "points": points, "fit": step_fit_section(points),
           "request_fit": doc["fit"], "noise": noise_section(points, None, None),
           "converted_from": {"name": Path(path).name, "version": 1,
                              "sha256": hashlib.sha256(raw).hexdigest(), "rule": CONVERT_RULE}}
    if notes:
        out["notes"] = notes
    validate_cost_model_doc(out, str(path))
    return out


def write_document(doc: dict, out: Path, force: bool) -> None:
    out = Path(out)
    if out.exists() and not force:
        raise InputError("already exists; pass --force to replace it", path=str(out))
    if out.parent and not out.parent.is_dir():
        raise InputError("the output's directory does not exist", path=str(out))
    write_atomic(out, orjson.dumps(doc, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n")


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return f"{line.split(':', 1)[1].strip()} ({os.cpu_count()} CPUs)"
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def _load_average():
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (OSError, AttributeError):
        return None


def calibrate(cfg: CalibrateConfig, progress=None) -> dict:
    cfg.resolve()
    if Path(cfg.out).exists() and not cfg.force:
        raise InputError("already exists; pass --force to replace it", path=str(cfg.out))
    model_cfg, raw, name = read_model_config(cfg.model_config)
    need = max(cfg.grid["cached"][-1] + cfg.grid["uncached"][-1], cfg.grid["decode"][-1] + 1)
    limit = model_cfg.get("max_position_embeddings")
    if isinstance(limit, int) and need > limit:
        raise InputError(f"the grid reaches {need} tokens but the model's "
                         f"max_position_embeddings is {limit}", path="--cached/--uncached")
    from psgate.calibrate.measure import Bench
    bench = Bench(model_cfg, cfg.device, cfg.dtype, cfg.threads)
    torch = bench.torch
    import transformers
    load_before = _load_average()
    timings = bench.measure(cfg.grid["steps"], cfg.grid["warmup"], cfg.grid["repeats"], progress)
    load_after = _load_average()
    device_name = (torch.cuda.get_device_name(bench.device) if cfg.device == "cuda"
                   else _cpu_name())
    software = {"python": platform.python_version(), "torch": torch.__version__,
                "transformers": transformers.__version__, "psgate": __version__,
                "attn_implementation": str(bench.attn_implementation),
                "cuda": torch.version.cuda if cfg.device == "cuda" else None}
    doc = build_document(cfg, model_cfg, raw, name, timings,
                         num_parameters=bench.num_parameters, device_name=device_name,
                         software=software, load_before=load_before, load_after=load_after)
    write_document(doc, cfg.out, cfg.force)
    return doc


def summary(doc: dict) -> dict:
    """What a caller wants at a glance: the step fit and its held-out error, and the
    prefill capacity the request fit implies for the paper's 1,536-token prompts."""
    from psgate.engines.cost import CostModel
    from psgate.workloads.common import unique_prefill_rate

    fit, req = doc["fit"], doc["request_fit"]
    cost = CostModel(**{k: req[k] for k in COEFFICIENTS})
    return {"model": doc["model"]["name"], "dtype": doc["dtype"], "device": doc["device"]["name"],
            "step": {k: fit[k] for k in STEP_COEFFICIENTS},
            "holdout_median_rel_error": fit["holdout_median_rel_error"],
            "holdout_max_rel_error": fit["holdout_max_rel_error"],
            "request_form": req["form"],
            "request_holdout_median_rel_error": req["holdout_median_rel_error"],
            "c_prefill_1536_per_s": unique_prefill_rate(cost, 1536)}
