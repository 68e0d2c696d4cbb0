"""The parsed form of a psgate-trace v1 file.

Times are integer nanoseconds from here on: a trace says seconds, and adding
durations to float seconds would drift.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

NS_PER_S = 1_000_000_000
FORMAT_VERSION = 1


def seconds_to_ns(t: float | int) -> int:
    if type(t) is int:
        return t * NS_PER_S
    return round(t * NS_PER_S)


class RetentionRange(NamedTuple):
    """One token range of a request's ``retention`` (TensorRT-LLM's
    TokenRangeRetentionConfig): prompt tokens ``start`` up to ``end`` (exclusive; None:
    the end of the prompt) at ``priority`` (1..100), for ``duration_ns`` after the block is
    freed (None: no end)."""

    start: int
    end: int | None
    priority: int
    duration_ns: int | None


@dataclass(slots=True)
class TraceHeader:
    block_size: int
    hashing: str | None
    source: str | None
    groups: dict | None
    partial: bool
    raw: dict
    # the serving model's KV-cache groups (``full,sliding:4096``): a capture from a hybrid
    # model records them, and a replay must model the same ones
    kv_groups: str | None = None


@dataclass(slots=True)
class RequestEvent:
    line: int
    t_ns: int
    id: str
    group: str
    contract: str
    scope: str
    blocks: list[int]          # interned trace block hashes, see HashTable
    tail: int
    out: int
    prompt_tokens: int
    prefix: str | None = None
    role: str | None = None
    measure: bool = True
    priority: int | None = None
    priority_until_ns: int | None = None
    retention: tuple[RetentionRange, ...] | None = None   # sorted by start
    retention_ns: int | None = None       # retention_s: keep at least this long after use
    done_ns: int | None = None
    prefill_ms: float | None = None
    # the hashes of the request's full output blocks, interned like ``blocks`` and chained on
    # from them: the blocks a server caches while decoding the answer (see trace/reader.py)
    answer: list[int] | None = None

    @property
    def chain(self) -> list[int]:
        """The hashes of its full blocks in order: the prompt's, then its answer's (the
        contents a replay caches for it; output blocks past them have none)."""
        return self.blocks if self.answer is None else self.blocks + self.answer


@dataclass(slots=True)
class CancelEvent:
    line: int
    t_ns: int
    id: str


@dataclass(slots=True)
class DoneEvent:
    line: int
    t_ns: int
    id: str


@dataclass(slots=True)
class TraceSummary:
    """What one full pass over a trace learned; the trace's identity in a receipt."""

    path: str
    sha256: str
    canonical_sha256: str
    num_lines: int
    num_requests: int
    num_cancels: int
    num_dones: int
    num_distinct_blocks: int
    num_skipped_unknown: int
    done_ids: frozenset[str] = field(default_factory=frozenset)
    groups: tuple[str, ...] = ()     # declared in the header, then in order of appearance
    # request id -> its answer (interned hashes) where a done line carried it: a replay
    # needs an answer while the request decodes, before its done line is read
    answers: dict[str, list[int]] = field(default_factory=dict)
