"""The prefill cost model behind every modeled millisecond.

prefill_ms = fixed_ms + per_uncached_token_ms * uncached + per_cached_token_ms * cached
completion = first token + out * per_output_token_ms

Defaults are rough figures for Qwen2.5-1.5B on an NVIDIA L4 (the PrefixShield
paper's platform): a 1,536-token miss costs about 97 ms. Every time derived
from it is labelled *modeled* in receipts; tokens avoided are the stable
evidence, milliseconds are only as good as this model.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True, slots=True)
class CostModel:
    fixed_ms: float = 5.0
    per_uncached_token_ms: float = 0.06
    per_cached_token_ms: float = 0.002
    per_output_token_ms: float = 10.0

    def prefill_ms(self, uncached_tokens: int, cached_tokens: int) -> float:
        return (self.fixed_ms + self.per_uncached_token_ms * uncached_tokens
                + self.per_cached_token_ms * cached_tokens)

    def to_json(self) -> dict:
        return {"label": "modeled", "source": "psgate defaults (Qwen2.5-1.5B on NVIDIA L4, rough)",
                **asdict(self)}
