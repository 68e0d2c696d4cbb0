"""Where a batch of independent jobs runs: this machine's processes, or a Ray cluster.

A sweep's cells and a capacity curve's per-capacity replays are the same shape: a
module-level function of plain data, returning plain data, each job independent of the
others. Both commands hand them here, so ``--executor ray`` means the same thing for both.
Jobs may finish in any order; each result is handed back with its job's index, so the
caller's output never depends on which finished first.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from psgate.errors import EngineUnavailable, InputError

EXECUTORS = ("local", "ray")
RAY_HINT = "pip install 'psgate[ray]' (or pip install ray)"


def check_executor(executor: str, workers: int) -> None:
    """Bad values are bad input, named by their option, before any work."""
    if executor not in EXECUTORS:
        raise InputError(f"expected local or ray, found '{executor}'", path="--executor")
    if type(workers) is not int or workers < 1:
        raise InputError(f"expected a positive integer, found {workers}", path="--workers")


def run_ray(fn: Callable[..., Any], jobs: Sequence[tuple], workers: int,
            address: str | None, done: Callable[[int, Any], None]) -> None:
    """``fn(*job)`` for every job as Ray tasks: on the cluster at ``address``, else on a
    local Ray started here with ``workers`` CPUs (and shut down after); ``done(i, result)``
    as each finishes. A Ray already initialised by the caller is used as it is."""
    try:
        import ray
    except ImportError:
        raise EngineUnavailable(f"--executor ray needs Ray, which is not installed; "
                                f"{RAY_HINT}") from None
    started_here = not ray.is_initialized()
    if started_here:
        import logging
        ray.init(address=address, include_dashboard=False, log_to_driver=False,
                 logging_level=logging.WARNING, num_cpus=None if address else workers)
    try:
        remote = ray.remote(fn)
        pending = {remote.remote(*job): i for i, job in enumerate(jobs)}
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            for ref in ready:
                done(pending.pop(ref), ray.get(ref))
    finally:
        if started_here:
            ray.shutdown()
