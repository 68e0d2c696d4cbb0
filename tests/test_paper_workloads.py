"""The paper's workloads: PrefixShield protects the victim on one-touch; borrowing.

The one-touch parameters are the committed defaults of psgate.workloads.paper
(docs/design.md section 7), fixed before any policy was compared on them.
"""

from __future__ import annotations

import pytest

from psgate.engines.cost import CostModel
from psgate.stats.metrics import summarize
from psgate.trace.writer import write_trace
from psgate.workloads.paper import ONE_TOUCH_DEFAULTS, borrowing, one_touch

from helpers import replay_file


def victim_hit(result) -> float:
    return summarize([o for o in result.requests if o.role == "victim"],
                     CostModel())["hit_fraction"]


def test_one_touch_defaults_are_the_papers():
    assert ONE_TOUCH_DEFAULTS["prefix_tokens"] == 1536 and ONE_TOUCH_DEFAULTS["hot_prefixes"] == 4
    assert ONE_TOUCH_DEFAULTS["alpha"] == 0.6 and ONE_TOUCH_DEFAULTS["block_size"] == 16
    header = one_touch()[0]
    d = header["generator"]["derived"]
    assert d["attack_rate_per_s"] == pytest.approx(min(0.75, 1.15 * 0.6) * d["c_prefill_per_s"])


@pytest.mark.parametrize("seed", range(5))
def test_one_touch_prefixshield_beats_lru_for_the_victim(tmp_path, seed):
    p = tmp_path / "ot.jsonl"
    write_trace(p, one_touch(seed=seed))
    lru, _, _ = replay_file(p, 512, policy="lru")
    ps, _, _ = replay_file(p, 512, policy="prefixshield")
    assert all(v.holds for v in ps.invariants.values())
    assert {"I1", "I2"} <= set(ps.invariants)
    assert lru.evictions > 1000 and ps.evictions > 1000
    assert victim_hit(ps) > victim_hit(lru)
    assert ps.orphans["orphans_created"] == 0


@pytest.mark.parametrize("policy, low, high", [
    ("lru", 509, 511), ("prefixshield", 509, 511), ("s3fifo", 509, 511),
    ("static-quota", 250, 255),
])
def test_borrowing_active_group_fills_cache_unless_quota(tmp_path, policy, low, high):
    p = tmp_path / "b.jsonl"
    write_trace(p, borrowing())
    result, _, _ = replay_file(p, 512, policy=policy, paranoid=False)
    assert low <= result.occupancy_max["active"] <= high
    assert all(v.holds for v in result.invariants.values())
