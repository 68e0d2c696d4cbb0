"""Coverage-guided fuzzing of the trace reader and the gate-file parser with atheris.

    python tools/fuzz_atheris.py trace -runs=200000          # or -max_total_time=600
    python tools/fuzz_atheris.py gate -runs=200000

The oracle is psgate's contract for bad input: either the input is accepted, or an
InputError whose message is one line starting with the file's path. Any other
exception is a finding: atheris stops, prints it and writes the crashing input to
crash-*. Extra arguments go to libFuzzer (-runs, -max_total_time, -seed, a corpus dir).
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import atheris

with atheris.instrument_imports(include=["psgate"]):
    from psgate.errors import InputError
    from psgate.receipt.gate import load_gate_file
    from psgate.trace import validate_trace

ROOT = Path(__file__).resolve().parents[1]
SEED_TRACE = (ROOT / "tests" / "data" / "fuzz_seed.jsonl").read_bytes()   # the tests' seed too
SEED_GATE = (b'[[check]]\nmetric = "hit_fraction"\nop = ">="\nref = "baseline"\n'
             b'select = "role:victim"\ndelta = -0.01\n')


def make_target(kind: str, scratch: Path):
    path = scratch / ("t.jsonl" if kind == "trace" else "g.toml")
    check = validate_trace if kind == "trace" else load_gate_file

    def target(data: bytes) -> None:
        path.write_bytes(data)
        try:
            check(str(path))
        except InputError as exc:
            msg = str(exc)
            if not msg.startswith(str(path)) or "\n" in msg.strip():
                raise AssertionError(f"bad error message: {msg!r}") from None
    return target


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in ("trace", "gate"):
        sys.exit("usage: fuzz_atheris.py trace|gate [libFuzzer options] [corpus dir]")
    kind = sys.argv.pop(1)
    scratch = Path(tempfile.mkdtemp(prefix="psgate-atheris-", dir="/dev/shm"
                                    if os.path.isdir("/dev/shm") else None))
    corpus = scratch / "corpus"
    corpus.mkdir()
    (corpus / "seed").write_bytes(SEED_TRACE if kind == "trace" else SEED_GATE)
    if kind == "trace":
        example = (ROOT / "examples" / "example.jsonl").read_bytes().splitlines(keepends=True)
        (corpus / "example-head").write_bytes(b"".join(example[:40]))
    if not any(not a.startswith("-") for a in sys.argv[1:]):
        sys.argv.append(str(corpus))
    atheris.Setup(sys.argv, make_target(kind, scratch))
    atheris.Fuzz()


if __name__ == "__main__":
    main()
