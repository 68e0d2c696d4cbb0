"""Timing batched forward passes (scheduler steps) of a randomly initialised Hugging Face
model.

A step is what vLLM runs per scheduler iteration: the new tokens of every scheduled request
flattened into one sequence, so the linear layers (and the weights' one read) are shared by
the whole batch, while each request's attention sees only its own tokens (vLLM 0.32's
vllm/v1/worker/gpu_model_runner.py:1920, ``_prepare_inputs``, builds that flattened batch
and its per-request query start locations). Here the model is transformers' own; a
registered attention function takes the place of vLLM's varlen kernels: it writes the
step's new keys and values into preallocated per-layer caches (as vLLM's cache write does,
vllm/v1/attention/backends/cpu_attn.py:463, ``do_kv_cache_update``) and runs one
causal attention for the prefill chunk over its cached context, and one batched attention
for the decodes, each over its own context. Nothing is computed across requests, so the
time of a mixed step is what vLLM's kernels would be asked to do, on this library's kernels.

Only ``psgate calibrate`` imports this module (it needs torch, transformers and numpy).
Times are wall-clock around a synchronised forward pass: this is a measurement, and nothing
here feeds a replay decision except through the fitted file it produces.
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
ATTENTION = "psgate_step"


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
    # (P, C, D, x, times_ms): P prompt tokens over C cached ones, D decodes over x each.
    steps: list[tuple[int, int, int, int, list[float]]]


class Bench:
    """A model built from a config with random weights, ready to time batched steps."""

    def __init__(self, config: dict, device: str, dtype: str, threads: int | None,
                 seed: int = 0):
        torch, transformers = import_torch()
        self.torch = torch
        if device == "cuda" and not torch.cuda.is_available():
            raise EngineUnavailable("--device cuda: torch sees no CUDA device here")
        registry = getattr(transformers, "AttentionInterface", None)
        if registry is None:
            raise EngineUnavailable(f"psgate calibrate needs transformers >= 4.50 (found "
                                    f"{transformers.__version__}); install it with: "
                                    f"{INSTALL_HINT}")
        registry.register(ATTENTION, self._attend)
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
                    hf_config, attn_implementation=ATTENTION)
        finally:
            torch.set_default_dtype(previous)
        self.model.to(device=self.device, dtype=self.dtype).eval()
        if "logits_to_keep" not in inspect.signature(self.model.forward).parameters:
            raise EngineUnavailable(f"psgate calibrate needs transformers >= 4.50 (found "
                                    f"{transformers.__version__}); install it with: "
                                    f"{INSTALL_HINT}")
        self.attn_implementation = f"{ATTENTION} (torch scaled_dot_product_attention per " \
                                   f"request: one causal prefill chunk, one batched decode)"
        self.num_parameters = sum(p.numel() for p in self.model.parameters())
        self.vocab_size = hf_config.vocab_size
        self.num_layers = hf_config.num_hidden_layers
        self.kv_heads = hf_config.num_key_value_heads
        self.head_dim = getattr(hf_config, "head_dim", None) or (
            hf_config.hidden_size // hf_config.num_attention_heads)
        self._gen = torch.Generator().manual_seed(seed)
        self._step = (0, 0, 0, 0)
        self._mask = None

    # -- the attention of one step -------------------------------------------------------

    def _attend(self, module, query, key, value, attention_mask, scaling=None, **kwargs):
        """query (1, H, P+D, d), key/value (1, Hkv, P+D, d): the step's new tokens, prefill
        chunk first. Returns (1, P+D, H, d) as transformers' attention functions do."""
        torch = self.torch
        sdpa = torch.nn.functional.scaled_dot_product_attention
        P, C, D, X = self._step
        layer = module.layer_idx
        outs = []
        if P:
            kb, vb = self._pk[layer], self._pv[layer]
            kb[:, :, C:C + P] = key[:, :, :P]
            vb[:, :, C:C + P] = value[:, :, :P]
            q, k, v = query[:, :, :P], kb[:, :, :C + P], vb[:, :, :C + P]
            if C:
                outs.append(sdpa(q, k, v, attn_mask=self._mask, scale=scaling, enable_gqa=True))
            else:
                outs.append(sdpa(q, k, v, is_causal=True, scale=scaling, enable_gqa=True))
        if D:
            kb, vb = self._dk[layer], self._dv[layer]
            kb[:D, :, X] = key[0, :, P:].transpose(0, 1)
            vb[:D, :, X] = value[0, :, P:].transpose(0, 1)
            q = query[0, :, P:].transpose(0, 1).unsqueeze(2)                  # (D, H, 1, d)
            o = sdpa(q, kb[:D, :, :X + 1], vb[:D, :, :X + 1], scale=scaling, enable_gqa=True)
            outs.append(o.squeeze(2).transpose(0, 1).unsqueeze(0))          # (1, H, D, d)
        out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)
        return out.transpose(1, 2).contiguous(), None

    # -- timing ----------------------------------------------------------------------------

    def _sync(self) -> None:
        if self.device.type == "cuda":
            self.torch.cuda.synchronize()

    def _caches(self, max_prefill_span: int, max_decodes: int, max_context: int) -> None:
        """Per-layer KV caches, filled with random values once: timings do not depend on
        them. A step's context is a prefix of these, its new tokens written after it."""
        torch = self.torch

        def buf(*shape):
            return [torch.randn(*shape, generator=self._gen).to(self.device, self.dtype)
                    for _ in range(self.num_layers)]

        d, h = self.head_dim, self.kv_heads
        self._pk = buf(1, h, max_prefill_span, d) if max_prefill_span else None
        self._pv = buf(1, h, max_prefill_span, d) if max_prefill_span else None
        self._dk = buf(max_decodes, h, max_context + 1, d) if max_decodes else None
        self._dv = buf(max_decodes, h, max_context + 1, d) if max_decodes else None

    def _inputs(self, P: int, C: int, D: int, X: int):
        torch = self.torch
        ids = torch.randint(0, self.vocab_size, (1, P + D), generator=self._gen).to(self.device)
        pos = torch.cat([torch.arange(C, C + P), torch.full((D,), X)]).unsqueeze(0)
        # Logits where vLLM samples: the chunk's last position and every decode.
        keep = torch.tensor(([P - 1] if P else []) + list(range(P, P + D)))
        mask = None
        if P and C:
            # Query i of the chunk sees the C cached tokens and the chunk's first i + 1.
            mask = (torch.arange(C + P).unsqueeze(0) <= torch.arange(P).unsqueeze(1) + C)
            mask = mask.to(self.device)
        return ids, pos.to(self.device), keep.to(self.device), mask

    def _pass(self, step, inputs) -> float:
        ids, pos, keep, mask = inputs
        self._step, self._mask = step, mask
        self._sync()
        t0 = time.perf_counter()
        self.model(input_ids=ids, position_ids=pos, use_cache=False, logits_to_keep=keep)
        self._sync()
        return (time.perf_counter() - t0) * 1000.0

    def measure(self, steps: list[tuple[int, int, int, int]], warmup: int, repeats: int,
                progress=None) -> Timings:
        """Every step once per round, rounds repeated: slow drift of the machine (clock,
        noisy neighbours) then lands on all points alike instead of on one corner of the
        grid, and the per-point median removes it."""
        self._caches(max((c + p for p, c, _, _ in steps), default=0),
                     max(d for _, _, d, _ in steps), max(x for _, _, _, x in steps))
        times: list[list[float]] = [[] for _ in steps]
        with self.torch.inference_mode():
            inputs = [self._inputs(*s) for s in steps]
            # One untimed pass of the largest step: kernel selection, allocator growth.
            big = max(range(len(steps)), key=lambda i: steps[i][0] + steps[i][2])
            self._pass(steps[big], inputs[big])
            rounds = warmup + repeats
            for r in range(rounds):
                for i, step in enumerate(steps):
                    ms = self._pass(step, inputs[i])
                    if r >= warmup:
                        times[i].append(ms)
                if progress:
                    progress(r + 1, rounds)
        self._pk = self._pv = self._dk = self._dv = None
        return Timings([(*s, t) for s, t in zip(steps, times)])


def median(times: list[float]) -> float:
    return statistics.median(times)
