"""vLLM-side measurements, each a ratio taken side by side in one run.

    .venv-vllm/bin/python tools/bench_vllm.py [--quick] [--json]

1. Replay throughput: blocks/s of ``sim`` and ``vllm-pool`` on the same trace and policy
   (no ledger), interleaved rounds, best of each.
2. Policy overhead on the real CPU engine (tiny Qwen2, dummy weights): saturated
   closed-loop requests/s (every request submitted at once) with vLLM's native queue and
   with each live-capable psgate policy installed in the same engine, interleaved rounds,
   median ratio to native.
3. Open loop at 60% of the native saturated rate (Poisson arrivals, seeded): achieved
   requests/s and mean time to first token, native vs prefixshield. Open-loop throughput
   equals the offered rate while the engine keeps up, so it is no overhead measure (the
   paper's 5.955 vs 5.956 req/s were of this kind); the closed-loop ratio is.
4. The plugin under `vllm serve` (the production loop, multiprocessing on): saturated
   requests/s from concurrent OpenAI clients with the plugin off, PSGATE_POLICY=prefixshield
   alone, policy + PSGATE_CAPTURE, and policy + capture + PSGATE_SHADOW=lru; one server per
   mode and round (the plugin patches vLLM at start-up), modes rotated round by round,
   several passes per server; medians with interquartile ranges, and the overhead paired by
   round (each mode against off in the same round) with its 95% bootstrap interval
   (``--plugin-only`` runs just this section).

Needs vLLM (scripts/install-vllm.sh).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")   # keep stdout for the results

from psgate.engines import engine_class  # noqa: E402
from psgate.policies import make_policy, policy_class, policy_names  # noqa: E402
from psgate.stats.bootstrap import bootstrap_ci  # noqa: E402
from psgate.trace.model import RequestEvent  # noqa: E402
from psgate.trace.reader import HashTable, TraceReader, TraceSource, validate_trace  # noqa: E402
from psgate.trace.writer import write_trace  # noqa: E402
from psgate.workloads import generate  # noqa: E402


# -- 1. sim vs vllm-pool ------------------------------------------------------------
def replay_throughput(trace: Path, capacity: int, policies, rounds: int) -> list[dict]:
    hashes = HashTable()
    header, summary = validate_trace(str(trace), hashes)
    with TraceReader(TraceSource(trace.name, trace), hashes) as reader:
        events = list(reader.events())
    bs = header.block_size
    num_blocks = sum(-(-(ev.prompt_tokens + ev.out) // bs) for ev in events
                     if type(ev) is RequestEvent)
    rows = []
    for name in policies:
        best = {"sim": float("inf"), "vllm-pool": float("inf")}
        for _ in range(rounds):
            for engine in best:
                eng = engine_class(engine)(header=header, hashes=hashes, capacity=capacity,
                                           policy=make_policy(name), contracts=summary_contracts(),
                                           done_ids=summary.done_ids, trace_path=trace.name,
                                           groups=summary.groups)
                t = time.perf_counter()
                result = eng.run(iter(events))
                best[engine] = min(best[engine], time.perf_counter() - t)
                assert result.aborted is None
        rows.append({"policy": name, "blocks": num_blocks, "evictions": result.evictions,
                     "sim_blocks_per_s": round(num_blocks / best["sim"]),
                     "vllm_pool_blocks_per_s": round(num_blocks / best["vllm-pool"]),
                     "sim_over_vllm_pool": round(best["vllm-pool"] / best["sim"], 2)})
    return rows


def summary_contracts():
    return ("critical", "standard", "best-effort")


# -- 2 and 3. the real engine ------------------------------------------------------------
def real_workload(n: int, seed: int = 1):
    """Four tenants re-reading their 8-block system prompts with 2-6 fresh blocks each,
    and a flooder sending 10-block fresh prefixes (one request in four)."""
    from psgate.engines.vllm_pool import tokens_for
    rng = random.Random(seed)
    out = []
    for i in range(n):
        if i % 4 == 3:
            group, contract = "flood", "best-effort"
            blocks = [f"f{i}.{j}" for j in range(10)]
        else:
            t = rng.randrange(4)
            group, contract = f"t{t}", ("critical" if t == 0 else "standard")
            blocks = [f"sys{t}.{j}" for j in range(8)] + [f"u{i}.{j}"
                                                          for j in range(rng.randint(2, 6))]
        toks = [x for b in blocks for x in tokens_for(b, 32, 4096)] + [5] * 7
        out.append((toks, group, contract))
    return out


def build_llm(capacity: int):
    from vllm import LLM
    model = ROOT / "psgate" / "data" / "models" / "tiny-qwen2"
    return LLM(model=str(model), load_format="dummy", skip_tokenizer_init=True,
               enable_prefix_caching=True, block_size=32, num_gpu_blocks_override=capacity,
               max_model_len=1024, max_num_batched_tokens=4096, enforce_eager=True,
               disable_log_stats=False, seed=0)


def closed_and_open_loop(capacity: int, n: int, rounds: int, policies) -> dict:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from psgate.engines.vllm_live import LivePolicy

    llm = build_llm(capacity)
    mgr = llm.llm_engine.engine_core.engine_core.scheduler.kv_cache_manager
    work = real_workload(n)

    def prompts():
        return [(TokensPrompt(prompt_token_ids=toks, cache_salt=g),
                 SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True,
                                extra_args={"psgate_contract": c}))
                for toks, g, c in work]

    def with_policy(name, fn):
        llm.reset_prefix_cache()
        live = None
        if name != "native":
            live = LivePolicy(mgr, make_policy(name), clock_ns=time.monotonic_ns)
        try:
            return fn(), (live.num_evictions if live else None)
        finally:
            if live is not None:
                llm.reset_prefix_cache()
                live.uninstall()

    def closed():
        ps = prompts()
        t = time.perf_counter()
        llm.generate([p for p, _ in ps], [s for _, s in ps], use_tqdm=False)
        return n / (time.perf_counter() - t)

    closed()     # warm-up
    modes = ["native"] + list(policies)
    rps: dict[str, list[float]] = {m: [] for m in modes}
    evictions: dict[str, int | None] = {}
    for k in range(rounds):
        for m in modes[k % len(modes):] + modes[:k % len(modes)]:   # rotate: no fixed first
            r, ev = with_policy(m, closed)
            rps[m].append(r)
            evictions[m] = ev
    native = statistics.median(rps["native"])
    closed_rows = [{"mode": m, "req_per_s_median": round(statistics.median(v), 2),
                    "req_per_s_all": [round(x, 2) for x in v],
                    "ratio_to_native": round(statistics.median(v) / native, 3),
                    "evictions_last_round": evictions[m]} for m, v in rps.items()]

    rate = 0.6 * native
    gaps = random.Random(7)
    arrivals, t = [], 0.0
    for _ in range(n):
        t += gaps.expovariate(rate)
        arrivals.append(t)

    def open_loop():
        eng = llm.llm_engine
        ps = prompts()
        start = time.perf_counter()
        i = 0
        ttft, finished = [], 0
        while finished < n:
            now = time.perf_counter() - start
            while i < n and arrivals[i] <= now:
                eng.add_request(f"o{i}", ps[i][0], ps[i][1])
                i += 1
            if eng.has_unfinished_requests():
                for out in eng.step():
                    if out.finished:
                        finished += 1
                        if out.metrics is not None:
                            ttft.append(out.metrics.first_token_latency * 1000)
            else:
                time.sleep(max(0.0, min(0.01, arrivals[i] - now)))
        return n / (time.perf_counter() - start), statistics.mean(ttft)

    open_rows = []
    for m in ("native", "prefixshield"):
        (r, mean_ttft), _ = with_policy(m, open_loop)
        open_rows.append({"mode": m, "offered_req_per_s": round(n / arrivals[-1], 2),
                          "achieved_req_per_s": round(r, 2), "ttft_mean_ms": round(mean_ttft, 1)})
    return {"closed_loop": closed_rows, "open_loop_60pct": open_rows,
            "requests": n, "capacity": capacity}


# -- 4. the plugin under `vllm serve` ---------------------------------------------------------
PLUGIN_MODES = {
    "off": {},
    "policy": {"PSGATE_POLICY": "prefixshield"},
    "policy+capture": {"PSGATE_POLICY": "prefixshield", "PSGATE_CAPTURE": "{dir}/cap",
                       "PSGATE_HASH_KEY": "ab" * 16},
    "policy+capture+shadow": {"PSGATE_POLICY": "prefixshield", "PSGATE_CAPTURE": "{dir}/cap",
                              "PSGATE_HASH_KEY": "ab" * 16, "PSGATE_SHADOW": "lru"},
}


def _serve(env: dict, port: int, log):
    import subprocess
    vllm = Path(sys.executable).with_name("vllm")
    model = ROOT / "psgate" / "data" / "models" / "tiny-qwen2"
    cmd = [str(vllm), "serve", str(model), "--load-format", "dummy", "--skip-tokenizer-init",
           "--block-size", "32", "--num-gpu-blocks-override", "128", "--max-model-len", "1024",
           "--enable-prefix-caching", "--enforce-eager", "--host", "127.0.0.1",
           "--port", str(port), "--seed", "0", "--disable-log-stats"]
    return subprocess.Popen(cmd, stdout=log, stderr=log, env=env, start_new_session=True)


def _wait_ready(proc, port: int, timeout: float = 600.0) -> None:
    import urllib.request
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"vllm serve exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                return
        except OSError:
            time.sleep(1)
    raise SystemExit("vllm serve did not become ready")


def _closed_loop(port: int, work, clients: int, tag: str) -> float:
    """Requests/s of `clients` threads each sending its next request as soon as the last
    one returns, until the workload is done: the server saturated by concurrent clients.
    ``tag`` goes into every cache_salt, so each pass starts with none of its own blocks
    cached whatever earlier passes left."""
    import threading

    from openai import OpenAI
    client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0,
                    timeout=600)
    model = str(ROOT / "psgate" / "data" / "models" / "tiny-qwen2")
    nxt = iter(range(len(work)))
    lock = threading.Lock()
    errors: list[BaseException] = []

    def run() -> None:
        while True:
            with lock:
                i = next(nxt, None)
            if i is None:
                return
            toks, group, contract = work[i]
            try:
                client.completions.create(
                    model=model, prompt=toks, max_tokens=8, temperature=0.0,
                    extra_body={"cache_salt": f"{group}.{tag}", "ignore_eos": True,
                                "vllm_xargs": {"psgate_group": group,
                                               "psgate_contract": contract}})
            except BaseException as exc:     # noqa: BLE001 - re-raised below
                errors.append(exc)
                return

    threads = [threading.Thread(target=run) for _ in range(clients)]
    t = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    if errors:
        raise errors[0]
    return len(work) / (time.perf_counter() - t)


def plugin_overhead(n: int, rounds: int, passes: int, clients: int) -> list[dict]:
    """Saturated requests/s of `vllm serve` (multiprocessing on, as in production) with the
    plugin off, the policy alone, policy + capture and policy + capture + shadow; one server
    per mode and round, modes rotated round by round, `passes` measurements per server after
    a warm-up pass."""
    import signal
    import socket
    import tempfile
    rps: dict[str, list[float]] = {m: [] for m in PLUGIN_MODES}
    names = list(PLUGIN_MODES)
    work = real_workload(n)
    for k in range(rounds):
        for m in names[k % len(names):] + names[:k % len(names)]:
            with tempfile.TemporaryDirectory() as d, open(Path(d) / "server.log", "w") as log:
                env = {key: v for key, v in os.environ.items() if not key.startswith("PSGATE_")}
                env.update({key: v.format(dir=d) for key, v in PLUGIN_MODES[m].items()})
                env.update(VLLM_ENABLE_V1_MULTIPROCESSING="1", PYTHONPATH=str(ROOT),
                           VLLM_LOGGING_LEVEL="INFO")
                with socket.socket() as sock:
                    sock.bind(("127.0.0.1", 0))
                    port = sock.getsockname()[1]
                proc = _serve(env, port, log)
                try:
                    _wait_ready(proc, port)
                    _closed_loop(port, work, clients, f"r{k}.warm")
                    for j in range(passes):
                        rps[m].append(_closed_loop(port, work, clients, f"r{k}.p{j}"))
                finally:
                    proc.send_signal(signal.SIGTERM)
                    try:
                        proc.wait(timeout=120)
                    except Exception:        # noqa: BLE001 - never leave a server behind
                        os.killpg(proc.pid, signal.SIGKILL)
                        proc.wait()
            print(f"  round {k} {m}: {[round(x, 2) for x in rps[m][-passes:]]}",
                  file=sys.stderr)
    base = statistics.median(rps["off"])
    rows = []
    for m, v in rps.items():
        q = statistics.quantiles(v, n=4) if len(v) >= 2 else [v[0], v[0], v[0]]
        paired = _paired_overhead(v, rps["off"], passes)
        rows.append({"mode": m, "req_per_s_median": round(statistics.median(v), 2),
                     "req_per_s_iqr": [round(q[0], 2), round(q[2], 2)],
                     "req_per_s_all": [round(x, 2) for x in v],
                     "overhead_pct": round(100 * (1 - statistics.median(v) / base), 2),
                     **paired})
    return rows


def _paired_overhead(v: list[float], off: list[float], passes: int) -> dict:
    """Overhead paired by round: per round, 1 - (this mode's median over its passes) / (off's
    median in the same round), so drift across rounds cancels; the mean over rounds with its
    95% percentile-bootstrap interval (resampling rounds, seeded 0)."""
    per_round = [100 * (1 - statistics.median(v[i:i + passes]) /
                        statistics.median(off[i:i + passes]))
                 for i in range(0, len(v), passes)]
    ci = bootstrap_ci(per_round, 2000, random.Random(0))
    return {"overhead_pct_by_round": [round(x, 2) for x in per_round],
            "overhead_pct_paired_mean": round(statistics.fmean(per_round), 2),
            "overhead_pct_paired_ci": None if ci is None else [round(ci[0], 2),
                                                               round(ci[1], 2)]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--requests", type=int, help="requests per closed-loop measurement "
                                                  "(default 96, --quick 32)")
    ap.add_argument("--rounds", type=int, help="interleaved rounds (default 3, --quick 1)")
    ap.add_argument("--passes", type=int, default=3,
                    help="measurements per server in the plugin section (default 3)")
    ap.add_argument("--clients", type=int, default=8,
                    help="concurrent clients in the plugin section (default 8)")
    ap.add_argument("--plugin-only", action="store_true",
                    help="only section 4, the plugin under `vllm serve`")
    args = ap.parse_args()
    n = args.requests or (32 if args.quick else 96)
    rounds = args.rounds or (1 if args.quick else 3)
    import vllm
    live_policies = [p for p in policy_names()
                     if not policy_class(p).needs_future and policy_class(p).work_conserving]
    out = {"vllm": vllm.__version__}
    if not args.plugin_only:
        tmp = Path(os.environ.get("TMPDIR", "/tmp")) / "psgate-bench-vllm.jsonl"
        write_trace(tmp, generate("one-touch", {"attack_requests": 200 if args.quick else 2000}))
        out["replay"] = replay_throughput(tmp, 512, ["lru", "prefixshield"],
                                          2 if args.quick else 3)
        out["real"] = closed_and_open_loop(128, n, rounds, ["lru", "prefixshield"]
                                           if args.quick else live_policies)
    out["plugin"] = plugin_overhead(n, rounds, args.passes, args.clients)
    out["plugin_setup"] = {"requests": n, "clients": args.clients, "passes": args.passes,
                           "rounds": rounds}
    if args.json:
        print(json.dumps(out, indent=1))
        return
    print(f"vLLM {out['vllm']}")
    if not args.plugin_only:
        print_engine_sections(out)
    setup = out["plugin_setup"]
    print(f"\nplugin under `vllm serve`: {setup['clients']} concurrent clients, "
          f"{setup['requests']} requests per pass, {setup['passes']} passes x "
          f"{setup['rounds']} rounds per mode (median, interquartile range, overhead vs off)")
    for r in out["plugin"]:
        print(f"  {r['mode']:<22} {r['req_per_s_median']:>7} req/s  IQR {r['req_per_s_iqr']}  "
              f"overhead {r['overhead_pct']}%, paired by round {r['overhead_pct_paired_mean']}% "
              f"[95% CI {r['overhead_pct_paired_ci']}]  (all {r['req_per_s_all']})")


def print_engine_sections(out: dict) -> None:
    print("\nreplay throughput (same trace, no ledger)")
    for r in out["replay"]:
        print(f"  {r['policy']:<14} sim {r['sim_blocks_per_s']:>9,} blocks/s   vllm-pool "
              f"{r['vllm_pool_blocks_per_s']:>9,} blocks/s   sim/vllm-pool "
              f"{r['sim_over_vllm_pool']}x   ({r['blocks']:,} blocks, "
              f"{r['evictions']:,} evictions)")
    real = out["real"]
    print(f"\nreal CPU engine, {real['requests']} requests, {real['capacity']} blocks: "
          f"closed loop (saturated)")
    for r in real["closed_loop"]:
        print(f"  {r['mode']:<20} {r['req_per_s_median']:>7} req/s  x{r['ratio_to_native']} "
              f"of native  (rounds {r['req_per_s_all']}, evictions {r['evictions_last_round']})")
    print("open loop at 60% of native saturated rate")
    for r in real["open_loop_60pct"]:
        print(f"  {r['mode']:<20} offered {r['offered_req_per_s']} req/s, achieved "
              f"{r['achieved_req_per_s']} req/s, mean TTFT {r['ttft_mean_ms']} ms")


if __name__ == "__main__":
    main()
