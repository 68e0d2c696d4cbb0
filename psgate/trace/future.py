"""Where each block's content is used next: the trace's future, for the belady reference.

One pass over a trace gives, per content key (:mod:`psgate.trace.keys`, namespaces
numbered by first appearance of (group, scope) as the engines number them), the
trace-order indices of the requests that name it. Memory is one entry per block
reference, so this exists only for the clairvoyant reference.
"""

from __future__ import annotations

from array import array

from psgate.trace.keys import KEY_SHIFT
from psgate.trace.model import RequestEvent
from psgate.trace.reader import HashTable, TraceReader, TraceSource


def future_uses(src: TraceSource, hashes: HashTable, select=None) -> dict[int, array]:
    """``select``: the events one engine sees, from the trace's (an instance of a run
    spread over several sees only the requests routed to it, numbered as it numbers them)."""
    uses: dict[int, array] = {}
    ns_ids: dict[tuple[str, str], int] = {}
    index = 0
    with TraceReader(src, hashes) as reader:
        for ev in reader.events() if select is None else select(reader.events()):
            if type(ev) is not RequestEvent:
                continue
            ns = ns_ids.setdefault((ev.group, ev.scope), len(ns_ids))
            base = ns << KEY_SHIFT
            for h in ev.blocks:
                a = uses.get(base | h)
                if a is None:
                    a = uses[base | h] = array("q")
                a.append(index)
            index += 1
    return uses
