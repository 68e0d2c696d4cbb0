"""Measures the compiled core's layout choice: one source in Cython's pure-Python mode
against the installed compiled forms, side by side in one run.

    python tools/core_layout/measure.py [--rounds 7]

Compiles walks.py into a temporary directory (needs Cython and a C compiler), then times,
on the same inputs: the loop interpreted (the fallback), compiled from walks.py (pure-Python
mode, typed requests), and the installed form (update_from_output's common case is now
psgate/engines/step_work.py's computed_until, compiled over untyped requests: what
psgate._core's kernel was). lru's walks are timed from their own module
(psgate/policies/lru.py, which pip install compiled): its source interpreted against the
build. Prints min-of-rounds times and the ratios.
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import subprocess
import sys
import tempfile
import time
from array import array
from pathlib import Path

HERE = Path(__file__).resolve().parent


def load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def compiled(tmp: Path):
    shutil.copy(HERE / "walks.py", tmp / "walks.py")
    subprocess.run([sys.executable, "-m", "cython", "-3", "walks.py",
                    "-X", "boundscheck=False", "-X", "wraparound=False",
                    "-X", "initializedcheck=False"], cwd=tmp, check=True)
    (tmp / "setup.py").write_text(
        "from setuptools import setup, Extension\n"
        "setup(name='w', ext_modules=[Extension('walks', ['walks.c'])])\n")
    subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=tmp,
                   check=True, capture_output=True)
    so = next(tmp.glob("walks*.so"))
    return load(so, "walks")


def best(fn, rounds):
    times = []
    for _ in range(rounds):
        t = time.process_time()
        fn()
        times.append(time.process_time() - t)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--blocks", type=int, default=200_000)
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--steps", type=int, default=2_000)
    ap.add_argument("--keys", type=int, default=64)
    args = ap.parse_args()
    from psgate import core
    _core = core.get()
    if _core is None:
        sys.exit("psgate's compiled core is not built here: pip install -e . first")
    with tempfile.TemporaryDirectory() as d:
        comp = compiled(Path(d))
        interp = load(HERE / "walks.py", "walks_interpreted")
        n = args.blocks
        blocks = list(range(n))
        rows = []

        from psgate.policies import lru as lru_built
        from psgate.policy import BlockQueues
        if lru_built.__file__.endswith(".py"):
            sys.exit("psgate.policies.lru is not compiled here: pip install -e . first")
        lru_source = load(Path(lru_built.__file__).with_name("lru.py"), "lru_interpreted")

        def lru(mod):
            q = BlockQueues(n, 1)
            freed = array("q", [0]) * n
            def run():
                mod.append_freed(q, freed, blocks, 7)
                mod.take_front(q, freed, n, None)
            return run

        rows.append(("lru free+take, %d blocks" % n,
                     best(lru(lru_source), args.rounds), best(lru(lru_built), args.rounds),
                     None))

        def steps(mod, cls):
            reqs = [cls(1_000_000, 10**9) for _ in range(args.requests)]
            num_new = [1] * len(reqs)
            def run():
                for _ in range(args.steps):
                    mod.step_computed(reqs, num_new, 0)
            return run

        # the installed loop (step_work.computed_until, compiled, requests untyped)
        from psgate.engines import step_work
        if step_work.__file__.endswith(".py"):
            sys.exit("psgate.engines.step_work is not compiled here: pip install -e . first")
        computed_until = step_work.computed_until
        core_reqs = [interp.Req(1_000_000, 10**9) for _ in range(args.requests)]
        num_new = [1] * len(core_reqs)

        def core_steps():
            for _ in range(args.steps):
                computed_until(core_reqs, num_new, 0)

        rows.append(("step_computed, %d requests x %d steps" % (args.requests, args.steps),
                     best(steps(interp, interp.Req), args.rounds),
                     best(steps(comp, comp.Req), args.rounds),
                     best(core_steps, args.rounds)))
        keys = list(range(args.keys))

        def appends(mod):
            def run():
                q = array("q")
                for _ in range(args.steps):
                    mod.queue_append(q, keys)
            return run

        def writes(mod):
            def run():
                q = array("q", [0]) * (args.steps * len(keys))
                i = 0
                for _ in range(args.steps):
                    i = mod.queue_write(q, i, keys)
            return run

        rows.append((f"queue += {args.keys} keys x {args.steps}: append",
                     best(appends(interp), args.rounds), best(appends(comp), args.rounds),
                     None))
        rows.append((f"queue += {args.keys} keys x {args.steps}: write",
                     best(writes(interp), args.rounds), best(writes(comp), args.rounds),
                     None))
    print(f"{'loop':42} {'interpreted':>12} {'pure-mode':>12} {'installed':>12} "
          f"{'interp/pure':>12} {'inst/pure':>9}")
    for name, a, b, c in rows:
        core_cols = f"{c:12.4f}" if c is not None else f"{'-':>12}"
        ratio = f"{c / b:9.2f}" if c is not None else f"{'-':>9}"
        print(f"{name:42} {a:12.4f} {b:12.4f} {core_cols} {a / b:12.1f} {ratio}")


if __name__ == "__main__":
    main()
