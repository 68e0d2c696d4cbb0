"""Files shipped inside the package: schemas and the bundled example traces.

They live under ``psgate/data`` so a non-editable install finds them; the
top-level ``schemas/`` and ``examples/`` copies are what people read and a test
keeps both in step.
"""

from __future__ import annotations

import functools
from importlib import resources

import orjson

BUNDLED_PREFIX = "bundled:"
DEFAULT_BUNDLED_TRACE = "example"


def _data():
    return resources.files("psgate") / "data"


@functools.cache
def load_schema(name: str) -> dict:
    return orjson.loads((_data() / "schemas" / f"{name}.schema.json").read_bytes())


def first_schema_error(doc, name: str) -> tuple[str, str] | None:
    """The first (by location) violation of schema ``name`` as (dotted location, message),
    or None: one line for an operator, never a dump of every error."""
    import jsonschema

    validator = jsonschema.Draft202012Validator(load_schema(name))
    errors = sorted(validator.iter_errors(doc), key=lambda e: [(isinstance(x, str), x) for x in e.absolute_path])
    if not errors:
        return None
    e = errors[0]
    loc = "".join(f"[{x}]" if isinstance(x, int) else f".{x}" for x in e.absolute_path)
    return loc.lstrip(".") or "(top level)", e.message


def bundled_trace_names() -> list[str]:
    return sorted(p.name[: -len(".jsonl")] for p in (_data() / "traces").iterdir()
                  if p.name.endswith(".jsonl"))


def bundled_trace_path(name: str):
    """A traversable for ``bundled:NAME``; a real file path in every normal install."""
    return _data() / "traces" / f"{name}.jsonl"
