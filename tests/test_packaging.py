"""Files that ship inside the package match the top-level ones people read."""

from __future__ import annotations

from pathlib import Path

from psgate.resources import bundled_trace_path, load_schema
from psgate.trace.writer import dump_lines
from psgate.workloads import example

ROOT = Path(__file__).resolve().parents[1]


def test_schema_copies_match():
    top = sorted(p.name for p in (ROOT / "schemas").glob("*.json"))
    assert top == ["cost-model.schema.json", "experiment.schema.json", "gate.schema.json",
                   "receipt.schema.json",
                   "trace.schema.json"]
    for name in top:
        shipped = ROOT / "psgate" / "data" / "schemas" / name
        assert shipped.read_bytes() == (ROOT / "schemas" / name).read_bytes(), name
        assert load_schema(name.split(".")[0])["$schema"].endswith("2020-12/schema")


def test_bundled_example_is_generated_and_matches_examples_copy():
    bundled = Path(str(bundled_trace_path("example"))).read_bytes()
    assert bundled == dump_lines(example.generate())
    assert bundled == (ROOT / "examples" / "example.jsonl").read_bytes()
