"""Conformance soak: whole real traces through sim and vllm-pool, every policy.

    .venv-vllm/bin/python tools/conformance_soak.py --shared ../shared/traces [--policies lru,prefixshield]

Imports the Mooncake conversation and synthetic traces and the WEKA sessions (the
tenant splits the test suite uses on windows of them), replays each whole trace with
every registered policy under both engines and compares per-request outcomes and
the eviction sequence (trace block hashes and block ids). Prints one line per
(trace, capacity, policy) and exits 1 on the first mismatch. CI runs windows of the
same traces (tests/vllm_suite/test_vllm_pool.py); this is the full-length version.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from psgate.engines import engine_class  # noqa: E402
from psgate.engines.base import NullRecorder  # noqa: E402
from psgate.policies import make_policy, policy_names  # noqa: E402
from psgate.trace.future import future_uses  # noqa: E402
from psgate.trace.importers import import_trace  # noqa: E402
from psgate.trace.reader import HashTable, TraceReader, TraceSource, validate_trace  # noqa: E402
from psgate.trace.writer import write_trace  # noqa: E402

TRACES = {  # name: (format, source under --shared, import options, capacities)
    "mooncake-conversation": ("mooncake", "mooncake/mooncake_conversation_trace.jsonl",
                              {"group_by": "hash-mod:6", "contracts_cycle": True}, (512, 2048)),
    "mooncake-synthetic": ("mooncake", "mooncake/mooncake_synthetic_trace.jsonl",
                           {"group_by": "hash-mod:4"}, (1024,)),
    "weka": ("weka", "weka", {"group_by": "file"}, (8192,)),
}


class Evictions(NullRecorder):
    def __init__(self) -> None:
        self.rows: list[tuple[str, str, int]] = []

    def eviction(self, now_ns, req, decision, block, hash_name, owner) -> None:
        self.rows.append((owner, hash_name, block))


def replay(path: Path, capacity: int, policy: str, engine: str):
    hashes = HashTable()
    header, summary = validate_trace(str(path), hashes)
    pol = make_policy(policy)
    src = TraceSource(path.name, path)
    if pol.needs_future:
        pol.set_future(future_uses(src, hashes))
    log = Evictions()
    eng = engine_class(engine)(header=header, hashes=hashes, capacity=capacity, policy=pol,
                               contracts=("critical", "standard", "best-effort"),
                               done_ids=summary.done_ids, recorder=log,
                               trace_path=path.name, groups=summary.groups)
    with TraceReader(src, hashes) as reader:
        result = eng.run(reader.events())
    outcomes = [(o.id, o.state, o.cached_tokens, o.ttft_ms, o.release_ns)
                for o in result.requests]
    return result, outcomes, log.rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shared", type=Path, required=True, help="the traces directory")
    ap.add_argument("--policies", default=",".join(policy_names()))
    ap.add_argument("--traces", default=",".join(TRACES), help="which of " + ", ".join(TRACES))
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="psgate-soak-"))
    for name in args.traces.split(","):
        fmt, src, opts, caps = TRACES[name]
        path = tmp / f"{name}.jsonl"
        write_trace(path, import_trace(fmt, args.shared / src, **opts))
        for cap in caps:
            for policy in args.policies.split(","):
                t = time.perf_counter()
                sim, a_out, a_ev = replay(path, cap, policy, "sim")
                t_sim = time.perf_counter() - t
                t = time.perf_counter()
                pool, b_out, b_ev = replay(path, cap, policy, "vllm-pool")
                t_pool = time.perf_counter() - t
                same = a_out == b_out and a_ev == b_ev and sim.counts == pool.counts
                print(f"{name} capacity {cap} {policy}: {len(a_out)} requests, "
                      f"{sim.evictions} evictions, waits {sim.counts['waits']}: "
                      f"{'identical' if same else 'MISMATCH'} (sim {t_sim:.1f} s, "
                      f"vllm-pool {t_pool:.1f} s)", flush=True)
                if not same:
                    return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
