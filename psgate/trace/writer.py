"""Writing psgate-trace v1 files (header first, one event per line)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import orjson

from psgate.atomic import atomic_file
from psgate.trace.model import FORMAT_VERSION


def header_line(block_size: int, **fields) -> dict:
    return {"psgate_trace": FORMAT_VERSION, "block_size": block_size, **fields}


def dump_lines(lines: Iterable[dict]) -> bytes:
    return b"".join(orjson.dumps(line) + b"\n" for line in lines)


def write_trace(path: Path, lines: Iterable[dict]) -> None:
    """Stream lines into a temporary file beside ``path``, then rename it into place, so a
    reader (or a replay started meanwhile) never sees half a trace, and a failure keeps
    whatever ``path`` held before. A directory or a missing parent is bad input."""
    with atomic_file(path) as fh:
        for line in lines:
            fh.write(orjson.dumps(line) + b"\n")
