"""``python -m psgate.bench``: what the bench's child processes run."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from psgate.bench.memory import memory_child, requests_memory_child
from psgate.bench.vllm_driver import vllm_measure


def main(argv: list[str]) -> None:
    """Child entry points: --memory-child POLICY TRACE CAPACITY, --requests-memory-child
    TRACE OUT, --vllm-child TRACE CAPACITY REPEATS; each prints one JSON line."""
    if argv[:1] == ["--memory-child"]:
        print(json.dumps(memory_child(argv[1], argv[2], int(argv[3]))))
    elif argv[:1] == ["--requests-memory-child"]:
        print(json.dumps(requests_memory_child(argv[1], argv[2])))
    elif argv[:1] == ["--vllm-child"]:
        print(json.dumps(vllm_measure(Path(argv[1]), int(argv[2]), int(argv[3]))))
    else:
        raise SystemExit("usage: psgate bench [--quick] [--json] (this module's own entry "
                         "points are for its child processes)")


if __name__ == "__main__":
    main(sys.argv[1:])
