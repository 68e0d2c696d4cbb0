"""Calibrate the paper's two Qwen2.5 architectures on one GPU in one run.

    python3 tools/calibrate_gpu.py --out examples/cost-models --prefix h200

writes {prefix}-qwen2.5-1.5b.json and {prefix}-qwen2.5-7b.json (bf16, the cuda grid of
psgate calibrate) plus {prefix}-calibration.log with the machine's description. It
drives the library API rather than the CLI so that it runs where only torch,
transformers, numpy, orjson and jsonschema are installed (a lent accelerator machine
has no package index). ``--device cpu`` with a small grid smoke-tests it anywhere.
"""

from __future__ import annotations

import argparse
import gc
import platform
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from psgate.calibrate.run import CalibrateConfig, calibrate, summary  # noqa: E402

MODELS = {"qwen2.5-1.5b": "qwen2.5-1.5b-instruct", "qwen2.5-7b": "qwen2.5-7b-instruct"}


def ints(text: str | None) -> list[int] | None:
    return [int(x) for x in text.split(",")] if text else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--prefix", default="h200")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--cached")
    ap.add_argument("--uncached")
    ap.add_argument("--decodes")
    ap.add_argument("--decode")
    ap.add_argument("--warmup", type=int)
    ap.add_argument("--repeats", type=int)
    args = ap.parse_args()
    root = Path(__file__).resolve().parents[1]
    args.out.mkdir(parents=True, exist_ok=True)
    log = open(args.out / f"{args.prefix}-calibration.log", "w")

    def say(text: str) -> None:
        print(text, flush=True)
        log.write(text + "\n")
        log.flush()

    import torch
    import transformers
    say(f"python {platform.python_version()} torch {torch.__version__} "
        f"transformers {transformers.__version__}")
    if args.device == "cuda":
        say(subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,"
                            "clocks.max.sm", "--format=csv"], capture_output=True,
                           text=True).stdout.strip())
    status = 0
    for short in args.models.split(","):
        out = args.out / f"{args.prefix}-{short}.json"
        t0 = time.perf_counter()
        try:
            doc = calibrate(CalibrateConfig(
                model_config=str(root / "examples" / "models" / MODELS[short]),
                device=args.device, dtype=args.dtype, out=out, force=True,
                cached=ints(args.cached), uncached=ints(args.uncached),
                decodes=ints(args.decodes), decode=ints(args.decode),
                warmup=args.warmup, repeats=args.repeats))
        except Exception as exc:  # keep going: the other model's file is still worth having
            say(f"{short}: FAILED {type(exc).__name__}: {exc}")
            status = 1
            continue
        finally:
            gc.collect()
            if args.device == "cuda":
                torch.cuda.empty_cache()
        s = summary(doc)
        step, fit = doc["fit"], doc["request_fit"]
        say(f"{short}: step {step['fixed_ms']:.3f} ms + {step['per_prefill_token_ms']:.3e} "
            f"ms/prefill token + {step['per_context_token_ms']:.3e} ms/context token + "
            f"{step['per_decode_ms']:.3e} ms/decode + {step['per_decode_context_token_ms']:.3e} "
            f"ms/decode context token; held-out median error "
            f"{step['holdout_median_rel_error']:.2%} (max {step['holdout_max_rel_error']:.2%})")
        say(f"{short}: {time.perf_counter() - t0:.1f} s, {doc['model']['num_parameters']:,} "
            f"parameters, {doc['device']['name']}; fixed {fit['fixed_ms']:.3f} ms, "
            f"{fit['per_uncached_token_ms']:.3e} ms/uncached, {fit['per_cached_token_ms']:.3e} "
            f"ms/cached, {fit['per_uncached_token_sq_ms']:.3e} u^2, "
            f"{fit['per_uncached_cached_token_ms']:.3e} u*c, {fit['per_output_token_ms']:.3f} "
            f"ms/output token; held-out median error {fit['holdout_median_rel_error']:.2%} "
            f"(max {fit['holdout_max_rel_error']:.2%}); C_prefill(1536) "
            f"{s['c_prefill_1536_per_s']:.2f}/s")
    return status


if __name__ == "__main__":
    sys.exit(main())
