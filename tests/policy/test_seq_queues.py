"""SeqQueues (psgate/policy/seq_queues.py) against a model written here, in both of the
module's forms: as installed (compiled where the install compiled it) and interpreted from
its source."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import both_forms
from psgate.policy import seq_queues

form = both_forms(seq_queues)
NUM_BLOCKS = 16


class Model:
    """Each queue as a dict block -> seq; its head is the least (seq, block)."""

    def __init__(self, num_queues: int) -> None:
        self.queues = [{} for _ in range(num_queues)]

    def where(self, b: int) -> int:
        return next((q for q, d in enumerate(self.queues) if b in d), -1)

    def order(self, q: int) -> list[int]:
        return [b for _, b in sorted((s, b) for b, s in self.queues[q].items())]


ops = st.lists(st.tuples(st.sampled_from(["push", "push", "push", "remove", "head", "add"]),
                         st.integers(0, 3), st.integers(0, NUM_BLOCKS - 1),
                         st.integers(0, 6)),
               max_size=150)


@settings(max_examples=150, deadline=None)
@given(ops=ops, scale=st.sampled_from([1, 2**50]))
def test_heads_items_and_counts_are_the_model_s(form, ops, scale):
    """After any sequence of pushes (a block again, at an older or newer seq), removals and
    new queues, with heads popping dead entries and compactions along the way, every
    queue's head, items, live count and membership are the model's. A block never comes
    back to a queue at a seq it had there (the module docstring's caveat): the step's
    number is the seq's low digits. Seqs up to 2**62 and more (``scale``) are ordered as
    numbers too (mru's keys are 2**62 less a sequence)."""
    sq, model = form.SeqQueues(NUM_BLOCKS, 2), Model(2)
    for step, (op, q, b, seq) in enumerate(ops):
        q %= len(model.queues)
        seq = seq * scale * 1000 + step
        if op == "add":
            assert sq.add_queue() == len(model.queues)
            model.queues.append({})
        elif op == "push":
            if b in sq:                    # a queued block leaves first, as policies do
                sq.remove(b)
                del model.queues[model.where(b)][b]
            sq.push(q, b, seq)
            model.queues[q][b] = seq
        elif op == "remove" and b in sq:
            sq.remove(b)
            del model.queues[model.where(b)][b]
        elif op == "head":
            order = model.order(q)
            assert sq.head(q) == (order[0] if order else -1)
        assert sq.where[b] == model.where(b)
        assert list(sq.live) == [len(d) for d in model.queues]
    for q in range(len(model.queues)):
        assert sq.items(q) == model.order(q)
        assert sq.head(q) == (model.order(q) or [-1])[0]


def test_answers_hold_across_compactions(form):
    """A block pushed and removed many times leaves dead entries behind, and the heap is
    cut back to its live entries several times on the way; the queue answers as before."""
    sq = form.SeqQueues(4, 1)
    sq.push(0, 0, 100)
    for seq in range(200):
        sq.push(0, 1, seq)
        sq.remove(1)
    assert sq.head(0) == 0 and sq.items(0) == [0] and list(sq.live) == [1]
    sq.push(0, 1, 0)
    assert sq.head(0) == 1 and sq.items(0) == [1, 0]


def test_gather_queues_every_block_at_its_seq(form):
    """gather: each block of the family's queue q, here in q % stride at the same seq."""
    groups = form.SeqQueues(8, 6)
    for q, b, seq in [(0, 1, 5), (3, 2, 1), (4, 3, 9), (1, 4, 2), (5, 5, 0)]:
        groups.push(q, b, seq)
    groups.remove(3)
    merged = form.SeqQueues(8, 3)
    merged.gather(groups, 3)
    assert [merged.items(s) for s in range(3)] == [[2, 1], [4], [5]]
    assert list(merged.live) == [2, 1, 1]
    assert list(merged.where) == [-1, 0, 0, -1, 1, 2, -1, -1]
    with pytest.raises(ValueError, match="not empty"):
        merged.gather(groups, 3)
    with pytest.raises(ValueError, match="same pool"):
        form.SeqQueues(9, 3).gather(groups, 3)


def test_bad_queues_and_blocks_are_refused(form):
    sq = form.SeqQueues(4, 1)
    with pytest.raises(IndexError):
        sq.push(1, 0, 0)
    with pytest.raises(IndexError):
        sq.push(0, 4, 0)
    with pytest.raises(IndexError):
        sq.head(-1)
    with pytest.raises(ValueError, match="block 2 is in no queue"):
        sq.remove(2)
    with pytest.raises(ValueError, match="at most"):
        form.SeqQueues(form.SeqQueues.MASK + 1)


@settings(max_examples=150, deadline=None)
@given(pushes=st.lists(st.tuples(st.integers(0, 11), st.integers(0, 1000)), max_size=30),
       removes=st.lists(st.integers(0, NUM_BLOCKS - 1), max_size=8),
       families=st.lists(st.integers(0, 3), min_size=1, max_size=4, unique=True))
def test_first_queue_and_first_two_families_are_the_model_s(form, pushes, removes,
                                                           families):
    """Four families of three queues (PrefixShield's groups and segments): a family's
    first non-empty queue, and of any families the two whose best blocks come first by
    (place in the family, seq), a family with none last and ties kept in the order
    given, as sorting them would give."""
    sq, model = form.SeqQueues(NUM_BLOCKS, 12), Model(12)
    for b, (q, seq) in enumerate(pushes[:NUM_BLOCKS]):
        sq.push(q, b, seq * NUM_BLOCKS + b)      # distinct seqs, as freed_seq's are
        model.queues[q][b] = seq * NUM_BLOCKS + b
    for b in removes:
        if b in sq:
            sq.remove(b)
            del model.queues[model.where(b)][b]

    def best(f):
        for place in range(3):
            order = model.order(3 * f + place)
            if order:
                return place, model.queues[3 * f + place][order[0]]
        return 3, 0

    for f in range(4):
        assert sq.first_queue(3 * f, 3) == 3 * f + best(f)[0]
    ranked = sorted(families, key=best)
    assert sq.first_two_families(families, 3) == (ranked[0], (ranked + [-1])[1])
