"""psgate bench: replay throughput, victim selection time and memory per block, each
measured in one run and printed as a ratio against its performance target.

    result = run(BenchConfig(quick=True))      # a JSON-ready dict
    print(render(result))

Everything runs on traces generated here (seeded, written to a temporary directory),
one process, one core (the memory measurement uses a fresh child process per policy).
Replays are timed in CPU seconds of this process (``time.process_time``), so other load
on a shared machine does not count against either side of a ratio; per-victim selection
time is wall time (``perf_counter``) around each call. Each timing is repeated ``repeats``
times, in rounds that measure every side of a ratio once (vLLM included), so both sides
sample the same stretch of a machine whose speed drifts; the table shows min and median,
ratios are computed from the mins (the least disturbed run of each side) and, beside
them, from the medians. Targets:

- ``e2e_vs_vllm``: ``psgate replay`` with ``sim``, LRU and the full ledger (validation,
  two runs, ledger and receipt writing; blocks/s counts the blocks of both runs) over
  replaying the same trace through vLLM's KVCacheManager (building each vLLM
  ``Request``, with its block hashing, then get_computed_blocks / allocate_slots /
  free; token ids are prepared beforehand and not timed): >= 5.
- ``hot_vs_vllm``: the ``sim`` hot loop alone (events parsed beforehand, no ledger)
  over vLLM's allocate/free loop alone (``Request`` objects built beforehand): >= 3.
  Both vLLM targets are skipped, saying so, when vLLM does not import (``--vllm-python``
  measures vLLM in another interpreter, e.g. a vLLM virtualenv with psgate installed).
- ``core_vs_python``: the same ``psgate replay`` as an install without a C compiler runs
  it (a child interpreter with ``PSGATE_CORE=0``) over the compiled build: >= 10 (skipped
  where the core is not built).
  ``core_vs_python_mooncake``: the same on the first requests of a Mooncake trace
  (``--mooncake``), at 16,384 blocks, lru vs prefixshield: >= 10.
- ``step_vs_service_hot``: the ``sim`` hot loop with the step scheduler (vLLM's scheduler,
  step by step) over the service model's, LRU on the reuse trace: >= 0.8.
- ``ps_lru_hot`` / ``ps_lru_e2e``: prefixshield's blocks/s over lru's on the same reuse
  trace, hot loop and end to end: >= 0.6.
- ``select_4096``: PrefixShield's victim selection and eviction time per victim, timed
  inside a full replay in which every group is in creation debt on two contracts, at
  4,096 blocks / 32 groups, over 2 us: <= 1. ``select_growth``: the same at 1,048,576
  blocks / 1,024 groups over the 4,096 value: <= 2 (full run only).
- ``mem_lru`` / ``mem_ps``: RSS growth of a fresh process from before the engine exists
  to after the cache is full (1,048,576 resident blocks; 65,536 with ``--quick``), per
  resident block, over 200 bytes: <= 1. It includes the per-request records of the
  requests that filled the cache.
- ``cold_hot`` / ``cold_e2e``: on a trace without any reuse, prefixshield's replay time
  over lru's, hot loop and end to end: <= 1.2.
- ``mem_requests``: peak RSS of ``psgate replay`` (validation, two runs, ledger,
  requests.csv, receipt) in a fresh process, on a trace of 10^6 tiny requests minus the
  same on 10^5 (50,000 and 10,000 with ``--quick``), per request of difference, over 300
  bytes: <= 1. The requests share their blocks, so what grows is per-request state alone:
  what is in flight stays small, and a replay must not keep every request's results.

Traces never make a request wait: every request carries ``done_t`` and the blocks held
at any moment fit the cache, and replays use a zero-time cost model, so every engine
does exactly the same admissions and releases (the vLLM driver needs no waiting line).

Modules: ``traces`` (the seeded traces), ``timing`` (sim and ``psgate replay`` timings,
victim selection), ``memory`` (the child-process memory measurements), ``vllm_driver``
(vLLM's side), ``suite`` (the run and its targets) and ``render`` (the table);
``python -m psgate.bench`` is the child processes' entry point.
"""

from psgate.bench.render import render
from psgate.bench.suite import BenchConfig, run

__all__ = ["BenchConfig", "render", "run"]
