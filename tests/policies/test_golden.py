"""Every built-in policy's exact outcome on one bundled trace at several capacities.

The committed tests/data/golden/policies.json pins, per (policy, configured blocks), the
eviction count, who evicted whom, each group's hits and hit tokens, and a digest of the
eviction sequence, from the tightest pool the trace fits in to one where nothing need be
evicted. Any change to a policy's choices, however small, shows here with the policy and
capacity that moved; a deliberate change regenerates the file with
``python -m pytest tests/policies/test_golden.py --update-golden`` (never by hand).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from helpers import replay_file
from psgate.policies import policy_names

ROOT = Path(__file__).resolve().parents[2]
TRACE = ROOT / "examples" / "example.jsonl"
GOLDEN = Path(__file__).resolve().parents[1] / "data" / "golden" / "policies.json"
# configured blocks, tight to loose: the largest request (64 prefix blocks and its tail)
# barely fits in the first; the last holds every block the trace ever computes
CAPACITIES = (80, 128, 192, 256, 512, 8192)


def builtin_policies() -> list[str]:
    """The registry less the policies tests register for themselves (``test-*``)."""
    return [p for p in policy_names() if not p.startswith("test-")]


def outcome(policy: str, capacity: int) -> dict:
    result, log, _ = replay_file(TRACE, capacity=capacity, policy=policy)
    assert result.aborted is None
    groups: dict[str, dict[str, int]] = {}
    for r in result.requests:
        g = groups.setdefault(r.group, {"requests": 0, "hit_requests": 0, "hit_tokens": 0,
                                        "new_blocks": 0})
        g["requests"] += 1
        if r.counts_for_hits:
            g["hit_requests"] += r.cached_tokens > 0
            g["hit_tokens"] += r.cached_tokens
        g["new_blocks"] += r.new_blocks
    sequence = "\n".join(f"{e} {b}" for e, b in zip(log.evictions, log.victims))
    return {"evictions": result.evictions, "evictions_by": result.evictions_by,
            "groups": groups,
            "eviction_sequence_sha256": hashlib.sha256(sequence.encode()).hexdigest()}


def test_policies_match_golden(request):
    got = {p: {str(c): outcome(p, c) for c in CAPACITIES} for p in builtin_policies()}
    if request.config.getoption("--update-golden"):
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_text(json.dumps({"trace": TRACE.relative_to(ROOT).as_posix(),
                                      "policies": got}, indent=1, sort_keys=True) + "\n")
        pytest.skip("golden policy outcomes rewritten")
    want = json.loads(GOLDEN.read_text())["policies"]
    assert sorted(got) == sorted(want), "a built-in policy was added or removed"
    for policy in want:
        for capacity in want[policy]:
            assert got[policy][capacity] == want[policy][capacity], (policy, capacity)


def test_golden_spans_tight_to_loose():
    """The capacities keep their point: under lru the tightest pool evicts, the loosest
    never does (static-quota's per-group quotas evict, or reject, at any size)."""
    lru = json.loads(GOLDEN.read_text())["policies"]["lru"]
    assert lru[str(CAPACITIES[0])]["evictions"] > 0
    assert lru[str(CAPACITIES[-1])]["evictions"] == 0
