"""A trace's block hashes: checked, interned to dense ids, and looked up again.

    first_bad_hash(blocks)        the first element that is no lowercase hex string of
                                  1 to 128 characters, or -1
    HashTable.intern_chain(hs)    each hash -> its id (the next one when new), checked
                                  against the parent it was first seen with
    block_ids(ids, names, hs, c)  a validated trace read again: the ids, meeting each
                                  hash for the first time in the order it was interned

These are the per-block loops of reading a trace. The module is written in Cython's
pure-Python mode and is their one source: ``pip install`` compiles it (``hashes.pxd``
gives the C types), and without a compiler it runs as written.
"""

try:
    import cython
except ImportError:
    from psgate import cython_shadow as cython

from array import array

ROOT = -1                   # the parent of a chain's first block
MAX_HASH_CHARS = 128


def first_bad_hash(blocks: list) -> cython.Py_ssize_t:
    """The index of the first element of ``blocks`` that is not a lowercase hex string
    of 1 to 128 characters (the trace schema's block hash), or -1 when all are."""
    i: cython.Py_ssize_t
    s: str
    c: cython.Py_UCS4
    for i in range(len(blocks)):
        h = blocks[i]
        if type(h) is not str:
            return i
        s = h
        if not 1 <= len(s) <= MAX_HASH_CHARS:
            return i
        for c in s:
            if not ("0" <= c <= "9" or "a" <= c <= "f"):
                return i
    return -1


def intern_run(table, hashes: list, parent: cython.longlong) -> tuple:
    """``hashes`` interned in ``table`` as a chain hanging from ``parent``: (their ids,
    -1), or (the ids before it, the index of the first hash whose parent differs from
    the one it was first seen with); the hashes before it stay interned."""
    ids: dict = table.ids
    names: list = table.names
    parents = table.parent
    out: list = []
    i: cython.Py_ssize_t
    hid: cython.longlong
    for i in range(len(hashes)):
        h = hashes[i]
        v = ids.get(h)
        if v is None:
            hid = len(names)
            ids[h] = hid
            names.append(h)
            parents.append(parent)
        else:
            hid = v
            if parents[hid] != parent:
                return out, i
        out.append(hid)
        parent = hid
    return out, -1


def block_ids(ids: dict, names: list, hashes: list, cursor: cython.Py_ssize_t) -> tuple:
    """([ids[h] for h in hashes], the cursor after them); KeyError for a hash the table
    lacks, as there. A trace read again after the pass that interned it meets each hash
    for the first time in the order of ``names``: the hash at ``cursor`` is checked
    first (names[cursor] == h means ids[h] == cursor), in memory that is read in order,
    and only a hash seen before is looked up in the dict, whose probes are cache misses
    over a large table."""
    out: list = []
    num_names: cython.Py_ssize_t = len(names)
    for h in hashes:
        if cursor < num_names and names[cursor] == h:
            out.append(cursor)
            cursor += 1
        else:
            out.append(ids[h])
    return out, cursor


@cython.annotation_typing(False)     # its methods' annotations document, compiled too
class HashTable:
    """Interns trace block hashes to dense ints and remembers each one's parent.

    A block hash names (parent, tokens), so one hash with two parents means the
    trace is corrupt; that check needs exactly this table, which is also the
    only per-block state that lives for a whole trace.
    """

    ROOT = ROOT

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}
        self.names: list[str] = []
        self.parent = array("q")

    def __len__(self) -> int:
        return len(self.names)

    def intern_chain(self, hashes: list[str], where, parent: int = ROOT,
                     field: str = "blocks") -> list[int]:
        """``hashes`` as ids, each checked against the parent it was first seen with;
        ``parent`` is the id the first one hangs from (an answer goes on from its prompt).
        A hash seen with another parent raises ``where(message, field)``."""
        out, bad = intern_run(self, hashes if type(hashes) is list else list(hashes),
                              parent)
        if bad < 0:
            return out
        parent = out[-1] if out else parent
        h = hashes[bad]
        seen = self.parent[self.ids[h]]
        seen_s = "none (a first block)" if seen == ROOT else self.names[seen][:16]
        here_s = "none (a first block)" if parent == ROOT else self.names[parent][:16]
        raise where(f"block hash {h[:16]} was seen earlier with parent {seen_s}; "
                    f"here its parent is {here_s}", field)
