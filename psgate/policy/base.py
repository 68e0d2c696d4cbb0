"""The interface between an engine and an eviction policy.

An engine owns blocks, reference counts and the truly free blocks; a policy
owns only the *order of the candidates* (unpinned blocks that still hold cached
content) and whatever indexes it needs to find a victim without scanning.

The engine tells the policy every event that changes the candidate set or that
a rule may depend on, in the order vLLM's block pool would see it:

    on_admit(req)            an allocation batch for req starts
    on_hit(block, req, pos)  req reuses block at prompt position pos (pinned or not)
    on_touch(block)          a hit took block out of the candidates
    select_victim(req)       which candidate would you evict? (must not mutate)
    on_evict(block)          the engine evicted it (always the block just selected)
    evict_batch(req, n)      optional: the two above, n times, in one call
    on_cached(block, req, pos, parent, key)   a newly computed full block now holds content
    end_admit(req)           the batch is done (may return fields for the ledger row)
    on_free(blocks)          blocks (cached, now unpinned) became candidates, in
                             vLLM's append order: a request's last block first

Splitting ``select_victim`` from ``on_evict`` lets the engine record the
decision, with the ranking fields that made it, before anything changes. A
policy never sees a request's ``role``: :class:`PolicyRequest` has no such field.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar, NamedTuple


def non_finite(value: Any) -> bool:
    """Whether a JSON-like value (numbers, lists, tuples, dicts) holds a NaN or an
    infinity: such a number decides nothing in a comparison and is no JSON."""
    if type(value) is float:
        return value != value or value in (float("inf"), float("-inf"))
    if type(value) in (list, tuple):
        return any(non_finite(v) for v in value)
    if type(value) is dict:
        return any(non_finite(v) for v in value.values())
    return False


def _check_param(policy: str, key: str, value: Any, default: Any) -> None:
    """A NaN compares false with everything, so a NaN threshold would silently switch a
    rule off; a number given as text ("NaN" from the command line) is no number either."""
    if non_finite(value):
        raise ValueError(f"parameter '{key}': expected finite numbers, found {value!r}")
    numeric = type(default) in (int, float)
    if numeric and type(value) not in (int, float):
        raise ValueError(f"parameter '{key}': expected a number, found {value!r:.40}")


class GroupIds:
    """Dense ids for accounting groups in first-seen order, so per-group state lives in
    lists indexed by id (read per block on the hot paths) rather than in dicts keyed by
    name. An engine and a policy each keep one: they meet groups at different moments
    (arrival, admission), and each id orders its owner's ties, so the two are not shared."""

    __slots__ = ("ids", "names")

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}
        self.names: list[str] = []

    def add(self, name: str) -> int:
        """The id of a group not seen before: the next one."""
        g = self.ids[name] = len(self.names)
        self.names.append(name)
        return g


@dataclass(slots=True, frozen=True)
class PoolInfo:
    """What a policy may know about the pool it serves."""

    num_blocks: int          # configured, null block included (vLLM's num_gpu_blocks)
    num_usable: int          # num_blocks - 1
    block_size: int
    groups: tuple[str, ...] = ()   # declared in the header, then as first named
    # Content keys are (namespace << key_shift) | a dense hash index, and a namespace
    # never spans groups (psgate's own engines); None: keys are opaque ints.
    key_shift: int | None = None


class RetentionRange(NamedTuple):
    """One token range of a request's retention hint (the trace's ``retention``, TensorRT-LLM's
    TokenRangeRetentionConfig): prompt tokens ``start`` up to ``end`` (exclusive; None: to
    the end of the prompt) are to be kept at ``priority`` (1..100, higher kept longer) for
    ``duration_ns`` from the moment the block is freed (None: no end)."""

    start: int
    end: int | None
    priority: int
    duration_ns: int | None


@dataclass(slots=True)
class PolicyRequest:
    """A request as a policy sees it; the trace's ``role`` is deliberately absent.

    Retention hints, all optional (None when the request gives none): ``priority`` and
    ``priority_until_ns`` (one priority for every block, until an absolute time);
    ``retention`` (token ranges, sorted by start, not overlapping: see
    :class:`RetentionRange` and :meth:`retention_at`); ``retention_ns`` (SGLang's soft
    retention time: keep the request's blocks at least this long after their last use)."""

    id: str
    group: str
    contract: str
    scope: str
    namespace: int
    prefix: str | None
    t_ns: int
    prompt_tokens: int
    num_prompt_blocks: int
    num_new_full_blocks: int
    priority: int | None = None
    priority_until_ns: int | None = None
    index: int = 0                     # position among the trace's requests
    block_keys: list[int] | None = None   # content keys of all prompt blocks, when
                                          # the policy sets wants_block_keys
    retention: tuple[RetentionRange, ...] | None = None
    retention_ns: int | None = None

    def retention_at(self, pos: int, block_size: int) -> RetentionRange | None:
        """The range of ``retention`` that holds prompt block ``pos``, by the block's first
        token (``pos * block_size``), as TensorRT-LLM's per-block projection assigns it;
        None when no range covers it or the request has none."""
        ranges = self.retention
        if ranges is None:
            return None
        tok = pos * block_size
        for r in ranges:
            if r.start > tok:
                return None
            if r.end is None or tok < r.end:
                return r
        return None


@dataclass(slots=True)
class Decision:
    """One eviction decision, complete enough to explain from a single ledger row.

    ``num_candidates`` and ``position`` describe the candidate set: the victim
    was at ``position`` (0 = front) in the queue it was taken from. Policies that
    rank groups fill ``responsible`` and friends; ``rank`` holds the
    policy-specific fields that chose the victim, small and JSON-serializable.
    """

    victim: int
    num_candidates: int
    position: int
    queue: str = "main"
    responsible: str | None = None
    responsible_p_before: float | None = None
    responsible_p_after: float | None = None
    runner_up: str | None = None
    runner_up_p: float | None = None
    segments: dict[str, int] | None = None
    rank: dict[str, Any] = field(default_factory=dict)


class EvictionPolicy(ABC):
    """Base class of every eviction policy, psgate's own and a user's.

    A subclass sets ``name`` (how receipts and ledgers call it), ``api_version`` (the
    version of :mod:`psgate.policy` it was written against), ``summary`` and
    ``defaults`` (its parameters, the only ones its constructor accepts)."""

    name: ClassVar[str] = ""
    # The policy API version the class was written against (psgate.policy.API_VERSION);
    # a class that declares none, or a newer one than psgate provides, is refused.
    api_version: ClassVar[int | None] = None
    summary: ClassVar[str] = ""
    # Parameters and their defaults; a run's receipt records the values used.
    defaults: ClassVar[dict[str, Any]] = {}
    # True for a clairvoyant reference that must be given the trace's future.
    needs_future: ClassVar[bool] = False
    # Work-conserving: never makes a request wait or evict while capacity is idle.
    work_conserving: ClassVar[bool] = True
    wants_block_keys: ClassVar[bool] = False
    # Most configured blocks (the null block included) the policy's structures can hold,
    # or None for no limit of its own: a replay refuses a larger --capacity before any
    # work rather than failing in bind() after the trace was read and other runs ran.
    max_blocks: ClassVar[int | None] = None
    # The request retention hints the policy honours, by trace field name ("priority",
    # "priority_until", "retention", "retention_s"); () ignores them all. ``psgate
    # policies`` lists them, so an operator sees which policies a hint can reach.
    honours_hints: ClassVar[tuple[str, ...]] = ()

    def __init__(self, **params: Any) -> None:
        unknown = sorted(set(params) - set(self.defaults))
        if unknown:
            raise ValueError(f"unknown parameter(s) for policy '{self.name}': "
                             f"{', '.join(unknown)}; known: {', '.join(self.defaults) or 'none'}")
        for key, value in params.items():
            _check_param(self.name, key, value, self.defaults[key])
        self.params: dict[str, Any] = {**self.defaults, **params}
        self.pool: PoolInfo | None = None

    def bind(self, pool: PoolInfo) -> None:
        """Called once before the first event; allocate per-block arrays here."""
        self.pool = pool

    # -- events ---------------------------------------------------------------
    def on_admit(self, req: PolicyRequest, now_ns: int) -> None:
        pass

    def on_hit(self, block: int, req: PolicyRequest, pos: int) -> None:
        pass

    @abstractmethod
    def on_touch(self, block: int) -> None:
        """A candidate was hit and is no longer a candidate."""

    def touch_queues(self):
        """The :class:`~psgate.policy.queues.BlockQueues` from which on_touch only
        unlinks the block, or None: with it, the compiled core unlinks a request's hits
        itself instead of calling on_touch once per hit."""
        return None

    def touch_hits(self):
        """A compiled form of the engine's touch loop for this policy, or None: called as
        ``f(hits, ref, req)``, it does what the loop does per hit, in order (on_touch
        for one with no reference, the reference added, on_hit), over the engine's
        ``ref`` array."""
        return None

    @abstractmethod
    def select_victim(self, req: PolicyRequest, now_ns: int) -> Decision:
        """The candidate to evict next for req; called only while candidates exist."""

    @abstractmethod
    def on_evict(self, block: int) -> None:
        """The engine evicted block (the one just selected)."""

    def evict_batch(self, req: PolicyRequest, now_ns: int, num_blocks: int,
                    decisions: list[Decision] | None) -> list[int]:
        """Select and evict ``num_blocks`` victims for one allocation, in order; the
        engine then checks and records each. Exactly ``select_victim`` then ``on_evict``,
        ``num_blocks`` times: each decision is made before anything it explains changes.
        ``decisions`` is None when nothing records them, so a policy may skip building
        them. A policy overrides this only to do the same thing faster (the contract
        tests compare the two); without an override the engine calls the pair itself.
        """
        victims: list[int] = []
        for _ in range(num_blocks):
            d = self.select_victim(req, now_ns)
            if decisions is not None:
                decisions.append(d)
            self.on_evict(d.victim)
            victims.append(d.victim)
        return victims

    def on_cached(self, block: int, req: PolicyRequest, pos: int, parent: int,
                  key: int = -1) -> None:
        """block now holds req's prompt block pos; parent is the block before it or -1;
        key identifies the content (the block's chain hash in its namespace)."""

    def end_admit(self, req: PolicyRequest, now_ns: int) -> dict | None:
        """The batch is done; may return fields for the admission's ledger row."""
        return None

    @abstractmethod
    def on_free(self, blocks: list[int], now_ns: int) -> None:
        """Cached blocks whose last reference was dropped, in vLLM's append order."""

    def on_allocated(self, req: PolicyRequest, blocks: list[int]) -> None:
        """blocks (truly free or just evicted) now belong to req's group."""

    def on_released(self, blocks: list[int]) -> None:
        """blocks went back to the truly free pool (they held no cached content)."""

    # -- admission control ----------------------------------------------------
    def admission_allowed(self, req: PolicyRequest, num_new_blocks: int,
                          num_evictable_hits: int) -> bool:
        """False makes req wait in its group's own line (quota policies).

        ``num_evictable_hits`` of req's hits are candidates now and will be pinned."""
        return True

    def capacity_for(self, req: PolicyRequest) -> int | None:
        """Most blocks req's group may ever hold (None: the whole pool); a request
        needing more is rejected rather than left waiting forever."""
        return None

    def reclaim_first(self, req: PolicyRequest, num_new_blocks: int) -> int:
        """How many of the batch's blocks must come from evicting candidates even
        while truly free blocks exist (a group at its quota reuses its own)."""
        return 0

    @classmethod
    def batches_evictions(cls) -> bool:
        """True when the class's evict_batch is its own fast path and still matches its
        select_victim and on_evict: a subclass that overrides either of those but
        inherits a parent's evict_batch would be bypassed by it, so it is not batched."""
        mro = cls.__mro__

        def depth(name: str) -> int:
            return next(i for i, k in enumerate(mro) if name in vars(k))

        batch = depth("evict_batch")
        return (mro[batch] is not EvictionPolicy and depth("select_victim") >= batch
                and depth("on_evict") >= batch)

    @property
    @abstractmethod
    def num_candidates(self) -> int:
        """How many candidates the policy holds (checked against the engine's count)."""

    def candidates(self) -> list[int]:
        """All candidates in eviction order; for explain and paranoid checks, not hot paths."""
        raise NotImplementedError

    def set_future(self, uses: dict) -> None:
        """For needs_future policies: content key -> trace-order request indices using it."""

    def claims(self) -> tuple[str, ...]:
        """Family invariants this policy promises to keep ("I1", "I2")."""
        return ()

    def invariant_auditors(self) -> tuple[Any, ...]:
        """Independent checkers of this policy's own invariants, fresh for each run.

        Only the policy knows its parameters (a contract table, a tolerance), so it builds
        them and the engine merely feeds them: each gets ``admitted(where, group, contract,
        t_s, num_materialized, audit)`` after every admission (``audit`` is what
        :meth:`audit` returned), then ``finish()``, and ``results()`` gives its verdicts by
        name. An auditor keeps its own books, so a policy cannot vouch for itself."""
        return ()

    def contract_table(self) -> list[str] | None:
        """Contract names this policy knows, or None when it ignores contracts."""
        return None

    def audit(self) -> dict | None:
        """What the last admission charged and promoted, for the family checkers."""
        return None

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "params": dict(self.params)}
