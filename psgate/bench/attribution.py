"""Which code a sampled stack belongs to, for the plugin's cost under `vllm serve`.

py-spy samples a running server from outside; its raw format is one line per distinct
stack, ``process PID:"CMD";thread (TID): NAME;func (FILE:LINE);...;leaf (FILE:LINE) COUNT``,
root first. At saturation the engine core's busy loop is the server's bottleneck, so the
share of its samples spent in psgate's code is the throughput the plugin costs, and a
sampler outside the process measures it without the GIL's say in when a sample lands.
"""

from __future__ import annotations

import re

_FRAME = re.compile(r"^(?P<func>.*) \((?P<file>.*):(?P<line>\d+)\)$")


class StackClassifier:
    """Sorts py-spy's raw stacks (``process ...;thread (TID): NAME;frame;...;leaf COUNT``,
    root first, sampled with ``--idle`` so that waits are seen) into the engine core's busy
    loop, psgate's share of it, psgate's own threads and psgate frames anywhere else.

    A frame belongs to psgate when its file is under ``psgate_dir``, to the standard
    library when it is under ``stdlib_dir`` and outside site-packages (or frozen), else to
    whatever else runs (vLLM, torch, uvloop, ...). A sample is charged to the innermost
    frame that is not the standard library's.

    The loop's time is its wall time while it has work: a wait for the model's output
    (the worker's forward pass, or the GPU) is part of a step, a wait for new requests in
    ``_process_input_queue`` is not (the engine is then idle, not saturated). Waits
    outside the loop (a psgate thread's poll interval) are not work either."""

    LOOP = "run_busy_loop"
    INPUT_WAIT = "_process_input_queue"
    WAITS = frozenset({"wait", "get", "select", "poll", "acquire", "join", "sleep"})

    def __init__(self, psgate_dir: str, stdlib_dir: str) -> None:
        self.psgate_dir = psgate_dir.rstrip("/") + "/"
        self.stdlib_dir = stdlib_dir.rstrip("/") + "/"

    def owner(self, path: str) -> str:
        if path.startswith(self.psgate_dir):
            return "psgate"
        if path.startswith("<frozen") or (path.startswith(self.stdlib_dir)
                                          and "-packages/" not in path):
            return "stdlib"
        return "other"

    def _innermost(self, frames) -> str:
        """``path:function`` of the innermost psgate frame, the path from psgate's root."""
        func, path, _ = next(f for f in reversed(frames) if f[2] == "psgate")
        return f"{path[len(self.psgate_dir):]}:{func}"

    def classify(self, raw: str) -> dict:
        counts = {"loop": 0, "loop_idle": 0, "loop_psgate": 0, "psgate_threads": 0,
                  "psgate_elsewhere": 0, "samples": 0}
        functions: dict[str, int] = {}
        for line in raw.splitlines():
            stack, _, n = line.rpartition(" ")
            if not stack or not n.isdigit():
                continue
            n = int(n)
            counts["samples"] += n
            frames = []
            for part in stack.split(";"):
                m = _FRAME.match(part)
                if m and not part.startswith(("process ", "thread (")):
                    frames.append((m["func"], m["file"], self.owner(m["file"])))
            if not frames:
                continue
            owners = [o for _, _, o in frames if o != "stdlib"]
            leaf = owners[-1] if owners else "stdlib"
            func, _, owner = frames[-1]
            waiting = owner == "stdlib" and func.rpartition(".")[2] in self.WAITS
            if any(f.endswith(self.LOOP) for f, _, _ in frames):
                if waiting and any(f.endswith(self.INPUT_WAIT) for f, _, _ in frames):
                    counts["loop_idle"] += n
                    continue
                counts["loop"] += n
                if leaf == "psgate":
                    counts["loop_psgate"] += n
                    key = self._innermost(frames)
                    functions[key] = functions.get(key, 0) + n
            elif not waiting and "psgate" in owners:
                # a thread psgate started (the capture writer), or psgate's code on another
                # thread or process (vLLM's input thread building a Request): work beside
                # the loop, charged by where psgate's outermost frame is
                key = "psgate_threads" if owners[0] == "psgate" else "psgate_elsewhere"
                counts[key] += n
                if leaf == "psgate":
                    name = f"({key[7:]}) {self._innermost(frames)}"
                    functions[name] = functions.get(name, 0) + n
        counts["functions"] = dict(sorted(functions.items(), key=lambda kv: (-kv[1], kv[0])))
        return counts


def overhead_pct(psgate: int, loop: int) -> float | None:
    """Throughput lost to ``psgate`` of ``loop`` busy samples: the loop would run
    ``loop / (loop - psgate)`` times as fast without it."""
    return None if loop <= psgate else 100.0 * psgate / (loop - psgate)
