"""Timing prefill and decode passes of a randomly initialised Hugging Face model.

Only ``psgate calibrate`` imports this module (it needs torch, transformers and numpy).
Times are wall-clock seconds around a synchronised forward pass: this is a
measurement, and nothing here feeds a replay decision except through the fitted
file it produces.
"""

from __future__ import annotations

import inspect
import statistics
import time
from dataclasses import dataclass

from psgate.errors import EngineUnavailable, InputError

INSTALL_HINT = ("pip install -e '.[calibrate]' (on a CPU machine: scripts/install-calibrate.sh, "
                "which takes the CPU build of torch)")
DTYPES = ("float32", "bfloat16", "float16")


def import_torch():
    try:
        import numpy  # noqa: F401 (the fit needs it)
        import torch
        import transformers
    except ImportError as exc:
        raise EngineUnavailable(f"psgate calibrate needs torch, transformers and numpy "
                                f"({exc.name} is not installed); install them with: "
                                f"{INSTALL_HINT}") from None
    return torch, transformers


@dataclass
class Timings:
    prefill: list[tuple[int, int, list[float]]]   # (cached, uncached, times_ms)
    decode: list[tuple[int, list[float]]]         # (context, times_ms)


class Bench:
    """A model built from a config with random weights, ready to time forward passes."""

    def __init__(self, config: dict, device: str, dtype: str, threads: int | None,
                 attn_implementation: str = "sdpa", seed: int = 0):
        torch, transformers = import_torch()
        self.torch = torch
        if device == "cuda" and not torch.cuda.is_available():
            raise EngineUnavailable("--device cuda: torch sees no CUDA device here")
        if threads is not None:
            torch.set_num_threads(threads)
        torch.manual_seed(seed)
        self.device = torch.device(device)
        self.dtype = getattr(torch, dtype)
        cfg_args = {k: v for k, v in config.items()
                    if k not in ("architectures", "transformers_version", "torch_dtype", "dtype")}
        try:
            hf_config = transformers.AutoConfig.for_model(**cfg_args)
        except (ValueError, KeyError, TypeError) as exc:
            raise InputError(f"transformers cannot build this config ({exc})",
                             field="model_type") from None
        previous = torch.get_default_dtype()
        torch.set_default_dtype(self.dtype)
        try:
            with self.device:
                self.model = transformers.AutoModelForCausalLM.from_config(
                    hf_config, attn_implementation=attn_implementation)
        finally:
            torch.set_default_dtype(previous)
        self.model.to(device=self.device, dtype=self.dtype).eval()
        self.attn_implementation = getattr(self.model.config, "_attn_implementation",
                                           attn_implementation)
        self.num_parameters = sum(p.numel() for p in self.model.parameters())
        self.vocab_size = hf_config.vocab_size
        self._gen = torch.Generator().manual_seed(seed)
        params = inspect.signature(self.model.forward).parameters
        # Only the last position's logits are needed to start decoding, as in a serving
        # engine; older transformers call the argument num_logits_to_keep.
        self._logits_kw = next(({k: 1} for k in ("logits_to_keep", "num_logits_to_keep")
                                if k in params), {})
        # The KV cache argument was renamed from past_key_values to cache in transformers 5.
        self._cache_kw = "cache" if "cache" in params else "past_key_values"

    def _ids(self, n: int):
        ids = self.torch.randint(0, self.vocab_size, (1, n), generator=self._gen)
        return ids.to(self.device)

    def _sync(self) -> None:
        if self.device.type == "cuda":
            self.torch.cuda.synchronize()

    def _timed(self, fn) -> float:
        self._sync()
        t0 = time.perf_counter()
        fn()
        self._sync()
        return (time.perf_counter() - t0) * 1000.0

    def _prefix(self, n: int):
        if n == 0:
            return None
        out = self.model(self._ids(n), use_cache=True, **self._logits_kw)
        cache = getattr(out, "cache", None)
        return cache if cache is not None else out.past_key_values

    def _pass(self, cache, cached: int, ids) -> float:
        def run():
            self.model(ids, use_cache=True, **{self._cache_kw: cache}, **self._logits_kw)
        ms = self._timed(run)
        if cache is not None:
            # Back to the prefix alone, as the next hit sees it. A negative count means
            # "remove this many" in every transformers release since 4.38.
            cache.crop(-(cache.get_seq_length() - cached))
        return ms

    def measure(self, cached_grid: list[int], uncached_grid: list[int], decode_context: list[int],
                warmup: int, repeats: int, progress=None) -> Timings:
        """Every point once per round, rounds repeated: slow drift of the machine (clock,
        noisy neighbours) then lands on all points alike instead of on one corner of the
        grid, and the per-point median removes it. Each prefix's KV is computed once."""
        points = ([(c, u) for c in cached_grid for u in uncached_grid]
                  + [(ctx, 1) for ctx in decode_context])
        times: dict[tuple[int, int], list[float]] = {pt: [] for pt in points}
        with self.torch.inference_mode():
            # One untimed pass first: kernel selection, allocator growth, lazy set-up.
            self._pass(None, 0, self._ids(max(uncached_grid)))
            caches = {c: self._prefix(c) for c in sorted({c for c, _ in points})}
            ids = {u: self._ids(u) for u in sorted({u for _, u in points})}
            rounds = warmup + repeats
            for r in range(rounds):
                for c, u in points:
                    ms = self._pass(caches[c], c, ids[u])
                    if r >= warmup:
                        times[(c, u)].append(ms)
                if progress:
                    progress(r + 1, rounds)
            del caches
        prefill = [(c, u, times[(c, u)]) for c in cached_grid for u in uncached_grid]
        decode = [(ctx, times[(ctx, 1)]) for ctx in decode_context]
        return Timings(prefill, decode)


def median(times: list[float]) -> float:
    return statistics.median(times)
