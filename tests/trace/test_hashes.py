"""The per-block loops of reading a trace (psgate/trace/hashes.py) against what they must
compute: the trace schema's block-hash pattern, a dict that interns hashes in first-seen
order with one parent each, and plain dict lookups. Run compiled where the install
compiled the module; tests/test_no_compiler.py replays with it interpreted."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from psgate.resources import load_schema
from psgate.trace.hashes import ROOT, HashTable, block_ids, first_bad_hash

_hash_like = st.one_of(st.sampled_from(["a", "0f", "ff00", "e3", "0" * 128, "0" * 129, "",
                                         "A0", "g1", "0x1", " 1", "1\n", "\u0661", "a\u0300"]),
                       st.text(alphabet="0123456789abcdefG", min_size=0, max_size=5),
                       st.integers(0, 9), st.none())


def _schema_pattern() -> re.Pattern:
    schema = load_schema("trace")
    pattern = schema["$defs"]["request"]["properties"]["blocks"]["items"]["pattern"]
    return re.compile(pattern)


@settings(max_examples=300, deadline=None)
@given(blocks=st.lists(_hash_like, max_size=8))
def test_the_hash_check_is_the_schema_pattern(blocks):
    """first_bad_hash names the first element the schema's pattern refuses."""
    pattern = _schema_pattern()
    want = next((i for i, h in enumerate(blocks)
                 if type(h) is not str or pattern.fullmatch(h) is None),
                -1)
    assert first_bad_hash(blocks) == want


def test_the_hash_check_bounds():
    assert first_bad_hash([]) == -1
    assert first_bad_hash(["0" * 128, "f"]) == -1
    assert first_bad_hash(["a", "0" * 129]) == 1
    assert first_bad_hash(["a", ""]) == 1
    assert first_bad_hash(["ab", "aB"]) == 1
    assert first_bad_hash([b"ab"]) == 0


class _Model:
    """Hashes interned in first-seen order, each with the parent it was first seen with."""

    def __init__(self):
        self.ids: dict[str, int] = {}
        self.parents: list[int] = []

    def intern(self, chain, parent=ROOT):
        out = []
        for h in chain:
            if h not in self.ids:
                self.ids[h] = len(self.parents)
                self.parents.append(parent)
            elif self.parents[self.ids[h]] != parent:
                return out, ("mismatch", h)
            out.append(self.ids[h])
            parent = self.ids[h]
        return out, None


@settings(max_examples=300, deadline=None)
@given(chains=st.lists(st.lists(st.sampled_from(["a", "b", "c", "d", "e"]), max_size=5),
                       max_size=8))
def test_hash_interning(chains):
    """The ids are dense in first-seen order; a hash met under another parent than its
    first raises through ``where`` naming both parents, with the hashes before it kept."""
    table, model = HashTable(), _Model()

    def where(msg, field):
        return ValueError(msg, field)

    for chain in chains:
        want, problem = model.intern(chain)
        if problem is None:
            assert table.intern_chain(chain, where) == want
        else:
            with pytest.raises(ValueError) as info:
                table.intern_chain(chain, where)
            msg, field = info.value.args
            assert field == "blocks"
            assert msg.startswith(f"block hash {problem[1]} was seen earlier with parent ")
        assert table.ids == model.ids and table.names == list(model.ids)
        assert table.parent.tolist() == model.parents


def test_a_parent_mismatch_names_both_parents():
    table = HashTable()
    table.intern_chain(["aa", "bb"], None)
    with pytest.raises(ValueError) as info:
        table.intern_chain(["cc", "bb"], lambda m, f: ValueError(m, f), field="answer")
    assert info.value.args == ("block hash bb was seen earlier with parent aa; here its "
                               "parent is cc", "answer")
    assert table.names == ["aa", "bb", "cc"] and table.parent.tolist() == [ROOT, 0, ROOT]
    with pytest.raises(ValueError, match="parent none \\(a first block\\); here its parent "
                       "is aa"):
        table.intern_chain(["aa", "aa"], lambda m, f: ValueError(m, f))


@settings(max_examples=300, deadline=None)
@given(seen=st.lists(st.sampled_from(["a", "b", "c", "d", "e", "f"]), max_size=8),
       lists=st.lists(st.lists(st.sampled_from(["a", "b", "c", "d", "e", "f"]), max_size=5),
                      max_size=6))
def test_block_ids_are_the_dict_lookups(seen, lists):
    """block_ids (a trace read again) against [ids[h] for h in hashes]: the same ids from
    a table that interned the same hashes in the same order, in another order, or with
    others before them, and the same KeyError for a hash the table lacks."""
    in_order = list(dict.fromkeys(h for hs in lists for h in hs))
    for first in (in_order, seen + in_order, list(reversed(in_order)), seen):
        table = HashTable()
        for h in first:
            if h not in table.ids:
                table.intern_chain([h], None)
        cursor = 0
        for hashes in lists:
            want = [table.ids.get(h) for h in hashes]
            if None in want:
                with pytest.raises(KeyError):
                    block_ids(table.ids, table.names, hashes, cursor)
                break
            got, cursor = block_ids(table.ids, table.names, hashes, cursor)
            assert got == want
            assert 0 <= cursor <= len(table.names)
