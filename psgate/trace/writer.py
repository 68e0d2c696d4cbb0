"""Writing psgate-trace v1 files (header first, one event per line)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import orjson

from psgate.trace.model import FORMAT_VERSION


def header_line(block_size: int, **fields) -> dict:
    return {"psgate_trace": FORMAT_VERSION, "block_size": block_size, **fields}


def dump_lines(lines: Iterable[dict]) -> bytes:
    return b"".join(orjson.dumps(line) + b"\n" for line in lines)


def write_trace(path: Path, lines: Iterable[dict]) -> None:
    tmp = Path(str(path) + ".tmp")
    tmp.write_bytes(dump_lines(lines))
    tmp.replace(path)
