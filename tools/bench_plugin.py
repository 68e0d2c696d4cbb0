"""The vLLM plugin's per-request CPU cost, in process and without a model.

    <vLLM python> tools/bench_plugin.py [--requests 3000] [--rounds 5] [--profile MODE]

vLLM's own Scheduler is built with no model (as ``--engine vllm-sched`` builds it) once
per mode and round, with the plugin installed the way ``vllm serve`` installs it (its
``register()`` patches, then the environment each mode sets): ``off`` (no psgate
variable), ``policy`` (PSGATE_POLICY=prefixshield), ``capture`` (policy +
PSGATE_CAPTURE) and ``shadow`` (policy + capture + PSGATE_SHADOW=lru). The same
tenant-flood workload (four tenants re-reading 8-block system prompts, one request in
four a 10-block fresh flood prefix, 32-token blocks, 8 output tokens each) is kept at
``--inflight`` requests in flight: every step is one ``schedule()`` and one
``update_from_output()`` with a sampled token per request that reached its length, so
the plugin sees every hook vLLM calls when serving (add_request, allocate_slots, touch,
get_new_blocks, cache_full_blocks, free). CPU time is ``time.process_time()`` (all
threads: the capture writer's too), including closing the capture and shadow files;
modes are interleaved round by round and the median is reported, in microseconds per
request, with the overhead over ``off``. The model's forward pass is absent, so the
percentages overstate what serving loses; the microseconds are what the plugin adds.
``--profile MODE`` prints the top of a cProfile of one more run of that mode.
``--check DIR`` runs each mode once on a clock that advances 5 ms per step (no timing)
and keeps its capture, shadow and ledger files under DIR/MODE (a ledger in the policy and
capture modes; none in the shadow mode, whose ``live`` groups show the live decisions
made without one), so two versions of the plugin can be compared byte for byte
(``diff -r``).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

from psgate import vllm_plugin  # noqa: E402
from psgate.engines.step_cost import SchedulerParams  # noqa: E402

MODES = ("off", "policy", "capture", "shadow")
BS = 32
_VARS = (vllm_plugin.ENV_POLICY, vllm_plugin.ENV_CAPTURE, vllm_plugin.ENV_SHADOW,
         vllm_plugin.ENV_SHADOW_DIR)


def workload(n: int, seed: int = 1) -> list[tuple[str, list[int], str, str]]:
    """(id, prompt token ids, group, contract) per request: bench_vllm.py's real-engine
    workload (see the module docstring), with ids."""
    from bench_vllm import real_workload
    return [(f"r{i}", toks, group, contract)
            for i, (toks, group, contract) in enumerate(real_workload(n, seed))]


def _sampled(request) -> int:
    """A request's first sampled token id (the next ones follow it): distinct per request,
    so output blocks never match another request's, and cheap to make."""
    return 1000 + 17 * int(request.request_id[1:]) % 25000


def _set_mode(mode: str, tmp: Path) -> None:
    for v in _VARS:
        os.environ.pop(v, None)
    if mode != "off":
        os.environ[vllm_plugin.ENV_POLICY] = "prefixshield"
    if mode in ("capture", "shadow"):
        os.environ[vllm_plugin.ENV_CAPTURE] = str(tmp / "capture")
    if mode == "shadow":
        os.environ[vllm_plugin.ENV_SHADOW] = "lru"


_NOW = [0.0]       # the --check clock, seconds


def _step_clock() -> None:
    """Every clock the plugin reads (monotonic, ns, wall) from _NOW: outputs depend on the
    steps taken, not on how fast they ran. Before psgate.capture/shadow are imported,
    whose clocks are default arguments."""
    time.monotonic = lambda: _NOW[0]
    time.monotonic_ns = lambda: round(_NOW[0] * 1e9)
    time.time = lambda: 1.7e9 + _NOW[0]


def run_once(mode: str, work, num_blocks: int, inflight: int, out_tokens: int,
             profile: cProfile.Profile | None = None,
             keep: Path | None = None) -> tuple[float, float, int]:
    """CPU and wall seconds of one whole run of ``work`` under ``mode``, and its steps."""
    from vllm import SamplingParams
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request

    from psgate.engines.vllm_sched import build_scheduler

    with tempfile.TemporaryDirectory(prefix="psgate-bench-") as d:
        _set_mode(mode, keep or Path(d))
        if keep is not None and mode in ("policy", "capture"):   # shadow: the ledger-less path
            os.environ[vllm_plugin.ENV_LEDGER] = str(keep / "ledger.csv")
        sched = build_scheduler(num_blocks, BS, SchedulerParams(), 4096)
        hash_fn = get_hash_fn_by_name("sha256")
        init_none_hash(hash_fn)
        hasher = get_request_block_hasher(BS, hash_fn)
        reqs = [Request(rid, toks, SamplingParams(
            max_tokens=out_tokens, ignore_eos=True, extra_args={"psgate_contract": c}),
            None, arrival_time=0.0, cache_salt=g, block_hasher=hasher)
            for rid, toks, g, c in work]
        it = iter(reqs)
        steps = 0
        if profile is not None:
            profile.enable()
        t, w = time.process_time(), time.perf_counter()
        for r in (next(it) for _ in range(min(inflight, len(reqs)))):
            sched.add_request(r)
        while sched.get_num_unfinished_requests():
            so = sched.schedule()
            ids = list(so.num_scheduled_tokens)
            requests = sched.requests
            sampled = []
            for rid in ids:
                v = requests[rid]
                sampled.append([_sampled(v) + v.num_output_tokens]
                               if v.num_computed_tokens >= v.num_tokens else [])
            sched.update_from_output(so, ModelRunnerOutput(
                req_ids=ids, req_id_to_index={rid: i for i, rid in enumerate(ids)},
                sampled_token_ids=sampled))
            steps += 1
            _NOW[0] += 0.005
            for _ in range(inflight - sched.get_num_unfinished_requests()):
                r = next(it, None)
                if r is None:
                    break
                sched.add_request(r)
        vllm_plugin.close_installed(sched.kv_cache_manager)
        cpu, wall = time.process_time() - t, time.perf_counter() - w
        if profile is not None:
            profile.disable()
        from vllm.v1.core.kv_cache_manager import KVCacheManager
        KVCacheManager._psgate_installs.clear()
        os.environ.pop(vllm_plugin.ENV_LEDGER, None)
        return cpu, wall, steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--blocks", type=int, default=400, help="KV cache blocks (default 400)")
    ap.add_argument("--inflight", type=int, default=16)
    ap.add_argument("--out", type=int, default=8, help="output tokens per request")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--profile", choices=MODES, help="cProfile one more run of this mode")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--check", type=Path, help="keep each mode's files under DIR/MODE")
    args = ap.parse_args()
    modes = args.modes.split(",")
    if args.check:
        _step_clock()
        # The model's path is part of each request's scope (and so of its redacted hashes):
        # one fixed path, whichever checkout runs this.
        import shutil

        from psgate.engines import vllm_real
        model = Path(tempfile.gettempdir()) / "psgate-bench-model"
        shutil.copytree(vllm_real.default_model_config(), model, dirs_exist_ok=True)
        vllm_real.default_model_config = lambda: model
    # The plugin's patches, as vLLM's register() call makes them with every switch on.
    os.environ.setdefault("PSGATE_HASH_KEY", "00112233445566778899aabbccddeeff")
    os.environ[vllm_plugin.ENV_FLUSH] = "1"
    _set_mode("shadow", Path(tempfile.gettempdir()))
    vllm_plugin.register()
    import logging
    logging.getLogger("vllm.psgate").setLevel(logging.WARNING)
    work = workload(args.requests)
    if args.check:
        for m in modes:
            (args.check / m).mkdir(parents=True, exist_ok=True)
            _, _, steps = run_once(m, work, args.blocks, args.inflight, args.out,
                                   keep=args.check / m)
            print(f"{m}: {steps} steps -> {args.check / m}")
        return
    run_once("off", work[:200], args.blocks, args.inflight, args.out)       # warm-up
    cpu: dict[str, list[float]] = {m: [] for m in modes}
    wall: dict[str, list[float]] = {m: [] for m in modes}
    steps = 0
    for k in range(args.rounds):
        for m in modes[k % len(modes):] + modes[:k % len(modes)]:
            c, w, steps = run_once(m, work, args.blocks, args.inflight, args.out)
            cpu[m].append(c)
            wall[m].append(w)
    n = args.requests
    print(f"{n} requests, {args.blocks} blocks of {BS} tokens, {args.inflight} in flight, "
          f"{args.out} output tokens, {steps} steps; median of {args.rounds} rounds")
    base = statistics.median(cpu[modes[0]]) if modes[0] == "off" else None
    for m in modes:
        med = statistics.median(cpu[m])
        extra = "" if base is None or m == "off" else (
            f"  +{(med - base) / n * 1e6:7.1f} us/request ({100 * (med / base - 1):+.1f}%)")
        print(f"  {m:8s} {med / n * 1e6:8.1f} us/request "
              f"(min {min(cpu[m]) / n * 1e6:.1f}; wall {statistics.median(wall[m]) / n * 1e6:.1f})"
              f"{extra}")
    if args.profile:
        prof = cProfile.Profile()
        run_once(args.profile, work, args.blocks, args.inflight, args.out, profile=prof)
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(args.top)
        print(s.getvalue())


if __name__ == "__main__":
    main()
