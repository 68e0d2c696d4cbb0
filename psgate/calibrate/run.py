"""``psgate calibrate``: measure, fit, check, and write one cost-model file atomically."""

from __future__ import annotations

import hashlib
import os
import platform
import statistics
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from psgate import __version__
from psgate.engines.cost import COEFFICIENTS, COST_MODEL_FORMAT, COST_MODEL_VERSION
from psgate.engines.cost import validate_cost_model_doc
from psgate.errors import InputError

GRIDS = {
    # Small enough for CI on two CPU cores with the tiny config.
    "cpu": {"cached": [0, 256, 512, 768, 1024], "uncached": [32, 64, 128, 256, 512],
            "decode": [256, 1024], "warmup": 1, "repeats": 7},
    # The paper's prompts (1,536-token prefixes) sit inside this range.
    "cuda": {"cached": [0, 512, 1024, 2048, 4096, 8192],
             "uncached": [16, 64, 128, 256, 512, 1024, 2048, 4096],
             "decode": [512, 2048, 8192], "warmup": 2, "repeats": 7},
}
MODEL_FIELDS = ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads",
                "intermediate_size", "vocab_size")


@dataclass
class CalibrateConfig:
    model_config: str
    device: str = "cpu"
    dtype: str | None = None            # default: float32 on cpu, bfloat16 on cuda
    out: Path = Path("cost-model.json")
    form: str = "attention"
    cached: list[int] | None = None
    uncached: list[int] | None = None
    decode: list[int] | None = None
    warmup: int | None = None
    repeats: int | None = None
    threads: int | None = None
    name: str | None = None
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
                             ("decode", "--decode-context", 1)):
            vals = getattr(self, key) or base[key]
            if sorted(set(vals)) != list(vals) or vals[0] < lo:
                raise InputError(f"expected strictly increasing integers >= {lo}, found "
                                 f"{','.join(map(str, vals))}", path=opt)
            g[key] = list(vals)
        if len(g["cached"]) < 2 or len(g["uncached"]) < 3:
            raise InputError("the grid needs at least 2 cached and 3 uncached sizes so that "
                             "points can be held out", path="--cached/--uncached")
        from psgate.calibrate.grid import holdout_mask
        mask = holdout_mask(g["cached"], g["uncached"])
        if len(mask) - sum(mask) < len(FORMS[self.form]):
            raise InputError(f"a {len(g['cached'])} x {len(g['uncached'])} grid leaves "
                             f"{len(mask) - sum(mask)} points to fit {len(FORMS[self.form])} "
                             f"terms; give more sizes", path="--cached/--uncached")
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


def build_document(cfg: CalibrateConfig, model_cfg: dict, model_raw: bytes, model_name: str,
                   timings, *, num_parameters: int, device_name: str, software: dict) -> dict:
    """The cost-model document for measured ``timings``: fit on the kept points, errors on
    the held-out ones. Pure (no torch), so tests can feed it synthetic timings."""
    from psgate.calibrate.fit import FORMS, fit_prefill, relative_errors
    from psgate.calibrate.grid import holdout_mask

    mask = holdout_mask(cfg.grid["cached"], cfg.grid["uncached"])
    points = []
    for (c, u, times), held in zip(timings.prefill, mask):
        points.append({"cached_tokens": c, "uncached_tokens": u,
                       "split": "holdout" if held else "fit",
                       "median_ms": statistics.median(times), "times_ms": list(times)})
    kept = [p for p in points if p["split"] == "fit"]
    held = [p for p in points if p["split"] == "holdout"]

    def cols(ps):
        return ([p["uncached_tokens"] for p in ps], [p["cached_tokens"] for p in ps],
                [p["median_ms"] for p in ps])

    fit = fit_prefill(*cols(kept), form=cfg.form)
    fit_err = relative_errors(fit, *cols(kept))
    held_err = relative_errors(fit, *cols(held))
    decode_points = [{"context_tokens": ctx, "median_ms": statistics.median(times),
                      "times_ms": list(times)} for ctx, times in timings.decode]
    coefficients = dict(fit.coefficients)
    coefficients["per_output_token_ms"] = statistics.median(
        d["median_ms"] for d in decode_points)
    doc = {
        "format": COST_MODEL_FORMAT,
        "version": COST_MODEL_VERSION,
        "model": {"name": cfg.name or model_name,
                  "config_sha256": hashlib.sha256(model_raw).hexdigest(),
                  "architecture": (model_cfg.get("architectures") or ["?"])[0],
                  "model_type": model_cfg["model_type"],
                  **{k: model_cfg[k] for k in MODEL_FIELDS},
                  "num_parameters": int(num_parameters),
                  "weights": "random initialisation (no checkpoint: timings do not depend on "
                             "weight values)"},
        "dtype": cfg.dtype,
        "device": {"kind": cfg.device, "name": device_name, "threads": cfg.threads},
        "software": software,
        "method": {
            "warmup": cfg.grid["warmup"], "repeats": cfg.grid["repeats"],
            "statistic": "median", "batch_size": 1,
            "prefix_reuse": "each cached prefix's KV is computed once and cropped back to the "
                            "prefix after every timed pass, as a prefix-cache hit reuses it; "
                            "only the last position's logits are computed",
            "order": "interleaved: every point (prefill and decode) once per round, "
                     "warm-up rounds first, then the timed rounds",
            "timer": "wall clock around one synchronised eager forward pass (no CUDA graphs, "
                     "no paged-attention kernels: a serving engine's fixed overhead differs)",
            "holdout": "grid points (i, j) of cached x uncached with (i*n_uncached + j + i) mod 4 "
                       "== 2, corners excluded; never used by the fit",
        },
        "points": points,
        "decode_points": decode_points,
        "fit": {"form": cfg.form, "terms": list(FORMS[cfg.form]),
                "weighting": "relative (rows scaled by 1/median); coefficients >= 0",
                **{k: float(coefficients[k]) for k in COEFFICIENTS},
                "num_fit_points": len(kept), "num_holdout_points": len(held),
                "fit_median_rel_error": float(statistics.median(fit_err)),
                "holdout_median_rel_error": float(statistics.median(held_err)),
                "holdout_max_rel_error": float(max(held_err))},
    }
    validate_cost_model_doc(doc, str(cfg.out))
    return doc


def write_document(doc: dict, out: Path, force: bool) -> None:
    out = Path(out)
    if out.exists() and not force:
        raise InputError("already exists; pass --force to replace it", path=str(out))
    if out.parent and not out.parent.is_dir():
        raise InputError("the output's directory does not exist", path=str(out))
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n")
    os.replace(tmp, out)


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return f"{line.split(':', 1)[1].strip()} ({os.cpu_count()} CPUs)"
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def calibrate(cfg: CalibrateConfig, progress=None) -> dict:
    cfg.resolve()
    if Path(cfg.out).exists() and not cfg.force:
        raise InputError("already exists; pass --force to replace it", path=str(cfg.out))
    model_cfg, raw, name = read_model_config(cfg.model_config)
    need = cfg.grid["cached"][-1] + cfg.grid["uncached"][-1]
    limit = model_cfg.get("max_position_embeddings")
    if isinstance(limit, int) and max(need, cfg.grid["decode"][-1] + 1) > limit:
        raise InputError(f"the grid reaches {need} tokens but the model's "
                         f"max_position_embeddings is {limit}", path="--cached/--uncached")
    from psgate.calibrate.measure import Bench
    bench = Bench(model_cfg, cfg.device, cfg.dtype, cfg.threads)
    torch = bench.torch
    import transformers
    timings = bench.measure(cfg.grid["cached"], cfg.grid["uncached"], cfg.grid["decode"],
                            cfg.grid["warmup"], cfg.grid["repeats"], progress)
    device_name = (torch.cuda.get_device_name(bench.device) if cfg.device == "cuda"
                   else _cpu_name())
    software = {"python": platform.python_version(), "torch": torch.__version__,
                "transformers": transformers.__version__, "psgate": __version__,
                "attn_implementation": str(bench.attn_implementation),
                "cuda": torch.version.cuda if cfg.device == "cuda" else None}
    doc = build_document(cfg, model_cfg, raw, name, timings,
                         num_parameters=bench.num_parameters, device_name=device_name,
                         software=software)
    write_document(doc, cfg.out, cfg.force)
    return doc


def summary(doc: dict) -> dict:
    """What a caller wants at a glance: the fit's held-out error and the prefill capacity
    it implies for the paper's 1,536-token prompts."""
    from psgate.engines.cost import CostModel
    from psgate.workloads.common import unique_prefill_rate

    fit = doc["fit"]
    cost = CostModel(**{k: fit[k] for k in COEFFICIENTS})
    return {"model": doc["model"]["name"], "dtype": doc["dtype"], "device": doc["device"]["name"],
            "form": fit["form"], "holdout_median_rel_error": fit["holdout_median_rel_error"],
            "holdout_max_rel_error": fit["holdout_max_rel_error"],
            "c_prefill_1536_per_s": unique_prefill_rate(cost, 1536)}
