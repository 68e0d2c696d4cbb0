"""receipt.json: build, validate against the schema, write.

Everything outside ``environment`` is a pure function of the trace and the
configuration, so two replays of the same inputs give identical bytes there;
``environment`` (versions, absolute paths, wall-clock times) is what
comparisons and verification ignore.
"""

from __future__ import annotations

import jsonschema
import orjson

from psgate.resources import load_schema

RECEIPT_FORMAT = 1


def dumps(obj) -> bytes:
    return orjson.dumps(obj, option=orjson.OPT_SORT_KEYS | orjson.OPT_INDENT_2) + b"\n"


def validate_receipt(receipt: dict) -> None:
    """Raises RuntimeError naming the first schema violation: a receipt psgate
    itself built that does not match its schema is a bug, never bad input."""
    validator = jsonschema.Draft202012Validator(load_schema("receipt"))
    errors = sorted(validator.iter_errors(receipt), key=lambda e: list(e.absolute_path))
    if errors:
        e = errors[0]
        where = "/".join(str(x) for x in e.absolute_path) or "(top level)"
        raise RuntimeError(f"receipt does not match receipt.schema.json at {where}: {e.message}")


def deterministic_part(receipt: dict) -> dict:
    return {k: v for k, v in receipt.items() if k != "environment"}
