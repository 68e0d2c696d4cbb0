"""vLLM-side measurements, each a ratio taken side by side in one run.

    .venv-vllm/bin/python tools/bench_vllm.py [--quick] [--json] [--plugin-only | --attribute]

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
5. Where the engine core's time goes under `vllm serve` (``--attribute``, alone): with each
   plugin mode on one server saturated by concurrent clients, py-spy samples every process
   of the server from outside (``--nonblocking``: never paused; ``--idle``: waits too) in
   several windows. The engine core's busy loop is the critical path of every step: its
   wall time while it has work (waits for the model's output included, waits for new
   requests not) is the denominator. A sample of it is psgate's when the innermost
   non-stdlib frame is psgate's code (json, csv, hashlib called from psgate count as
   psgate; vLLM called from a psgate wrapper counts as vLLM). Overhead = psgate / (loop -
   psgate): what the loop would gain without the plugin, mean over windows with a 95%
   bootstrap interval. The busy samples of psgate's code beside the loop (the capture
   writer's thread, vLLM's input thread building a request) are added on top, as if they
   ran on the loop's core: an upper bound. Where the API server,
   the engine core, the worker and the clients share a few cores this resolves what
   requests/s cannot (section 4's passes vary by 15% on 2 cores).

Needs vLLM (scripts/install-vllm.sh); section 5 also py-spy (``pip install py-spy`` into
the same environment) and permission to read the server's memory (ptrace).
"""

from __future__ import annotations

import argparse
import contextlib
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

from psgate.bench.attribution import StackClassifier, overhead_pct  # noqa: E402
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


@contextlib.contextmanager
def _mode_server(mode: str):
    """(process, port, scratch directory) of a `vllm serve` ready for requests, the plugin
    configured as PLUGIN_MODES[mode]; stopped with SIGTERM (SIGKILL if it hangs) after."""
    import signal
    import socket
    import tempfile
    with tempfile.TemporaryDirectory() as d, open(Path(d) / "server.log", "w") as log:
        env = {key: v for key, v in os.environ.items() if not key.startswith("PSGATE_")}
        env.update({key: v.format(dir=d) for key, v in PLUGIN_MODES[mode].items()})
        env.update(VLLM_ENABLE_V1_MULTIPROCESSING="1", PYTHONPATH=str(ROOT),
                   VLLM_LOGGING_LEVEL="INFO")
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        proc = _serve(env, port, log)
        try:
            _wait_ready(proc, port)
            yield proc, port, Path(d)
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=120)
            except Exception:        # noqa: BLE001 - never leave a server behind
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def plugin_overhead(n: int, rounds: int, passes: int, clients: int) -> list[dict]:
    """Saturated requests/s of `vllm serve` (multiprocessing on, as in production) with the
    plugin off, the policy alone, policy + capture and policy + capture + shadow; one server
    per mode and round, modes rotated round by round, `passes` measurements per server after
    a warm-up pass."""
    rps: dict[str, list[float]] = {m: [] for m in PLUGIN_MODES}
    names = list(PLUGIN_MODES)
    work = real_workload(n)
    for k in range(rounds):
        for m in names[k % len(names):] + names[:k % len(names)]:
            with _mode_server(m) as (_, port, _):
                _closed_loop(port, work, clients, f"r{k}.warm")
                for j in range(passes):
                    rps[m].append(_closed_loop(port, work, clients, f"r{k}.p{j}"))
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


# -- 5. where the engine core's time goes ----------------------------------------------------
ATTRIBUTE_MODES = ("policy", "policy+capture", "policy+capture+shadow")
def _mean_ci(values: list[float]) -> dict:
    ci = bootstrap_ci(values, 2000, random.Random(0))
    return {"mean": round(statistics.fmean(values), 3),
            "ci95": None if ci is None else [round(ci[0], 3), round(ci[1], 3)],
            "windows": [round(v, 3) for v in values]}


def plugin_attribution(n: int, windows: int, window_s: int, rate: int, clients: int,
                       pyspy: str) -> list[dict]:
    """Per mode: one server saturated by `clients` closed-loop clients for the whole run,
    sampled by py-spy in `windows` windows of `window_s` seconds after a warm-up pass."""
    import subprocess
    import sysconfig
    import threading
    classifier = StackClassifier(str(ROOT / "psgate"), sysconfig.get_paths()["stdlib"])
    work = real_workload(n)
    rows = []
    for m in ATTRIBUTE_MODES:
        with _mode_server(m) as (proc, port, d):
            stop = threading.Event()
            failed: list[BaseException] = []

            def load() -> None:
                k = 0
                try:
                    while not stop.is_set():
                        _closed_loop(port, work, clients, f"{m}.a{k}")
                        k += 1
                except BaseException as exc:    # noqa: BLE001 - reported below
                    failed.append(exc)

            loader = threading.Thread(target=load)
            per_window = []
            try:
                _closed_loop(port, work, clients, f"{m}.warm")
                loader.start()
                time.sleep(2.0)                  # the clients' first requests are queued
                for w in range(windows):
                    out = Path(d) / f"w{w}.txt"
                    run = subprocess.run(
                        [pyspy, "record", "--pid", str(proc.pid), "--subprocesses",
                         "--threads", "--full-filenames", "--nonblocking", "--idle",
                         "--rate", str(rate), "--duration", str(window_s), "--format", "raw",
                         "-o", str(out)],
                        capture_output=True, text=True)
                    if run.returncode or not out.exists():
                        msg = next((ln for ln in run.stderr.splitlines()
                                    if ln.startswith("Error")), run.stderr.strip()[-300:])
                        raise SystemExit(f"bench_vllm: py-spy failed on the server "
                                         f"(pid {proc.pid}): {msg}")
                    if failed:
                        raise failed[0]
                    per_window.append(classifier.classify(out.read_text()))
                    print(f"  {m} window {w}: loop {per_window[-1]['loop']} samples, psgate "
                          f"{per_window[-1]['loop_psgate']}", file=sys.stderr)
            finally:
                stop.set()
                if loader.is_alive():
                    loader.join()
        loop = [c["loop"] for c in per_window]
        if min(loop) == 0:
            raise SystemExit(f"bench_vllm: no sample of the engine core's {StackClassifier.LOOP}"
                             f" in a window of mode {m}: is the server saturated?")
        functions: dict[str, int] = {}
        for c in per_window:
            for key, v in c["functions"].items():
                functions[key] = functions.get(key, 0) + v
        rows.append({
            "mode": m,
            "loop_samples": sum(loop),
            "loop_idle_samples": sum(c["loop_idle"] for c in per_window),
            "loop_psgate_samples": sum(c["loop_psgate"] for c in per_window),
            "psgate_thread_samples": sum(c["psgate_threads"] for c in per_window),
            "psgate_elsewhere_samples": sum(c["psgate_elsewhere"] for c in per_window),
            "overhead_loop_pct": _mean_ci([overhead_pct(c["loop_psgate"], c["loop"])
                                           for c in per_window]),
            "overhead_with_threads_pct": _mean_ci(
                [overhead_pct(c["loop_psgate"] + c["psgate_threads"] + c["psgate_elsewhere"],
                              c["loop"] + c["psgate_threads"] + c["psgate_elsewhere"])
                 for c in per_window]),
            "top_psgate_functions": dict(sorted(functions.items(),
                                                key=lambda kv: (-kv[1], kv[0]))[:12]),
        })
    return rows


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
    ap.add_argument("--attribute", action="store_true",
                    help="only section 5: the engine core's time under `vllm serve`, sampled "
                         "by py-spy")
    ap.add_argument("--windows", type=int, default=6,
                    help="sampling windows per mode in section 5 (default 6)")
    ap.add_argument("--window-s", type=int, default=10,
                    help="seconds per sampling window (default 10)")
    ap.add_argument("--rate", type=int, default=250, help="py-spy samples per second "
                                                          "(default 250)")
    ap.add_argument("--py-spy", dest="pyspy", help="the py-spy executable (default: beside "
                                                   "this Python, else on PATH)")
    args = ap.parse_args()
    n = args.requests or (32 if args.quick else 96)
    rounds = args.rounds or (1 if args.quick else 3)
    import vllm
    if args.attribute:
        attribute_main(args, n, vllm.__version__)
        return
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


def attribute_main(args, n: int, version: str) -> None:
    import shutil
    pyspy = args.pyspy or shutil.which("py-spy", path=str(Path(sys.executable).parent)) \
        or shutil.which("py-spy")
    if not pyspy:
        raise SystemExit("bench_vllm: --attribute needs py-spy: "
                         f"{sys.executable} -m pip install py-spy")
    rows = plugin_attribution(n, args.windows, args.window_s, args.rate, args.clients, pyspy)
    out = {"vllm": version, "attribution": rows,
           "attribution_setup": {"requests_per_pass": n, "clients": args.clients,
                                 "windows": args.windows, "window_s": args.window_s,
                                 "rate": args.rate}}
    if args.json:
        print(json.dumps(out, indent=1))
        return
    setup = out["attribution_setup"]
    print(f"vLLM {version}: engine core under `vllm serve`, {setup['clients']} concurrent "
          f"clients, {setup['windows']} windows x {setup['window_s']} s at {setup['rate']} "
          f"samples/s per mode; overhead = psgate / (busy loop - psgate), mean over windows "
          f"[95% CI]")
    for r in rows:
        loop, thr = r["overhead_loop_pct"], r["overhead_with_threads_pct"]
        print(f"  {r['mode']:<22} loop {r['loop_samples']:>6} samples, psgate "
              f"{r['loop_psgate_samples']:>5}: {loop['mean']}% {loop['ci95']};  with psgate "
              f"beside the loop ({r['psgate_thread_samples']} + "
              f"{r['psgate_elsewhere_samples']}): {thr['mean']}% {thr['ci95']}")
        for key, v in list(r["top_psgate_functions"].items())[:4]:
            print(f"      {v:>5}  {key}")


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
