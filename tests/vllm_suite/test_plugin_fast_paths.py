"""The plugin's fast paths do what the slow ones did.

The shadow reuses the live request's block hashes instead of hashing the prompt again,
but only once it has seen them agree with its own; a live engine hashing with another
function must leave the shadow hashing by itself, with the same hits. The live queue
evicts an allocation's victims in one ``evict_batch`` call; the ledger rows and counters
must be those of one select_victim + on_evict per victim.
"""

from __future__ import annotations

import pytest

from psgate.engines.vllm_pool import make_kv_cache_manager, tokens_for
from psgate.policies import make_policy
from psgate.shadow import ShadowRunner

BS = 16


def _drive(tmp_path, live_hash: str):
    from vllm import SamplingParams
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher
    from vllm.v1.request import Request, RequestStatus

    live, _ = make_kv_cache_manager(64, BS)
    runner = ShadowRunner(live, make_policy("lru"), tmp_path, interval_s=1e9)
    hasher = get_request_block_hasher(BS, get_hash_fn_by_name(live_hash))
    system = [t for j in range(4) for t in tokens_for(f"sys{j}", BS)]
    own = []
    for i in range(3):
        toks = system + [t for j in range(2) for t in tokens_for(f"u{i}.{j}", BS)] + [7] * 3
        req = Request(f"r{i}", toks, SamplingParams(max_tokens=4), None, cache_salt="acme",
                      block_hasher=hasher)
        computed, n_hit, _ = live.get_computed_blocks(req)
        assert live.allocate_slots(req, req.num_tokens - n_hit, num_new_computed_tokens=n_hit,
                                   new_computed_blocks=computed) is not None
        sreq = runner.sreqs[req.request_id]
        fresh = Request(f"x{i}", list(toks), SamplingParams(max_tokens=4), None,
                        cache_salt="acme", block_hasher=runner._hasher)
        own.append(sreq.block_hashes == fresh.block_hashes)
        req.status = RequestStatus.FINISHED_STOPPED
        live.free(req)
    rep = runner.close()
    return runner, own, rep["groups"]["acme"]


@pytest.mark.parametrize("live_hash", ["sha256", "sha256_cbor"])
def test_shadow_hashes_are_its_own_whichever_hash_the_live_engine_uses(tmp_path, live_hash):
    runner, own, acme = _drive(tmp_path, live_hash)
    assert own == [True, True, True]
    assert runner._same_hashes is (live_hash == "sha256")
    # the second and third requests hit the 4-block system prompt in the shadow
    assert acme["shadow_hit_tokens"] == 2 * 4 * BS


class _Rows:
    hits = False

    def __init__(self) -> None:
        self.rows: list[tuple] = []

    def eviction(self, now_ns, req, d, block, hash_name, owner) -> None:
        self.rows.append((req.id, block, owner, d.victim, d.queue, d.responsible,
                          repr(d.rank)))

    def admission(self, *args) -> None:
        pass


def _evictions(batched: bool, recorder):
    from vllm import SamplingParams
    from vllm.v1.request import Request, RequestStatus

    from psgate.engines.vllm_live import LivePolicy

    mgr, hasher = make_kv_cache_manager(40, BS)
    live = LivePolicy(mgr, make_policy("prefixshield"), clock_ns=lambda: 0, recorder=recorder)
    assert live.queue._batch is True
    live.queue._batch = batched
    for i in range(30):
        group = "flood" if i % 3 == 2 else f"t{i % 2}"
        names = ([f"f{i}.{j}" for j in range(8)] if group == "flood"
                 else [f"sys{group}.{j}" for j in range(4)] + [f"u{i}"])
        toks = [t for n in names for t in tokens_for(n, BS)] + [3]
        req = Request(f"r{i}", toks, SamplingParams(max_tokens=2), None, cache_salt=group,
                      block_hasher=hasher)
        computed, n_hit, _ = mgr.get_computed_blocks(req)
        assert mgr.allocate_slots(req, req.num_tokens - n_hit, num_new_computed_tokens=n_hit,
                                  new_computed_blocks=computed) is not None
        req.status = RequestStatus.FINISHED_STOPPED
        mgr.free(req)
    return live


@pytest.mark.parametrize("with_ledger", [True, False])
def test_a_batch_of_evictions_is_recorded_as_one_at_a_time(with_ledger):
    """The live queue evicts an allocation's victims with the policy's evict_batch; what
    the ledger and the counters see equals select_victim + on_evict per victim."""
    rows = [_Rows() if with_ledger else None for _ in range(2)]
    one, batch = _evictions(False, rows[0]), _evictions(True, rows[1])
    assert batch.num_evictions == one.num_evictions > 20
    assert batch.evictions_by == one.evictions_by
    assert batch.pinned.checks == one.pinned.checks == one.num_evictions
    assert ([b.block_id for b in batch.queue.get_all_free_blocks()]
            == [b.block_id for b in one.queue.get_all_free_blocks()])
    if with_ledger:
        assert rows[1].rows == rows[0].rows
        assert len({r[5] for r in rows[0].rows}) >= 1
