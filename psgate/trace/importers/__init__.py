"""Importers: public KV prefix-cache request traces -> psgate-trace v1 lines.

    lines = import_trace("mooncake", "conversation_trace.jsonl", group_by="hash-mod:4")
    write_trace(Path("mc.jsonl"), lines)

``import_trace(fmt, src, **options)`` returns the trace's lines, the header dict
first and then one ``request`` event per source request in non-decreasing ``t``
(a stable sort: ties keep source order). ``FORMATS`` names each format with its
options and their defaults (``psgate trace import`` lists them).

One module per format (``mooncake``, ``weka``, ``bailian``: each documents its source
fields, time rule and request ids) and ``common``, which they share: the option table,
source checks and the chained hashing of source ids (documented there).
"""

from __future__ import annotations

from pathlib import Path

from psgate.errors import InputError
from psgate.trace.importers import bailian, mooncake, weka
from psgate.trace.importers.common import ImportFormat, resolve_options
from psgate.trace.reader import check_lines, require_utf8_name

__all__ = ["FORMATS", "import_trace"]

_MODULES = (mooncake, weka, bailian)
FORMATS: dict[str, ImportFormat] = {m.FORMAT.name: m.FORMAT for m in _MODULES}
_IMPORTERS = {m.FORMAT.name: m.import_file for m in _MODULES}


def import_trace(fmt: str, src: str | Path, **options) -> list[dict]:
    """Import a public trace of format ``fmt`` from ``src`` as psgate-trace v1 lines.

    Options (see ``FORMATS[fmt].options``; ``-`` in names is accepted for ``_``):
    ``block_size`` (divisor of the native block size; default native), ``group_by``
    (tenant rule), ``contract`` (fixed contract, default 'standard') or
    ``contracts_cycle`` (critical/standard/best-effort by group), ``limit`` (first N
    requests in time order); mooncake/bailian ``native_block_size``; weka
    ``stagger_s``. A ``None`` value means the default. Raises InputError on bad input.
    """
    spec = FORMATS.get(fmt)
    if spec is None:
        raise InputError(f"unknown trace format '{fmt}'; known: {', '.join(FORMATS)}",
                         path="FORMAT")
    opts = resolve_options(spec, options)
    display = str(src)
    require_utf8_name(display)
    lines = _IMPORTERS[fmt](Path(src), display, opts)
    # What an importer writes must be what psgate reads: checked here, before any file.
    return check_lines(lines, f"{display} (imported)")
