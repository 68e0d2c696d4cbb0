"""verify: replay a receipt's trace and configuration again and compare the bytes.

Everything but the receipt's ``environment`` section must come out identical:
``receipt.json`` (compared as canonical JSON), ``ledger.csv`` and ``requests.csv``.
The first difference is named (file and line, or JSON path), so a receipt is
checkable by anyone who has the trace.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from psgate import api
from psgate.errors import InputError
from psgate.receipt.ledger import open_text
from psgate.receipt.receipt import deterministic_part
from psgate.report.receipts import config_from_receipt, load_receipt


@dataclass
class VerifyResult:
    identical: bool
    first_difference: str | None
    compared: list[str]


def first_json_difference(a, b, path: str = "") -> str | None:
    if type(a) is not type(b):
        return f"{path or '/'}: {a!r:.80} != {b!r:.80}"
    if isinstance(a, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                return f"{path}/{k}: only in the {'receipt' if k in a else 'replay'}"
            d = first_json_difference(a[k], b[k], f"{path}/{k}")
            if d:
                return d
        return None
    if isinstance(a, list):
        for i, (x, y) in enumerate(zip(a, b)):
            d = first_json_difference(x, y, f"{path}/{i}")
            if d:
                return d
        if len(a) != len(b):
            return f"{path}: {len(a)} items != {len(b)} items"
        return None
    return None if a == b else f"{path or '/'}: {a!r:.80} != {b!r:.80}"


def first_line_difference(a: Path, b: Path) -> str | None:
    with open_text(a) as fa, open_text(b) as fb:
        for n, (x, y) in enumerate(zip(fa, fb), start=1):
            if x != y:
                return (f"{a.name}:{n}: receipt has {x.rstrip()!r:.120}, "
                        f"replay gives {y.rstrip()!r:.120}")
        rest_a, rest_b = fa.read(1), fb.read(1)
    if rest_a or rest_b:
        return f"{a.name}: {'the receipt' if rest_a else 'the replay'} has more lines"
    return None


def verify_experiment(directory: Path, receipt: dict, progress=None) -> VerifyResult:
    """Every run re-replayed and compared as a single receipt is; then each run's digest
    and the paired summary recomputed from the runs' receipts."""
    from psgate.receipt.receipt import dumps
    from psgate.stats.bootstrap import paired_summary
    import hashlib
    import orjson

    compared: list[str] = []
    base, cand = [], []
    for run in receipt["runs"]:
        run_dir = directory / Path(run["receipt"]).parent
        one = verify(run_dir, progress=progress)
        compared += [f"{run['id']}/{c}" for c in one.compared]
        if not one.identical:
            return VerifyResult(False, f"{run['id']}: {one.first_difference}", compared)
        mine = orjson.loads((run_dir / "receipt.json").read_bytes())
        if hashlib.sha256(dumps(deterministic_part(mine))).hexdigest() != run["receipt_sha256"]:
            return VerifyResult(False, f"runs/{run['id']}: receipt_sha256 differs from the "
                                f"run's receipt", compared)
        base.append(mine["runs"]["baseline"]["metrics"])
        cand.append(mine["runs"]["candidate"]["metrics"])
    b = receipt["config"]["bootstrap"]
    again = paired_summary(base, cand, b["resamples"], b["seed"])
    again["method"] = receipt["summary"]["method"]     # wording only (runs or traces)
    compared.append("receipt.json summary (recomputed from the runs)")
    diff = first_json_difference(receipt["summary"], again, "/summary")
    if diff:
        return VerifyResult(False, f"receipt.json{diff}", compared)
    return VerifyResult(True, None, compared)


def verify(directory: str | Path, trace: str | None = None, gate: str | None = None,
           progress=None) -> VerifyResult:
    directory = Path(directory)
    receipt = load_receipt(directory, experiment_ok=trace is None and gate is None)
    if "psgate_experiment" in receipt:
        return verify_experiment(directory, receipt, progress)
    if receipt["config"]["engine"] == "vllm":
        raise InputError("engine 'vllm' records observed cached tokens and times, which no "
                         "second run reproduces byte for byte; replay the trace again instead",
                         path=str(directory / "receipt.json"), field="config.engine")
    work = Path(tempfile.mkdtemp(prefix="psgate-verify-"))
    try:
        cfg = config_from_receipt(receipt, work / "out", trace=trace, gate=gate)
        again = api.replay(cfg, progress=progress).receipt
        compared = ["receipt.json (outside environment)"]
        diff = first_json_difference(deterministic_part(receipt), deterministic_part(again))
        if diff:
            return VerifyResult(False, f"receipt.json{diff}", compared)
        for name in (receipt["config"].get("ledger", {}).get("file", "ledger.csv"),
                     "requests.csv"):
            compared.append(name)
            mine = directory / name
            if not mine.is_file():
                return VerifyResult(False, f"{name}: missing from {directory}", compared)
            diff = first_line_difference(mine, work / "out" / name)
            if diff:
                return VerifyResult(False, diff, compared)
        return VerifyResult(True, None, compared)
    finally:
        shutil.rmtree(work, ignore_errors=True)
