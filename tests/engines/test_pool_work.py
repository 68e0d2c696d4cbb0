"""The block pool's loops (psgate/engines/pool_work.py), by exact block ids.

Each scenario runs on the installed module (compiled where the install could compile it)
and on the same source interpreted, loaded from its ``.py`` under another name: one
source, two forms, the same blocks."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
from helpers import interpreted

from psgate.engines import pool_work
from psgate.engines.pool import BlockPool
from psgate.invariants.checker import NO_KEY
from psgate.trace.keys import OUTPUT_KEY_BIT, content_key, output_key
from psgate.trace.reader import HashTable


FORMS = {"installed": pool_work, "interpreted": interpreted(pool_work)}
form = pytest.mark.parametrize("form", sorted(FORMS))


def _pool(capacity: int = 8, num_hashes: int = 6) -> BlockPool:
    hashes = HashTable()
    hashes.intern_chain([f"{i:032x}" for i in range(num_hashes)], where=None)
    return BlockPool(capacity, hashes)


def _cache(mod, pool, blocks, evb, ns=0, start=0, stop=None, on_cached=None, preq=None):
    cached: list = []
    stop = len(blocks) if stop is None else stop
    recompute = mod.cache_blocks(pool, blocks, evb, start, stop, ns, 16, cached, on_cached,
                                 preq)
    return recompute, cached


@form
def test_take_free_pops_the_front_first(form):
    mod = FORMS[form]
    pool = _pool(6)
    assert mod.take_free(pool, 2) == [1, 2]
    assert mod.take_free(pool, 9) == [3, 4, 5]          # fewer there than asked
    assert mod.take_free(pool, 1) == [] and len(pool.free) == 0


@form
def test_caching_then_lookup_takes_the_earliest_copy_and_counts_candidates(form):
    mod = FORMS[form]
    pool = _pool()
    calls: list = []
    preq = SimpleNamespace(index=7, num_prompt_blocks=3)
    recompute, cached = _cache(mod, pool, [3, 5, 2, 6], [0, 1, 2], ns=1,
                               on_cached=lambda *a: calls.append(a), preq=preq)
    assert recompute == 0
    k = [content_key(1, h) for h in range(3)]
    out = output_key(7, 3)
    assert cached == [(3, k[0]), (5, k[1]), (2, k[2]), (6, out)]      # past the chain: its own
    assert calls == [(3, preq, 0, -1, k[0]), (5, preq, 1, 3, k[1]), (2, preq, 2, 5, k[2]),
                     (6, preq, 3, 2, out)]
    assert [pool.key[b] for b in (3, 5, 2, 6)] == [*k, out]
    assert pool.out_copies == {out: [6]}
    # a second copy of hash 1 (block 4) is later: a lookup still takes block 5
    _cache(mod, pool, [7, 4], [0, 1], ns=1, start=1)
    assert pool.more == {k[1]: [4]}
    pool.ref[5] = 1                                     # pinned: a hit, no candidate
    assert mod.lookup(pool, [0, 1, 2, 3], 1, 4) == ([3, 5, 2], 2)
    assert mod.lookup(pool, [0, 1, 2], 1, 2) == ([3, 5], 1)          # at most num
    assert mod.lookup(pool, [0, 1], 0, 2) == ([], 0)                  # another namespace


@form
def test_a_lost_hash_cached_again_is_a_recompute(form):
    mod = FORMS[form]
    pool = _pool()
    _cache(mod, pool, [1, 2], [0, 1])
    num_by_owner: dict = {}
    pool.owner[2] = 0
    assert mod.drop_evicted(pool, [2], 1, None, None, [], [], num_by_owner) == 1
    assert pool.slot_lost[1] == 1 and pool.key[2] == NO_KEY and num_by_owner == {0: 1}
    assert _cache(mod, pool, [1, 3], [0, 1], start=1)[0] == 16      # one block again
    assert mod.lookup(pool, [0, 1], 0, 2) == ([1, 3], 2)


@form
def test_hashes_interned_after_the_pool_was_built_get_their_slots(form):
    mod = FORMS[form]
    pool = _pool(8, 3)
    pool.hashes.intern_chain([f"{i:032x}" for i in range(3, 6)], where=None)
    assert mod.lookup(pool, [0, 4], 0, 2) == ([], 0)      # a miss first: no slot read
    assert _cache(mod, pool, [1, 2], [4, 5])[0] == 0       # the slots grow here
    assert len(pool.slot_ns) == 6
    assert mod.lookup(pool, [4, 5], 0, 2) == ([1, 2], 2)


@form
def test_touch_unlinks_candidates_and_counts_references(form):
    mod = FORMS[form]
    pool = _pool()
    pool.ref[2] = 1                                     # pinned already: no on_touch
    touched: list = []
    hit: list = []
    mod.touch(pool, [4, 2], None, touched.append, lambda b, req, pos: hit.append((b, pos)),
              "req")
    assert touched == [4] and hit == [(4, 0), (2, 1)]
    assert pool.ref[4] == 1 and pool.ref[2] == 2
    with pytest.raises(IndexError):
        mod.touch(pool, [99], None, touched.append, None, None)


@form
def test_release_walks_in_the_given_order_and_splits_cached_from_uncached(form):
    mod = FORMS[form]
    pool = _pool()
    mod.pin_allocated(pool, [1, 2, 3, 4], 5)
    assert list(pool.ref[1:5]) == [1, 1, 1, 1] and list(pool.owner[1:5]) == [5, 5, 5, 5]
    pool.ref[2] = 2                                     # still held by another request
    pool.key[1], pool.key[3] = 11, 13                   # cached content
    uncached, freed, num_by_owner = mod.release(pool, [4, 3, 2, 1])
    assert (uncached, freed, num_by_owner) == ([4], [3, 1], {5: 1})
    assert pool.owner[4] == -1 and pool.owner[3] == 5 and pool.ref[2] == 1


@form
def test_an_eviction_batch_stops_at_the_first_victim_that_is_no_candidate(form):
    mod = FORMS[form]
    pool = _pool()
    hashes = pool.hashes
    _cache(mod, pool, [1, 2, 3], [0, 1, 2])
    for b, og in ((1, 0), (2, 1), (3, 1)):
        pool.owner[b] = og
    pool.ref[3] = 1                                      # pinned
    rows: list = []

    def on_row(i, block, hash_name, owner_name):        # before the drop: content intact
        rows.append((i, block, hash_name, owner_name, pool.key[block]))

    num_by_owner: dict = {}
    stop = mod.drop_evicted(pool, [2, 1, 3], 3, None, None, hashes.names, ["a", "b"],
                            num_by_owner, on_row)
    assert stop == 2 and num_by_owner == {1: 1, 0: 1}
    assert rows == [(0, 2, hashes.names[1], "b", content_key(0, 1)),
                    (1, 1, hashes.names[0], "a", content_key(0, 0))]
    assert pool.key[3] == content_key(0, 2) and pool.owner[3] == 1      # not taken
    names: list = []
    owners: list = []
    assert mod.drop_evicted(pool, [3], 0, names, owners, hashes.names, ["a", "b"], {}) == 0
    pool.ref[3] = 0
    assert mod.drop_evicted(pool, [3], 1, names, owners, hashes.names, ["a", "b"], {}) == 1
    assert (names, owners) == ([hashes.names[2]], ["b"])


@form
def test_an_output_key_is_dropped_through_the_index(form):
    mod = FORMS[form]
    pool = _pool()
    preq = SimpleNamespace(index=3, num_prompt_blocks=0)
    _cache(mod, pool, [5], [], preq=preq)
    k = output_key(3, 0)
    assert k >= OUTPUT_KEY_BIT and pool.out_copies == {k: [5]}
    pool.owner[5] = 0
    names: list = []
    owners: list = []
    assert mod.drop_evicted(pool, [5], 1, names, owners, [], ["a"], {}) == 1
    assert pool.out_copies == {} and names == [""] and owners == ["a"]


def test_the_compiled_loops_refuse_a_pool_that_is_not_flat_arrays():
    if pool_work.__file__.endswith(".py"):
        if os.environ.get("CI") and os.environ.get("PSGATE_CORE", "1") != "0":
            pytest.fail("pool_work is not compiled: pip install -e . must build it here")
        pytest.skip("pool_work is not compiled here (no C compiler or Cython at install)")
    pool = _pool()
    pool.ref = [0] * pool.num_blocks                    # a list, as no engine keeps it
    with pytest.raises(TypeError):
        pool_work.release(pool, [1])


def test_an_engine_may_not_override_one_batch_step_alone():
    from psgate.engines.sched import StepSimEngine
    from psgate.engines.sim import SimEngine
    with pytest.raises(TypeError, match="overrides get_new_blocks"):
        type("Mine", (SimEngine,), {"get_new_blocks": lambda self, r, n: []})
    with pytest.raises(TypeError, match="overrides check_allocation but not allocate_slots"):
        type("Mine", (StepSimEngine,), {"check_allocation": lambda self, *a: None})
    type("Mine", (StepSimEngine,), {"check_allocation": lambda self, *a: None,
                                    "allocate_slots": lambda self, *a: True})
