"""s3fifo: scenario tests with exact block ids and eviction order, plus a reference model.

Block size 4; ``cap`` configured blocks give cap-1 usable ones. A request with
``tail: 0, out: 0`` holds exactly its full prompt blocks; ``tail: 1`` lets a later
request hit every full block (the hit cap is prompt_tokens - 1).
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import random_traces, replay_checked, replay_file, run_events, write_lines
from psgate.errors import InputError
from psgate.policies import make_policy, register, unregister
from psgate.policy.base import Decision, EvictionPolicy


def run(tmp_path, events, cap, policy="s3fifo", **params):
    return run_events(tmp_path, events, cap, policy, **params)


# A fills S with a1 b1 c1, a1 is hit once (freq 1), D needs one eviction.
BASE = [
    {"t": 0, "id": "A", "blocks": ["a1"], "done_t": 0.1},
    {"t": 1, "id": "B", "blocks": ["b1"], "done_t": 1.1},
    {"t": 2, "id": "C", "blocks": ["c1"], "done_t": 2.1},
    {"t": 3, "id": "H", "blocks": ["a1"], "tail": 1, "done_t": 3.1},
    {"t": 4, "id": "D", "blocks": ["d1", "d2", "d3", "d4"], "done_t": 4.1},
]


def test_hit_in_small_moves_to_main_one_hit_wonder_evicted(tmp_path):
    # 6 usable, small target round(0.5 * 6) = 3. S = a1(freq 1) b1 c1, all candidates.
    # D takes the truly free 4 5 6, then one eviction: |S| = 3 >= 3, so the walk
    # starts in S: a1 was hit -> moves to M; b1 never hit -> evicted (G += b1).
    result, log, engine = run(tmp_path, BASE, cap=7, small_ratio=0.5)
    assert log.block_ids == {"A": [1], "B": [2], "C": [3], "H": [1, 4], "D": [4, 5, 6, 2]}
    assert log.evictions == ["g:b1"]
    d = log.decisions[0]
    assert (d.victim, d.queue, d.position, d.num_candidates) == (2, "small", 1, 3)
    assert d.rank == {"queue": "small", "freq": 0, "ghost_hit": False, "moved_to_main": 1,
                      "reinserted": 0, "small_size": 3, "small_target": 3}
    pol = engine.policy
    assert pol.queue[1] == 1 and pol.freq[1] == 1           # a1 in M, freq kept
    assert pol.size == [5, 1]                               # c1 + D's four; a1
    # with E added, lru evicts the once-reused a1 right after c1 (s3fifo keeps it: below)
    _, lru_log, _ = run(tmp_path, BASE + [{"t": 5, "id": "E", "blocks": ["e1", "e2"],
                                           "done_t": 5.1}], cap=7, policy="lru")
    assert lru_log.evictions == ["g:b1", "g:c1", "g:a1"]


def test_full_walk_small_main_ghost_and_reinsertion(tmp_path):
    events = BASE + [
        # S (FIFO): c1, then D's blocks last first: d4 d3 d2 d1. M: a1 (freq 1)
        {"t": 5, "id": "E", "blocks": ["e1", "e2"], "done_t": 5.1},     # evicts c1, d4
        {"t": 6, "id": "B2", "blocks": ["b1"], "done_t": 6.1},          # ghost hit: b1 -> M
        {"t": 7, "id": "F", "blocks": ["f1", "f2", "f3"], "done_t": 7.1},
        {"t": 8, "id": "G", "blocks": ["1a", "1b", "1c", "1d"], "done_t": 8.1},
    ]
    result, log, engine = run(tmp_path, events, cap=7, small_ratio=0.5)
    assert log.evictions == [
        "g:b1",                      # D: a1 -> M, b1 out of S into G
        "g:c1", "g:d4",              # E: one-hit wonders, FIFO order, D's last block first
        "g:d3",                      # B2: S still over target
        "g:d2", "g:d1",              # F: S 4 -> 3 -> 2 (< target 3): now M's turn
        "g:b1",                      # F: a1 (freq 1) reinserted with freq 0, b1 (freq 0) out
        "g:e2", "g:e1", "g:f3",      # G: S 5 -> 2
        "g:a1",                      # G: a1 now at M's head with freq 0: no second chance
    ]
    assert log.block_ids["B2"] == [6] and log.block_ids["G"] == [2, 3, 6, 1]
    ranks = [(d.queue, d.position, d.rank["ghost_hit"], d.rank["reinserted"])
             for d in log.decisions]
    assert ranks[6] == ("main", 1, True, 1)       # b1 came back through the ghost
    assert ranks[10] == ("main", 0, False, 0)
    assert [d.rank["small_size"] for d in log.decisions] == [3, 5, 4, 5, 4, 3, 2, 5, 4, 3, 2]
    # G: the last round(0.9 * 6) = 5 keys evicted from S, oldest first (b1 left it
    # on its ghost hit; c1 d4 d3 fell off the end)
    names = engine.hashes.names
    assert [names[k & 0xFFFFFFFF] for k in engine.policy.ghost] == [
        "d2", "d1", "e2", "e1", "f3"]
    assert result.orphans["orphans_created"] == 0


def test_ghost_is_bounded_fifo(tmp_path):
    events = [{"t": i, "id": f"R{i}", "blocks": [f"a{i}"], "done_t": i + 0.5}
              for i in range(1, 7)]
    # 2 usable, ghost_ratio 1 -> 2 keys; every block is a one-hit wonder
    _, log, engine = run(tmp_path, events, cap=3, ghost_ratio=1.0)
    assert log.evictions == ["g:a1", "g:a2", "g:a3", "g:a4"]
    names = engine.hashes.names
    assert [names[k & 0xFFFFFFFF] for k in engine.policy.ghost] == ["a3", "a4"]
    _, log, engine = run(tmp_path, events, cap=3, ghost_ratio=0)
    assert not engine.policy.ghost


def test_ghost_hit_goes_straight_to_main(tmp_path):
    # 3 usable, S target max(1, round(0.3)) = 1. A's a1 is evicted from S into G by B.
    # A2 computes a1 again: a ghost hit, so it enters M (block 1) while D's d1 enters S
    # after it; C's two evictions then take S's one-hit wonders b1, d1 and keep a1.
    events = [
        {"t": 0, "id": "A", "blocks": ["a1"], "done_t": 0.1},
        {"t": 1, "id": "B", "blocks": ["b1", "b2", "b3"], "done_t": 1.1},
        {"t": 2, "id": "A2", "blocks": ["a1"], "done_t": 2.1},
        {"t": 3, "id": "D", "blocks": ["d1"], "done_t": 3.1},
        {"t": 4, "id": "C", "blocks": ["c1", "c2"], "done_t": 4.1},
    ]
    _, log, engine = run(tmp_path, events, cap=4)
    assert log.block_ids == {"A": [1], "B": [2, 3, 1], "A2": [1], "D": [3], "C": [2, 3]}
    assert log.evictions == ["g:a1", "g:b3", "g:b2", "g:b1", "g:d1"]
    assert all(d.queue == "small" for d in log.decisions)
    pol = engine.policy
    assert pol.queue[1] == 1 and pol.via_ghost[1] == 1 and pol.size == [2, 1]
    # without a ghost a1 re-enters S, older than d1, and goes with b1 (as under lru)
    _, log, _ = run(tmp_path, events, cap=4, ghost_ratio=0)
    assert log.evictions == ["g:a1", "g:b3", "g:b2", "g:b1", "g:a1"]
    _, lru_log, _ = run(tmp_path, events, cap=4, policy="lru")
    assert lru_log.evictions == ["g:a1", "g:b3", "g:b2", "g:b1", "g:a1"]


def test_pinned_block_skipped_and_left_in_place(tmp_path):
    # 5 usable, S target 1. P pins c0 (the oldest in S) until t=10.
    events = [
        {"t": 0, "id": "P", "blocks": ["c0"], "done_t": 10},
        {"t": 1, "id": "Y", "blocks": ["a1"], "done_t": 1.1},
        {"t": 2, "id": "Z", "blocks": ["b1"], "done_t": 2.1},
        {"t": 3, "id": "Q", "blocks": ["d1", "d2"], "done_t": 3.1},
        {"t": 4, "id": "W", "blocks": ["e1"], "done_t": 4.1},
        {"t": 11, "id": "R", "blocks": ["f1"], "done_t": 11.1},
    ]
    _, log, _ = run(tmp_path, events, cap=6, small_ratio=0.2)
    assert log.block_ids == {"P": [1], "Y": [2], "Z": [3], "Q": [4, 5], "W": [2], "R": [1]}
    # W: c0 is pinned, skipped: a1 goes (position 0 among S's candidates).
    # R: c0 is unpinned again at its original place, the head of S: it goes first.
    assert log.evictions == ["g:a1", "g:c0"]
    assert [(d.queue, d.position) for d in log.decisions] == [("small", 0), ("small", 0)]
    _, lru_log, _ = run(tmp_path, events, cap=6, policy="lru")
    assert lru_log.evictions == ["g:a1", "g:b1"]       # lru: c0 freed last, kept
    # a hit while pinned still counts: at R's walk c0 (freq 1) moves to M, b1 goes
    events.insert(4, {"t": 3.5, "id": "H", "blocks": ["c0"], "tail": 1, "done_t": 3.6})
    _, log, engine = run(tmp_path, events, cap=6, small_ratio=0.2)
    assert log.evictions == ["g:a1", "g:b1"]
    assert log.decisions[1].rank["moved_to_main"] == 1 and log.decisions[1].position == 1
    assert engine.policy.queue[1] == 1


def test_move_threshold_two_needs_two_hits(tmp_path):
    result, log, _ = run(tmp_path, BASE, cap=7, small_ratio=0.5, move_threshold=2)
    assert log.evictions == ["g:a1"]            # one hit is not enough any more
    assert log.decisions[0].rank["freq"] == 1


# S = a1 (hit twice), b1 (hit once), c1; D and E then need one and two evictions.
TWO_HITS = BASE[:3] + [
    {"t": 3, "id": "H1", "blocks": ["a1"], "tail": 1, "done_t": 3.1},
    {"t": 3.2, "id": "H2", "blocks": ["a1"], "tail": 1, "done_t": 3.3},
    {"t": 3.4, "id": "H3", "blocks": ["b1"], "tail": 1, "done_t": 3.5},
    {"t": 4, "id": "D", "blocks": ["d1", "d2", "d3", "d4"], "done_t": 4.1},
    {"t": 5, "id": "E", "blocks": ["e1", "e2"], "done_t": 5.1},
]


@pytest.mark.parametrize("threshold, evictions, moved, main", [
    # the reference's default: only a1 (two hits) moves to M; b1 (one hit) leaves S
    # first, then S's FIFO order takes c1 and D's last block d4 (cached first)
    (2, ["g:b1", "g:c1", "g:d4"], 1, [1]),
    # psgate's default: a1 and b1 both move to M, so S gives up c1, d4 and d3
    (1, ["g:c1", "g:d4", "g:d3"], 2, [1, 2]),
])
def test_move_threshold_exact_eviction_order(tmp_path, threshold, evictions, moved, main):
    _, log, engine = run(tmp_path, TWO_HITS, cap=7, small_ratio=0.5,
                         move_threshold=threshold)
    assert log.evictions == evictions
    assert all(d.queue == "small" for d in log.decisions)
    assert log.decisions[0].rank["moved_to_main"] == moved
    assert [d.rank["moved_to_main"] for d in log.decisions[1:]] == [0, 0]
    pol = engine.policy
    assert sorted(b for b in range(len(pol.queue)) if pol.queue[b] == 1) == main
    assert pol.freq[1] == 2                     # a1's two hits go with it to M


def test_select_does_not_mutate_and_is_memoized(tmp_path):
    _, _, engine = run(tmp_path, BASE[:4], cap=7, small_ratio=0.5)
    pol = engine.policy
    before = (pol.candidates(), list(pol.freq), list(pol.queue), list(pol.size))
    d1 = pol.select_victim(None, 0)
    d2 = pol.select_victim(None, 0)
    assert (d1.victim, d1.rank) == (d2.victim, d2.rank)
    assert (pol.candidates(), list(pol.freq), list(pol.queue), list(pol.size)) == before


def test_pin_unpin_cycles_keep_the_heaps_bounded():
    from psgate.policy.base import PoolInfo
    pol = make_policy("s3fifo")
    pol.bind(PoolInfo(num_blocks=8, num_usable=7, block_size=4))
    for b in (1, 2, 3):
        pol.on_cached(b, None, 0, -1, 100 + b)
    pol.end_admit(None, 0)
    pol.on_free([1, 2, 3], 0)
    for _ in range(1000):           # a hot block hit and released over and over
        pol.on_touch(2)
        pol.on_hit(2, None, 0)
        pol.on_free([2], 0)
    assert pol.candidates() == [3, 2, 1]        # 3 was cached last: end of the batch first
    assert len(pol.heaps.heaps[0]) <= 2 * 3 + 33
    assert pol.freq[2] == 3                     # the 2-bit counter saturates


def test_parameters_are_validated():
    for params in ({"small_ratio": 0}, {"small_ratio": 1.5}, {"ghost_ratio": -1},
                   {"move_threshold": 0}, {"move_threshold": True}, {"nope": 1}):
        with pytest.raises(InputError):
            make_policy("s3fifo", params)


def test_bundled_example_gate_passes(tmp_path):
    from typer.testing import CliRunner

    from psgate.cli import app
    res = CliRunner().invoke(app, ["replay", "--baseline", "lru", "--candidate", "s3fifo",
                                   "--out", str(tmp_path / "out"), "--force", "--paranoid"])
    assert res.exit_code == 0, res.output


# -- reference model --------------------------------------------------------------


class _RefS3FIFO(EvictionPolicy):
    """The walk as plain lists holding every cached block (pinned ones skipped in
    place), run and applied inside select_victim: a test oracle, not a policy."""

    name = "test-ref-s3fifo"
    defaults = {"small_ratio": 0.1, "ghost_ratio": 0.9, "move_threshold": 1}

    def bind(self, pool):
        super().bind(pool)
        self.S, self.M, self.G = [], [], []
        self.freq, self.key, self.cand, self.batch = {}, {}, set(), []
        self.target = max(1, round(self.params["small_ratio"] * pool.num_usable))
        self.gcap = round(self.params["ghost_ratio"] * pool.num_usable)

    def on_hit(self, b, req, pos):
        self.freq[b] = min(3, self.freq[b] + 1)

    def on_touch(self, b):
        self.cand.discard(b)

    def on_cached(self, b, req, pos, parent, key=-1):
        self.key[b], self.freq[b] = key, 0
        if key in self.G:
            self.G.remove(key)
            self.batch.append((b, self.M))
        else:
            self.batch.append((b, self.S))

    def end_admit(self, req, now_ns):
        for b, q in reversed(self.batch):
            q.append(b)
        self.batch = []

    def on_free(self, blocks, now_ns):
        self.cand.update(blocks)

    def select_victim(self, req, now_ns):
        S, M, cand, freq = self.S, self.M, self.cand, self.freq
        if any(b in cand for b in S) and (len(S) >= self.target
                                          or not any(b in cand for b in M)):
            i = 0
            while i < len(S):
                b = S[i]
                if b not in cand:
                    i += 1
                elif freq[b] >= self.params["move_threshold"]:
                    M.append(S.pop(i))
                else:
                    return Decision(victim=b, num_candidates=len(cand), position=0,
                                    queue="small")
        i = 0
        while True:
            b = M[i]
            if b not in cand:
                i += 1
            elif freq[b] > 0:
                freq[b] -= 1
                M.append(M.pop(i))
            else:
                return Decision(victim=b, num_candidates=len(cand), position=0, queue="main")

    def on_evict(self, b):
        self.cand.discard(b)
        if b in self.S:
            self.S.remove(b)
            if self.gcap > 0:
                if self.key[b] in self.G:
                    self.G.remove(self.key[b])
                self.G.append(self.key[b])
                del self.G[:-self.gcap]
        else:
            self.M.remove(b)

    @property
    def num_candidates(self):
        return len(self.cand)

    def candidates(self):
        return list(self.cand)


CHAINS = [["a1", "a2", "a3", "a4"], ["b1", "b2"], ["c1", "c2", "c3"], ["d1"], ["e1", "e2"]]


def traces():
    return random_traces(CHAINS, groups="gh")


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(lines=traces(), capacity=st.integers(2, 14),
       small_ratio=st.sampled_from([0.1, 0.25, 0.5]), threshold=st.sampled_from([1, 2]),
       ghost_ratio=st.sampled_from([0.0, 0.3, 0.9]))
def test_matches_reference_model(tmp_path, lines, capacity, small_ratio, threshold,
                                 ghost_ratio):
    p = write_lines(tmp_path, lines)
    params = {"small_ratio": small_ratio, "move_threshold": threshold,
              "ghost_ratio": ghost_ratio}
    result, log, _ = replay_checked(p, capacity, policy="s3fifo", params=params)
    register(_RefS3FIFO)
    try:
        _, ref_log, _ = replay_file(p, capacity=capacity, policy="test-ref-s3fifo",
                                    params=params)
    finally:
        unregister("test-ref-s3fifo")
    assert log.victims == ref_log.victims
    assert log.evictions == ref_log.evictions
    assert [d.queue for d in log.decisions] == [d.queue for d in ref_log.decisions]
