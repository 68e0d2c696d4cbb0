"""explain reads only what its question needs: on a long ledger its memory does not grow
with the ledger (a decision, a slot, a request's blame, a content's history), and the
compact ledger's row-by-row reader gives the decoder's rows byte for byte."""

from __future__ import annotations

from pathlib import Path

import pytest

from psgate import api
from psgate.bench.traces import INSTANT, write_reuse_trace
from psgate.receipt.compact import open_compact, read_compact
from psgate.report.explain import explain, explain_block, explain_request

from helpers import traced_peak

CONTRACTS = ("critical", "standard", "best-effort")


@pytest.fixture(scope="module")
def long_receipt(tmp_path_factory) -> Path:
    """A cold trace at 256 blocks: every admission evicts, about 14,000 ledger rows a run."""
    d = tmp_path_factory.mktemp("explain-bounded")
    trace = d / "cold.jsonl"
    write_reuse_trace(trace, 800, 16, 256, cold=True)
    api.replay(api.ReplayConfig(trace=str(trace), baseline="lru", candidate="prefixshield",
                                capacity=256, out=d / "out", force=True, cost=INSTANT,
                                contracts=CONTRACTS, scheduler="service"))
    return d / "out"


def test_reader_gives_the_decoders_rows(long_receipt):
    p = long_receipt / "ledger.compact.csv.gz"
    want = open_compact(p)
    next(want)                                    # the header
    n = 0
    for (_, r), line in zip(read_compact(p), want):
        assert r.line() == line
        n += 1
    assert n > 20_000


def test_explain_decision_and_slot_memory_stays_bounded(long_receipt):
    """Reading every row of the run into memory took about 24 MB here (44 MB at 1,500
    requests); streaming, under 1 MB for a decision, 4 MB for a slot at either size."""
    explain(long_receipt, run="baseline", decision=2)         # imports, outside
    for kw in ({"run": "baseline", "decision": 2}, {"run": "candidate", "decision": 2},
               {"run": "baseline", "slot": 7}):
        peak = traced_peak(lambda: explain(long_receipt, **kw))
        assert peak < 6 << 20, (kw, peak)


def test_explain_request_and_block_memory_stays_bounded(long_receipt):
    """Keeping each lost content's eviction (every content of a cold trace is lost) took
    tens of MB here; the walk keeps the request's own contents' alone."""
    res = explain_request(long_receipt, "r700")
    assert res["runs"]["baseline"]["admitted"]
    assert explain_block(long_receipt, "c000002bc0000")["runs"]["baseline"]["groups"]
    peak = traced_peak(lambda: explain_request(long_receipt, "r700"))
    # the trace itself (interned blocks of every request) is most of what is left; the old
    # walk took about 5 times this at 1,500 requests (49 MB against 9 MB)
    assert peak < 10 << 20, peak
