"""The step cost model: how long one scheduler step (one forward pass) takes.

vLLM runs every scheduled request of a step in one batch, so time belongs to steps, not to
requests:

    step_ms = fixed_ms
            + per_prefill_token_ms * P          prompt tokens computed this step (all chunks)
            + per_context_token_ms * C          earlier tokens those chunks attend to
            + per_decode_ms * D                 requests decoding one token this step
            + per_decode_context_token_ms * K   tokens those decodes attend to

A scheduled request is a *decode* when it computes exactly its last token and has generated
at least one (its previous step sampled that token); anything else is a prefill chunk, a
resumed request's recompute included. ``fixed_ms`` is what a forward pass costs whatever
its batch (on a GPU, reading the weights once). A request's first token is sampled at the
end of the step that computes the last token of its prompt, and each later step samples one
more; TTFT and completion times are step ends. Every time from this model is labelled
*modeled*; the defaults are rough figures for Qwen2.5-1.5B on an NVIDIA L4 (a decode step of
one request about 10 ms, a 1,536-token miss about 100 ms).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from psgate.engines.kv_groups import KVGroup, format_kv_groups, parse_kv_groups

STEP_COEFFICIENTS = ("fixed_ms", "per_prefill_token_ms", "per_context_token_ms",
                     "per_decode_ms", "per_decode_context_token_ms")
DEFAULT_STEP_SOURCE = "psgate step defaults (Qwen2.5-1.5B on NVIDIA L4, rough)"


@dataclass(frozen=True, slots=True)
class StepWork:
    """What one step computes, the cost model's inputs (and a ledger's, when one asks)."""

    num_prefill_tokens: int = 0
    num_context_tokens: int = 0
    num_decodes: int = 0
    num_decode_context_tokens: int = 0


@dataclass(frozen=True, slots=True)
class StepCostModel:
    fixed_ms: float = 10.0
    per_prefill_token_ms: float = 0.06
    per_context_token_ms: float = 0.002
    per_decode_ms: float = 0.1
    per_decode_context_token_ms: float = 0.0
    # Where the coefficients came from: None for the defaults or --cost-param, else the
    # calibrated file's name, SHA-256, model, dtype and device (recorded in receipts).
    origin: dict | None = field(default=None, compare=False)

    def step_ms(self, work: StepWork) -> float:
        return (self.fixed_ms
                + self.per_prefill_token_ms * work.num_prefill_tokens
                + self.per_context_token_ms * work.num_context_tokens
                + self.per_decode_ms * work.num_decodes
                + self.per_decode_context_token_ms * work.num_decode_context_tokens)

    def step_ns(self, work: StepWork) -> int:
        """The step's duration on the replay clock: whole nanoseconds, at least one, so
        the clock always moves and two engines that add the same floats agree."""
        return max(1, round(self.step_ms(work) * 1_000_000))

    def coefficients(self) -> dict:
        return {k: getattr(self, k) for k in STEP_COEFFICIENTS}

    def to_json(self) -> dict:
        if self.origin is None:
            return {"label": "modeled", "form": "step", "source": DEFAULT_STEP_SOURCE,
                    **self.coefficients()}
        return {"label": "modeled", "form": "step", "source": "cost-model file",
                "file": dict(self.origin), **self.coefficients()}

    @classmethod
    def from_json(cls, doc: dict) -> "StepCostModel":
        """The step model a receipt's ``config.step_cost_model`` records."""
        known = {f.name for f in fields(cls)} - {"origin"}
        return cls(**{k: v for k, v in doc.items() if k in known}, origin=doc.get("file"))


@dataclass(frozen=True, slots=True)
class SchedulerParams:
    """The vLLM scheduler settings a step replay runs under (vLLM 0.32's defaults; recorded
    in receipts). ``watermark`` is the fraction of configured blocks a new or resumed
    request must leave free while others run."""

    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 128
    enable_chunked_prefill: bool = True
    long_prefill_token_threshold: int = 0
    watermark: float = 0.0
    # The model's KV-cache groups (psgate.engines.kv_groups); () is one full-attention
    # group. A receipt's text form (``full,sliding:4096``) is read back here too.
    kv_groups: tuple[KVGroup, ...] = ()
    # vLLM's prefix_cache_retention_interval: which sliding-window blocks are cached (0,
    # vLLM's default: only those a later request can resume at; None: every full block).
    prefix_cache_retention_interval: int | None = 0

    def __post_init__(self) -> None:
        if isinstance(self.kv_groups, str):
            object.__setattr__(self, "kv_groups", parse_kv_groups(self.kv_groups))

    @property
    def hybrid(self) -> bool:
        """More than the one full-attention group every replay had before."""
        return bool(self.kv_groups)

    def max_model_len(self, num_blocks: int, block_size: int) -> int:
        """The longest sequence (prompt and output) the replayed engine is set up for: the
        whole cache with chunked prefill, else the token budget, since without chunking
        vLLM requires max_model_len <= max_num_batched_tokens (config/scheduler.py:315-326)
        and rejects longer requests on arrival. No request that is not rejected reaches
        the cache's size: ceil((prompt + out) / bs) <= capacity - 1."""
        return (num_blocks * block_size if self.enable_chunked_prefill
                else self.max_num_batched_tokens)

    def to_json(self) -> dict:
        hybrid = ("kv_groups", "prefix_cache_retention_interval")
        doc = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in hybrid}
        if self.kv_groups:          # recorded only when set: older receipts read the same
            doc["kv_groups"] = format_kv_groups(self.kv_groups)
            doc["prefix_cache_retention_interval"] = self.prefix_cache_retention_interval
        return doc
