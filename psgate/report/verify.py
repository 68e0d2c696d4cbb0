"""verify: recompute a receipt from its trace and configuration and compare everything.

A receipt is evidence only if editing it is caught, so nothing outside ``environment``
is taken on trust:

1. each output's SHA-256 recorded in the receipt (``outputs``) is checked against the
   file on disk first, so a changed, extended or deleted ledger is named without a
   replay (and without the trace), and an entry under a name psgate writes that the
   receipt does not account for (a planted ``runs/run-009/``, a second ledger) is named too;
2. the replay is run again and its ``receipt.json`` compared as JSON values (canonically:
   a re-indented file says the same thing, and the outputs' bytes are pinned by 1), then
   every output line by line, to the last line (an extra line or gzip member counts);
3. for an experiment (matched runs), every run's receipt must hash to the
   ``receipt_sha256`` recorded for it, the whole experiment is run again from the
   runs' traces and configuration, and every run's files, the generated traces,
   ``runs.csv`` and the experiment receipt (gates, config, source, summary) compared.

The first difference is named (file and line, or JSON path) with exit 1; a receipt
that cannot be read as one (bad JSON, off its schema, bytes that are not UTF-8, a
broken gzip stream) is bad input, exit 2.

The replay runs the policy code found here, named as the receipt recorded it. Where that
code is not the receipt's (``config.<run>.source``: another SHA-256 over its files,
another version or class), verify says so first, then whether the replay with this code
reproduces the receipt all the same, and exits 5: the receipt is evidence about other
code, which is not the same finding as an edited receipt.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import shutil
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path

from psgate import api
from psgate.errors import InputError
from psgate.receipt.ledger import file_sha256
from psgate.receipt.receipt import deterministic_part, dumps
from psgate.report.receipts import (config_from_receipt, load_receipt, read_receipt_file,
                                    replay_settings, resolve_input, text_lines)


@dataclass
class VerifyResult:
    identical: bool
    first_difference: str | None
    compared: list[str]
    # One line per run whose policy code here is not the receipt's (config.<run>.source)
    policy_changes: list[str] = field(default_factory=list)

    @property
    def verified(self) -> bool:
        return self.identical and not self.policy_changes


def policy_changes(receipt: dict, again: dict, prefix: str = "") -> list[str]:
    """Each run whose policy source in the replay differs from the receipt's; the
    replay's record is then set to the receipt's, so that what is compared next is what
    the code did, not which code it was."""
    out = []
    for run in ("baseline", "candidate"):
        mine = receipt["config"][run].get("source")
        here = again["config"][run].get("source")
        if mine is None or here is None or mine == here:
            continue
        what = [f"{k} {here.get(k)!r:.80} here, {mine.get(k)!r:.80} in the receipt"
                for k in ("class", "distribution", "version", "api_version")
                if mine.get(k) != here.get(k)]
        if mine.get("sha256") != here.get("sha256"):
            files = sorted(set(mine.get("files", [])) ^ set(here.get("files", [])))
            what.append(f"source SHA-256 {here['sha256'][:16]}... here, "
                        f"{str(mine.get('sha256'))[:16]}... in the receipt"
                        + (f" (files only on one side: {', '.join(files)})" if files else ""))
        out.append(f"{prefix}{run} policy '{mine.get('spec')}': the code is not the "
                   f"receipt's: {'; '.join(what) or 'its record differs'}")
        again["config"][run]["source"] = mine
    return out


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


def first_line_difference(a: Path, b: Path, label: str | None = None) -> str | None:
    """Line by line to the end of both files: a line only one of them has is a
    difference (a gzip stream with a member appended reads as more lines)."""
    label = label or a.name
    pairs = itertools.zip_longest(text_lines(a), text_lines(b))
    for n, (x, y) in enumerate(pairs, start=1):
        if x == y:
            continue
        if y is None:
            return f"{label}:{n}: the receipt's file has a line more, {x.rstrip()!r:.120}"
        if x is None:
            return f"{label}:{n}: the replay gives a line more, {y.rstrip()!r:.120}"
        return (f"{label}:{n}: receipt has {x.rstrip()!r:.120}, "
                f"replay gives {y.rstrip()!r:.120}")
    return None


def _plain_name(name: str) -> bool:
    return name not in ("", ".", "..") and "/" not in name and "\\" not in name


def recorded_outputs_difference(directory: Path, receipt: dict, prefix: str = "") -> str | None:
    """The first output whose bytes on disk are not those the receipt recorded. A file
    that differs and cannot even be read as psgate's CSV is bad input (InputError)."""
    for name, rec in sorted(receipt["outputs"].items()):
        if not (isinstance(rec, dict) and isinstance(rec.get("sha256"), str)):
            raise InputError(f"expected {{\"sha256\": ...}}, found {rec!r:.60}",
                             path=str(directory / "receipt.json"), field=f"outputs.{name}")
        if not _plain_name(name):
            return f"{prefix}receipt.json/outputs: {name!r} is not a file psgate writes"
        p = directory / name
        if not p.is_file():
            return f"{prefix}{name}: missing (the receipt records its SHA-256)"
        digest = file_sha256(p)
        if digest != rec["sha256"]:
            for _ in text_lines(p):     # unreadable: bad input, named by line
                pass
            return (f"{prefix}{name}: SHA-256 {digest[:16]}... on disk, the receipt records "
                    f"{rec['sha256'][:16]}... (the file changed after it was written)")
    return None


# Every name psgate writes in a receipt or experiment directory (psgate.atomic's
# EXPERIMENT_OUTPUTS); other files beside them (a report, notes) are not psgate's.
PSGATE_NAMES = ("receipt.json", "ledger.csv", "ledger.csv.gz", "ledger.compact.csv.gz",
                "requests.csv", "runs.csv", "runs", "traces")
_CONVERTED = ("ledger.csv", "ledger.csv.gz")     # psgate ledger convert's default, beside it


def unrecorded_entries_difference(directory: Path, receipt: dict, prefix: str = ""
                                  ) -> str | None:
    """An entry under a name psgate writes that the receipt does not account for: a
    receipt is evidence of what is in its directory, so a planted ``runs/run-009/`` or a
    second ledger beside the recorded one must not pass as part of it. A CSV ledger beside
    a compact one is what ``psgate ledger convert`` writes there, and must decode the same."""
    recorded = set(receipt["outputs"]) | {"receipt.json"}
    experiment = "psgate_experiment" in receipt
    if experiment:
        recorded |= {"runs"} | ({"traces"} if receipt["source"]["kind"] == "workload" else set())
    for name in PSGATE_NAMES:
        p = directory / name
        if name in recorded or not os.path.lexists(p):
            continue
        if name in _CONVERTED and "ledger.compact.csv.gz" in recorded:
            diff = first_line_difference(directory / "ledger.compact.csv.gz", p,
                                         f"{prefix}{name}")
            if diff:
                return f"{diff} (not the conversion of ledger.compact.csv.gz beside it)"
            continue
        return f"{prefix}{name}: not an output this receipt records (planted or left over)"
    if not experiment:
        return None
    expected = {"runs": {r["id"] for r in receipt["runs"]},
                "traces": {Path(r["trace"]["path"]).name for r in receipt["runs"]
                           if r["trace"]["path"].startswith("traces/")}}
    for sub, names in expected.items():
        if not (directory / sub).is_dir():
            continue
        extra = sorted(p.name for p in (directory / sub).iterdir() if p.name not in names)
        if extra:
            return (f"{sub}/{extra[0]}: not a run or trace the experiment receipt records "
                    f"(planted or left over)")
    return None


def _compare_files(mine: Path, again: Path, names, prefix: str, compared: list[str]
                   ) -> str | None:
    for name in names:
        compared.append(f"{prefix}{name}")
        if not (mine / name).is_file():
            return f"{prefix}{name}: missing from {mine}"
        diff = first_line_difference(mine / name, again / name, f"{prefix}{name}")
        if diff:
            return diff
    return None


def _compare_replay(directory: Path, receipt: dict, again: dict, out: Path, prefix: str,
                    compared: list[str], changes: list[str]) -> str | None:
    """A replay's receipt outside environment, then its outputs to the last line; a
    policy whose code differs is added to ``changes`` and not counted as a difference."""
    changes += policy_changes(receipt, again, prefix)
    compared.append(f"{prefix}receipt.json (outside environment)")
    diff = first_json_difference(deterministic_part(receipt), deterministic_part(again))
    if diff:
        return f"{prefix}receipt.json{diff}"
    return _compare_files(directory, out, sorted(again["outputs"]), prefix, compared)


def _refuse_observed(receipt: dict, path: Path) -> None:
    if receipt["config"]["engine"] == "vllm":
        raise InputError("engine 'vllm' records observed cached tokens and times, which no "
                         "second run reproduces byte for byte; replay the trace again instead",
                         path=str(path), field="config.engine")


def _run_receipt_sha256(receipt: dict) -> str:
    return hashlib.sha256(dumps(deterministic_part(receipt))).hexdigest()


def _corpus(receipt: dict, runs: dict[str, dict], work: Path) -> Path:
    """A directory holding each run's trace under the name the experiment read it by,
    found as a single replay's trace is (the recorded path, else the absolute one) and
    held to the canonical digest its run recorded."""
    d = work / "corpus"
    d.mkdir()
    for run in receipt["runs"]:
        mine = runs[run["id"]]
        env = mine.get("environment", {})
        found = resolve_input(mine["trace"]["path"], env.get("trace_abspath"), None, "trace",
                              mine["trace"].get("sha256") or env.get("trace_sha256"),
                              mine["trace"]["canonical_sha256"])
        link = d / Path(mine["trace"]["path"]).name
        if link.exists():
            raise InputError(f"two runs name the trace {link.name}", field="runs",
                             path=str(Path(run["receipt"])))
        try:
            link.symlink_to(Path(found).resolve())
        except OSError:
            shutil.copyfile(found, link)
    return d


def _workload_spec(source: dict, path: Path) -> str:
    """``KIND:key=value,...`` that parses back to the recorded workload and params."""
    from psgate.experiment import parse_workload
    import orjson

    params = source["params"]
    spec = source["workload"] + ("" if not params else ":" + ",".join(
        f"{k}={orjson.dumps(v).decode()}" for k, v in params.items()))
    if parse_workload(spec) != (source["workload"], params):
        raise InputError("the recorded workload parameters cannot be stated again as "
                         "--workload KIND:key=value,...", path=str(path), field="source.params")
    return spec


def verify_experiment(directory: Path, receipt: dict, gate: str | None = None,
                      contracts: str | None = None) -> VerifyResult:
    """Recorded digests first (the experiment's outputs, each run's receipt and outputs),
    then the experiment run again from the same traces and configuration and compared
    whole: each run, the generated traces, runs.csv and the experiment receipt."""
    from psgate.experiment import ExperimentConfig, run_experiment
    from psgate.receipt.gate import Tolerances

    top = directory / "receipt.json"
    _refuse_observed(receipt, top)
    compared = ["recorded SHA-256 of every output", "no unrecorded runs, traces or outputs"]
    diff = (recorded_outputs_difference(directory, receipt)
            or unrecorded_entries_difference(directory, receipt))
    if diff:
        return VerifyResult(False, diff, compared)
    runs: dict[str, dict] = {}
    for i, run in enumerate(receipt["runs"]):
        rid, where = run["id"], f"runs/{run['id']}/receipt.json"
        if run["receipt"] != where or rid in runs:
            return VerifyResult(False, f"receipt.json/runs/{i}: run {rid!r} with receipt "
                                f"{run['receipt']!r}, psgate writes one {where} per run",
                                compared)
        run_dir = directory / "runs" / rid
        if not (run_dir / "receipt.json").is_file():
            return VerifyResult(False, f"{where}: missing", compared)
        mine = read_receipt_file(run_dir / "receipt.json")
        if "psgate_experiment" in mine:
            raise InputError("expected one run's receipt, found an experiment receipt",
                             path=str(run_dir / "receipt.json"))
        _refuse_observed(mine, run_dir / "receipt.json")
        if _run_receipt_sha256(mine) != run["receipt_sha256"]:
            return VerifyResult(False, f"{where}: its SHA-256 outside environment is not the "
                                f"receipt_sha256 receipt.json/runs/{i} records", compared)
        diff = (recorded_outputs_difference(run_dir, mine, f"runs/{rid}/")
                or unrecorded_entries_difference(run_dir, mine, f"runs/{rid}/"))
        if diff:
            return VerifyResult(False, diff, compared)
        runs[rid] = mine

    cfg, source = receipt["config"], receipt["source"]
    first = runs[receipt["runs"][0]["id"]]
    gate_path = gate_label = None
    if cfg["gate_file"]:
        gate_label = cfg["gate_file"]["path"]
        gate_path = resolve_input(gate_label, None, gate, "gate", cfg["gate_file"]["sha256"])
    contracts_path = contracts_label = None
    if cfg.get("contracts_file"):
        contracts_label = cfg["contracts_file"]["path"]
        contracts_path = resolve_input(contracts_label, None, contracts, "contracts",
                                       cfg["contracts_file"]["sha256"])
    work = Path(tempfile.mkdtemp(prefix="psgate-verify-"))
    try:
        base = replace(replay_settings(first, work / "out"), force=False,
                       gate_file=gate_path, gate_label=gate_label,
                       contracts_file=contracts_path, contracts_label=contracts_label,
                       tolerances=Tolerances.from_json(cfg.get("non_regression")))
        exp = ExperimentConfig(replay=base, resamples=cfg["bootstrap"]["resamples"],
                               bootstrap_seed=cfg["bootstrap"]["seed"])
        if source["kind"] == "workload":
            exp.workload, exp.runs, exp.seed = (_workload_spec(source, top), source["runs"],
                                                source["base_seed"])
        else:
            exp.corpus = str(_corpus(receipt, runs, work))
            exp.corpus_label = source["directory"]
        again = run_experiment(exp).receipt
        changes: list[str] = []
        out = work / "out"
        for run in again["runs"]:
            rid, prefix = run["id"], f"{run['id']}/"
            if rid not in runs:
                break                   # the experiment receipt's comparison names it
            mine = runs[rid]
            redo = read_receipt_file(out / "runs" / rid / "receipt.json")
            diff = _compare_replay(directory / "runs" / rid, mine, redo, out / "runs" / rid,
                                   prefix, compared, changes)
            if diff:
                return VerifyResult(False, diff, compared, changes)
            if source["kind"] == "workload":
                diff = _compare_files(directory, out, [run["trace"]["path"]], "", compared)
                if diff:
                    return VerifyResult(False, diff, compared)
        diff = _compare_files(directory, out, sorted(again["outputs"]), "", compared)
        if diff:
            return VerifyResult(False, diff, compared, changes)
        compared.append("receipt.json (outside environment, recomputed from the runs)")
        policy_changes(receipt, again)      # said per run above
        diff = first_json_difference(deterministic_part(receipt), deterministic_part(again))
        if diff:
            return VerifyResult(False, f"receipt.json{diff}", compared, changes)
        return VerifyResult(True, None, compared, changes)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def verify(directory: str | Path, trace: str | None = None, gate: str | None = None,
           progress=None, contracts: str | None = None) -> VerifyResult:
    directory = Path(directory)
    receipt = load_receipt(directory, experiment_ok=trace is None)
    if "psgate_experiment" in receipt:
        return verify_experiment(directory, receipt, gate=gate, contracts=contracts)
    _refuse_observed(receipt, directory / "receipt.json")
    compared = ["recorded SHA-256 of every output", "no unrecorded outputs"]
    diff = (recorded_outputs_difference(directory, receipt)
            or unrecorded_entries_difference(directory, receipt))
    if diff:
        return VerifyResult(False, diff, compared)
    work = Path(tempfile.mkdtemp(prefix="psgate-verify-"))
    try:
        cfg = config_from_receipt(receipt, work / "out", trace=trace, gate=gate,
                                  contracts=contracts)
        again = api.replay(cfg, progress=progress).receipt
        changes: list[str] = []
        diff = _compare_replay(directory, receipt, again, work / "out", "", compared, changes)
        return VerifyResult(diff is None, diff, compared, changes)
    finally:
        shutil.rmtree(work, ignore_errors=True)
