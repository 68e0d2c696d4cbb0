"""The real engine as judge: a light and a loaded trace on real vLLM against a replay.

    PYTHONPATH=. <vLLM python> tools/compare_real.py [--out DIR] [--capacity 48 ...]
        [--pacing lockstep --pacing wall] [--compare-engine sim] [--compare-scheduler step]
        [--cost-model examples/cost-models/cpu-tiny-qwen2-step.json
         | --fit-steps [--fit-on calibration|own]] [--json]

Two ``tenant-flood`` traces (block size 32, eight seconds: a light one that never queues
and a loaded one whose flood makes vLLM's scheduler queue, chunk and preempt) are replayed
lru (baseline) vs prefixshield (candidate) three ways at each capacity: on the real engine
(``--engine vllm``, tiny Qwen2 with dummy weights) under each ``--pacing`` (lockstep: the
modeled step clock; wall: the wall clock), and on the comparison engine (default ``sim``
with ``--scheduler step``, the same scheduler settings and step cost model). One row per
trace, capacity, policy and pacing:

    agree %          requests whose cached tokens equal the comparison replay's exactly
    victim hit       hit fraction of the victim role, real / replay
    preemptions      preemptions, real / replay
    TTFT p50 ms      the replay's (modeled), the real run's on the step clock (modeled,
                     lockstep only) and on the wall clock (observed)
    diff classes     the real run's differences from its vllm-pool prediction by class
                     (the receipt's ``observed.differences_by_class``), non-zero ones

Lockstep rows are what a step replay can be held to: the same arrivals on the same clock,
so every remaining difference is the scheduler model's or the cache's, not the device's
speed. Wall rows show what the device's own speed changes. Everything runs in-process, so
it needs the interpreter with vLLM (scripts/install-vllm.sh); on two CPU cores the default
set takes a few minutes. The receipts stay under ``--out`` for a closer look.

``--fit-steps`` prices every row with a step model fitted to the real engine's own steps:
a lockstep replay on the real engine, then ``psgate calibrate --from-receipt`` on its
receipt (the file stays under ``--out`` as ``fit-*.json``, with its provenance). By default
(``--fit-on calibration``) the fit is out-of-sample: it is made once per capacity on the
``calibration`` trace, a third tenant-flood with its own seed and rates that no row replays;
``--fit-on own`` fits each trace on its own lockstep steps (in-sample). The same model on
another trace is what ``psgate calibrate --from-receipt RECEIPT -o FILE`` then
``--cost-model FILE`` gives any replay.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")   # keep stdout for the table

from psgate import api  # noqa: E402
from psgate.engines.cost import load_step_cost_model  # noqa: E402
from psgate.engines.step_cost import SchedulerParams, StepCostModel  # noqa: E402
from psgate.trace.writer import write_trace  # noqa: E402
from psgate.workloads import generate  # noqa: E402

POLICIES = {"baseline": "lru", "candidate": "prefixshield"}
COMMON = dict(block_size=32, victim_prefix_tokens=256, victim_suffix_tokens=16)
TRACES = {
    # 50 requests over 8 s, each done long before the next: nothing queues
    "light": dict(COMMON, victim_rate=2.0, victim_out=16, flood_rate=3.0, flood_tokens=256,
                  flood_out=8, flood_start_s=2.0, flood_end_s=6.0, duration_s=8.0),
    # 57 requests over 4 s; the flood outruns the modeled engine: queueing, chunked
    # prefill and (at 48 blocks) preemptions
    "loaded": dict(COMMON, victim_rate=3.0, victim_out=32, flood_rate=10.0, flood_tokens=384,
                   flood_out=24, flood_start_s=1.0, flood_end_s=3.0, duration_s=4.0),
    # --fit-steps fits on this one by default (never a compared row): another seed, rates
    # between the two, so its steps hold prefills alone, decode batches and mixed ones
    "calibration": dict(COMMON, seed=7, victim_rate=2.5, victim_out=24, flood_rate=6.0,
                        flood_tokens=320, flood_out=16, flood_start_s=1.0, flood_end_s=4.0,
                        duration_s=6.0),
}
COMPARED = ("light", "loaded")


def _rows(path: Path) -> dict[tuple[str, str], dict]:
    with open(path, newline="") as f:
        return {(r["run"], r["id"]): r for r in csv.DictReader(f)}


def replay(trace: Path, out: Path, capacity: int, engine: str, **kw) -> tuple[dict, dict]:
    cfg = api.ReplayConfig(trace=str(trace), baseline=POLICIES["baseline"],
                           candidate=POLICIES["candidate"], capacity=capacity, engine=engine,
                           out=out, force=True, allow_unexercised=True, **kw)
    receipt = api.replay(cfg).receipt
    return receipt, _rows(out / "requests.csv")


def fitted_step_cost(trace: Path, out: Path, capacity: int, sched: SchedulerParams,
                     given: StepCostModel) -> StepCostModel:
    """The step cost model fitted (psgate calibrate --from-receipt) to the wall time of
    every step the real engine took in a lockstep replay of the trace, both policies' runs:
    this engine's own speed, kernels and scheduling overhead included, which a calibration
    through transformers does not see. The file is written as ``<out>.json``."""
    from psgate.calibrate.from_receipt import receipt_document
    from psgate.calibrate.run import write_document
    from psgate.report.receipts import read_receipt_file
    from psgate.report.verify import recorded_outputs_difference

    replay(trace, out, capacity, "vllm", pacing="lockstep", sched=sched, step_cost=given)
    doc = receipt_document(out, read_receipt=read_receipt_file,
                           outputs_difference=recorded_outputs_difference)
    path = out.with_name(out.name + ".json")
    write_document(doc, path, force=True)
    print(f"{path}: step model fitted to {doc['method']['num_steps']} steps, held-out "
          f"median relative error {doc['fit']['holdout_median_rel_error']:.1%}",
          file=sys.stderr)
    return load_step_cost_model(path)


def _agree(real: dict, ref: dict, label: str) -> float | None:
    ids = [k for k in real if k[0] == label and k in ref]
    if not ids:
        return None
    same = sum(real[k]["cached_tokens"] == ref[k]["cached_tokens"] for k in ids)
    return round(100.0 * same / len(ids), 1)


def _victim_hit(receipt: dict, label: str):
    return receipt["runs"][label]["metrics"]["roles"].get("victim", {}).get("hit_fraction")


def compare(args) -> list[dict]:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    sched = SchedulerParams(max_num_batched_tokens=args.max_num_batched_tokens,
                            max_num_seqs=args.max_num_seqs)
    given = load_step_cost_model(args.cost_model) if args.cost_model else StepCostModel()
    rows = []
    fitted: dict[int, StepCostModel] = {}
    if args.fit_steps and args.fit_on == "calibration":
        trace = out / "calibration.jsonl"
        write_trace(trace, generate("tenant-flood", TRACES["calibration"]))
        for capacity in args.capacity:
            fitted[capacity] = fitted_step_cost(trace, out / f"fit-calibration-{capacity}",
                                                capacity, sched, given)
    for name in args.trace:
        trace = out / f"{name}.jsonl"
        write_trace(trace, generate("tenant-flood", TRACES[name]))
        for capacity in args.capacity:
            tag = f"{name}-{capacity}"
            step_cost = given
            if args.fit_steps:
                step_cost = fitted.get(capacity) or fitted_step_cost(
                    trace, out / f"fit-{tag}", capacity, sched, given)
                print(f"{tag}: step model fitted to the engine's own steps "
                      f"({args.fit_on}): {step_cost.coefficients()}", file=sys.stderr)
            ref_kw = dict(step_cost=step_cost, sched=sched)
            if args.compare_engine == "sim":
                ref_kw["scheduler"] = args.compare_scheduler
            ref, ref_rows = replay(trace, out / f"{tag}-{args.compare_engine}", capacity,
                                   args.compare_engine, **ref_kw)
            for pacing in args.pacing:
                real, real_rows = replay(trace, out / f"{tag}-vllm-{pacing}", capacity,
                                         "vllm", pacing=pacing, sched=sched,
                                         step_cost=step_cost,
                                         time_compression=args.time_compression)
                for label, policy in POLICIES.items():
                    run, ref_run = real["runs"][label], ref["runs"][label]
                    obs = run["observed"]
                    lockstep = pacing == "lockstep"
                    rows.append({
                        "trace": name, "capacity": capacity, "policy": policy,
                        "pacing": pacing, "requests": obs["num_requests"],
                        "agree_pct": _agree(real_rows, ref_rows, label),
                        "victim_hit_real": _victim_hit(real, label),
                        "victim_hit_replay": _victim_hit(ref, label),
                        "preemptions_real": run["counts"].get("preemptions", 0),
                        "preemptions_replay": ref_run["counts"].get("preemptions", 0),
                        "ttft_p50_replay_ms": ref_run["metrics"]["totals"]["ttft_p50_ms"],
                        "ttft_p50_real_modeled_ms": (run["metrics"]["totals"]["ttft_p50_ms"]
                                                     if lockstep else None),
                        "ttft_p50_real_observed_ms": (obs["wall_ttft_ms"]["p50"] if lockstep
                                                      else run["metrics"]["totals"]
                                                      ["ttft_p50_ms"]),
                        "differences_by_class": {c: n for c, n in
                                                 obs["differences_by_class"].items() if n},
                    })
    return rows


def _f(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def table(rows: list[dict], compare_with: str) -> str:
    head = ("trace", "cap", "policy", "pacing", "n", "agree%", "victim hit real/replay",
            "preempt real/replay", "TTFT p50 ms replay/real-modeled/real-observed",
            "diff classes (vs vllm-pool)")
    lines = [[r["trace"], str(r["capacity"]), r["policy"], r["pacing"], str(r["requests"]),
              _f(r["agree_pct"], ".1f"),
              f"{_f(r['victim_hit_real'], '.3f')} / {_f(r['victim_hit_replay'], '.3f')}",
              f"{r['preemptions_real']} / {r['preemptions_replay']}",
              f"{_f(r['ttft_p50_replay_ms'], '.1f')} / {_f(r['ttft_p50_real_modeled_ms'], '.1f')}"
              f" / {_f(r['ttft_p50_real_observed_ms'], '.1f')}",
              " ".join(f"{c}={n}" for c, n in r["differences_by_class"].items()) or "-"]
             for r in rows]
    widths = [max(len(x) for x in col) for col in zip(head, *lines)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join([f"real vLLM vs {compare_with}", fmt.format(*head),
                      *(fmt.format(*ln) for ln in lines)])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="compare-real-out", help="traces and receipts go here")
    p.add_argument("--trace", action="append", choices=sorted(TRACES),
                   help="which traces (repeatable; default light and loaded)")
    p.add_argument("--capacity", type=int, action="append",
                   help="configured KV blocks (repeatable; default 48)")
    p.add_argument("--pacing", action="append", choices=("lockstep", "wall"),
                   help="real-engine pacings (repeatable; default both)")
    p.add_argument("--compare-engine", default="sim", help="the replay engine compared with")
    p.add_argument("--compare-scheduler", default="step", choices=("service", "step"),
                   help="--compare-engine sim: its scheduler")
    p.add_argument("--max-num-batched-tokens", type=int,
                   default=SchedulerParams().max_num_batched_tokens)
    p.add_argument("--max-num-seqs", type=int, default=SchedulerParams().max_num_seqs)
    p.add_argument("--time-compression", type=float, default=1.0,
                   help="wall pacing: trace seconds per wall second")
    p.add_argument("--cost-model", help="a calibrated cost-model file whose step fit prices "
                   "the steps (wall rows need one of this machine: "
                   "examples/cost-models/cpu-tiny-qwen2-step.json)")
    p.add_argument("--fit-steps", action="store_true",
                   help="first replay the calibration trace (--fit-on own: each trace) in "
                   "lockstep and fit the step cost model to the wall time of the engine's own "
                   "steps (psgate calibrate --from-receipt); every row then uses that model")
    p.add_argument("--fit-on", choices=("calibration", "own"), default="calibration",
                   help="--fit-steps: fit once on the calibration trace (out-of-sample, the "
                   "default) or each trace on its own lockstep steps (in-sample)")
    p.add_argument("--json", action="store_true", help="the rows as JSON on stdout")
    args = p.parse_args(argv)
    args.trace = args.trace or list(COMPARED)
    args.capacity = args.capacity or [48]
    args.pacing = args.pacing or ["lockstep", "wall"]
    # vLLM logs to stdout; stdout is kept for the table (or JSON) alone.
    sys.stdout.flush()
    real_stdout = os.dup(1)
    os.dup2(2, 1)
    try:
        rows = compare(args)
    finally:
        sys.stdout.flush()
        os.dup2(real_stdout, 1)
        os.close(real_stdout)
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        what = args.compare_engine + (f" --scheduler {args.compare_scheduler}"
                                      if args.compare_engine == "sim" else "")
        print(table(rows, what))
    return 0


if __name__ == "__main__":
    sys.exit(main())
