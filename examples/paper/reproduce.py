"""Reproduce the PrefixShield paper's evaluation with psgate's sim engine.

    python examples/paper/reproduce.py                  # 10 matched runs per cell
    python examples/paper/reproduce.py --quick          # 2 runs, fewer capacities

Every cell is a matched-run experiment (baseline LRU, or PrefixShield where prefixshield-b
is compared with it, vs one candidate; seeds derived from --seed) run by psgate sweep's
cell runner, so an interrupted run resumes. Every replay runs vLLM's scheduler (``--scheduler
step``, default settings, default step cost model), and the generated workloads take their
rates from that model (``rates=step``); experiment.py names the model in one place. The
real benign rows replay corpora built here from the public samples in examples/traces/ (one
run per window or bundle of sessions).
It writes OUT/REPORT.md (psgate's means with 95% bootstrap intervals beside the paper's
numbers from paper_values.json, docs/design.md section 7), OUT/fig2.png to OUT/fig5.png, and keeps
every cell's receipts (and the imported corpora) under OUT/cells/ (not committed:
regenerate them). Policy defaults are the paper's; psgate's PrefixShield evicts leaves
only, so the paper's behaviour (leaf_only=false) is reported beside it. Needs matplotlib
(pip install 'psgate[report]').

The pieces: experiment.py (which cells, the corpora, running them), results.py (the
numbers read back from the cells), report.py (REPORT.md) and plots.py (the figures).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import plots  # noqa: E402
from experiment import build_corpora, run_cells, specs  # noqa: E402
from report import render  # noqa: E402
from results import collect  # noqa: E402

# evaluate.py's section (the pre-registered held-out evaluation) is not computed here: a
# rewritten REPORT.md keeps it as it was.
BEGIN, END = "<!-- heldout:begin -->", "<!-- heldout:end -->"


def kept_section(report: Path) -> str:
    """The marked held-out section of an existing report, markers included, or ''."""
    text = report.read_text() if report.exists() else ""
    if BEGIN not in text or END not in text:
        return ""
    return text[text.index(BEGIN):text.index(END) + len(END)] + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="2 runs, capacities up to 1024")
    ap.add_argument("--tiny", action="store_true",
                    help="shrunken workloads: checks the pipeline, not the paper's numbers")
    ap.add_argument("--runs", type=int, help="matched runs per cell (default 10, quick 2)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--out", type=Path, default=ROOT / "examples" / "paper")
    ap.add_argument("--render-only", action="store_true",
                    help="rewrite REPORT.md and the figures from the cells of the last run "
                         "(OUT/cells/plan.json), computing nothing")
    args = ap.parse_args()
    runs = args.runs or (2 if args.quick or args.tiny else 10)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    plan_file = out / "cells" / "plan.json"
    if args.render_only:
        # The cells' ids carry the replay code's digest: an edit elsewhere in psgate would
        # send a new run to new cells, so the last run's plan says which cells it wrote.
        saved = json.loads(plan_file.read_text())
        todo = [tuple(t) for t in saved["todo"]]
        results, wall, meta = saved["results"], saved["wall_s"], saved["args"]
        data = collect(out, todo, results, meta["runs"], meta["quick"], wall, meta["tiny"],
                       meta["workers"], meta["seed"])
    else:
        started = time.perf_counter()
        corpora = build_corpora(out, tiny=args.tiny)
        todo = specs(args.quick, runs, args.seed, out, tiny=args.tiny, corpora=corpora)
        results = run_cells(todo, out, args.workers)
        wall = time.perf_counter() - started
        plan_file.write_text(json.dumps({
            "todo": [list(t) for t in todo],
            "results": results, "wall_s": wall,
            "args": {"runs": runs, "quick": args.quick, "tiny": args.tiny,
                     "workers": args.workers, "seed": args.seed}}, default=str))
        data = collect(out, todo, results, runs, args.quick, wall, args.tiny, args.workers,
                       args.seed)
    kept = kept_section(out / "REPORT.md")
    (out / "REPORT.md").write_text(render(data) + ("\n" + kept if kept else ""))
    plots.draw(out, data)
    print(f"{out / 'REPORT.md'} ({wall:.0f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
