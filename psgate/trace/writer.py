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
    """Stream lines into a temporary file beside ``path``, then rename it into place."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "wb") as fh:
            for line in lines:
                fh.write(orjson.dumps(line) + b"\n")
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
