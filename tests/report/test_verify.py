"""Hostile verify: a receipt edited after the fact never verifies (exit 1 naming the first
difference), and a receipt or ledger that cannot be read as one is bad input for every
review command (exit 2, one line naming the file), never a traceback."""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from psgate import cli
from psgate.receipt.receipt import deterministic_part, dumps
from psgate.report.verify import first_line_difference
from psgate.trace.writer import write_trace
from psgate.workloads import generate

IMPOSSIBLE = '[[check]]\nmetric = "hit_fraction"\nop = ">="\nref = 2\n'
POLICIES = ["--baseline", "lru", "--candidate", "prefixshield", "--capacity", "16"]


@dataclass
class Ran:
    code: int
    out: str
    err: str

    @property
    def result(self) -> dict:
        return json.loads(self.out)


def run_cli(*args) -> Ran:
    """The CLI in-process through its main(), so exit codes and error lines are the real
    ones, at a fraction of a subprocess's start-up."""
    out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")     # the CLI writes bytes too
    err = io.StringIO()
    argv = sys.argv
    sys.argv = ["psgate", *map(str, args)]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            cli.main()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    finally:
        sys.argv = argv
    out.flush()
    return Ran(code, out.buffer.getvalue().decode(), err.getvalue())


def one_line_error(ran: Ran, *needles: str) -> str:
    assert ran.code == 2, (ran.code, ran.err, ran.out)
    lines = [ln for ln in ran.err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("psgate: error:"), ran.err
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


def not_verified(ran: Ran, *needles: str) -> str:
    assert ran.code == 1, (ran.code, ran.err)
    assert ran.result["verified"] is False
    diff = ran.result["first_difference"]
    for n in needles:
        assert n in diff, diff
    return diff


def replay(*args) -> Ran:
    return run_cli("replay", *POLICIES, "--quiet", *args)


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """Three small traces, a gate file no run passes, and the receipts every test copies:
    one replay (plain ledger, failing gate), one with a gzip ledger, a corpus experiment
    (failing gate) and a generated-workload experiment."""
    d = tmp_path_factory.mktemp("hostile")
    (d / "corp").mkdir()
    for seed in (1, 2, 3):
        write_trace(d / "corp" / f"t{seed}.jsonl",
                    generate("random", {"seed": seed, "requests": 120}))
    (d / "impossible.toml").write_text(IMPOSSIBLE)
    gate = ["--gate", d / "impossible.toml"]
    t1 = d / "corp" / "t1.jsonl"
    plain = ["--ledger-compression", "none"]
    assert replay("--trace", t1, "--out", d / "one", *gate, *plain).code == 1
    assert replay("--trace", t1, "--out", d / "gz", "--ledger-compression", "gzip").code in (0, 1)
    assert replay("--trace", d / "corp", "--out", d / "exp", "--resamples", "100",
                  *gate, *plain).code == 1
    ran = replay("--workload", "random:requests=120", "--runs", "2", "--seed", "5",
                 "--out", d / "wl", "--resamples", "100")
    assert ran.code in (0, 1), ran.err
    return d


def copy(made: Path, name: str, tmp_path: Path) -> Path:
    dst = tmp_path / name
    shutil.copytree(made / name, dst, symlinks=True)
    return dst


def edit_json(path: Path, change) -> None:
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc, indent=2))


def reseal_run(exp: Path, run_id: str) -> None:
    """Make the experiment's receipt_sha256 of a run match its (edited) receipt, as a
    careful forger would."""
    import hashlib

    run = json.loads((exp / "runs" / run_id / "receipt.json").read_text())
    digest = hashlib.sha256(dumps(deterministic_part(run))).hexdigest()

    def change(r):
        next(x for x in r["runs"] if x["id"] == run_id)["receipt_sha256"] = digest
    edit_json(exp / "receipt.json", change)


def pass_everything(r: dict) -> None:
    r["gate"]["result"] = "pass"
    r["gate"]["num_failed"] = 0
    for c in r["gate"]["checks"]:
        c["verdict"] = "pass"


# --- the untouched receipts verify -------------------------------------------------------

@pytest.mark.parametrize("name", ["one", "gz", "exp", "wl"])
def test_untouched_receipts_verify(made, name):
    ran = run_cli("verify", made / name)
    assert ran.code == 0, (ran.err, ran.out)
    assert ran.result["verified"] is True


# --- one replay ----------------------------------------------------------------------------

def test_single_replay_gate_flipped_to_pass(made, tmp_path):
    d = copy(made, "one", tmp_path)
    edit_json(d / "receipt.json", pass_everything)
    not_verified(run_cli("verify", d), "receipt.json/gate/")


def test_single_replay_value_changed_inside_runs(made, tmp_path):
    d = copy(made, "one", tmp_path)

    def change(r):
        r["runs"]["candidate"]["metrics"]["totals"]["hit_fraction"] = 0.9
    edit_json(d / "receipt.json", change)
    not_verified(run_cli("verify", d), "/runs/candidate/metrics/totals/hit_fraction")


@pytest.mark.parametrize("name", ["ledger.csv", "requests.csv"])
def test_appended_row(made, tmp_path, name):
    d = copy(made, "one", tmp_path)
    last = (d / name).read_text().splitlines(keepends=True)[-1]
    with open(d / name, "a") as fh:
        fh.write(last)
    not_verified(run_cli("verify", d), f"{name}: SHA-256")


def test_extra_gzip_member(made, tmp_path):
    d = copy(made, "gz", tmp_path)
    with gzip.open(d / "ledger.csv.gz", "rt") as fh:
        last = fh.read().splitlines(keepends=True)[-1]
    with open(d / "ledger.csv.gz", "ab") as fh:
        fh.write(gzip.compress(last.encode(), mtime=0))
    not_verified(run_cli("verify", d), "ledger.csv.gz: SHA-256")


@pytest.mark.parametrize("name", ["ledger.csv", "requests.csv"])
def test_output_deleted(made, tmp_path, name):
    d = copy(made, "one", tmp_path)
    (d / name).unlink()
    not_verified(run_cli("verify", d), f"{name}: missing")


def test_appended_row_with_the_recorded_digest_forged_too(made, tmp_path):
    d = copy(made, "one", tmp_path)
    with open(d / "requests.csv", "a") as fh:
        fh.write((d / "requests.csv").read_text().splitlines(keepends=True)[-1])
    from psgate.receipt.ledger import file_sha256
    digest = file_sha256(d / "requests.csv")

    def change(r):
        r["outputs"]["requests.csv"]["sha256"] = digest
    edit_json(d / "receipt.json", change)
    not_verified(run_cli("verify", d), "outputs/requests.csv/sha256")


def test_line_comparison_reads_both_files_to_the_end(tmp_path):
    """A line only the receipt's file has is a difference, in plain and gzip files."""
    a, b = tmp_path / "a" / "ledger.csv", tmp_path / "b" / "ledger.csv"
    a.parent.mkdir()
    b.parent.mkdir()
    b.write_text("h\n1\n2\n")
    a.write_text("h\n1\n2\n3\n")
    assert first_line_difference(a, b).startswith("ledger.csv:4: the receipt's file")
    assert first_line_difference(b, a).startswith("ledger.csv:4: the replay gives")
    assert first_line_difference(b, b) is None
    ga, gb = a.with_suffix(".csv.gz"), b.with_suffix(".csv.gz")
    gb.write_bytes(gzip.compress(b"h\n1\n", mtime=0))
    ga.write_bytes(gzip.compress(b"h\n1\n", mtime=0) + gzip.compress(b"2\n", mtime=0))
    assert first_line_difference(ga, gb).startswith("ledger.csv.gz:3:")


# --- experiments ---------------------------------------------------------------------------

def test_experiment_gate_flipped_to_pass(made, tmp_path):
    d = copy(made, "exp", tmp_path)
    edit_json(d / "receipt.json", pass_everything)
    not_verified(run_cli("verify", d), "receipt.json/gate/")


def test_experiment_per_run_gate_edited(made, tmp_path):
    d = copy(made, "exp", tmp_path)

    def change(r):
        r["runs"][1]["gate"] = "fail" if r["runs"][1]["gate"] == "pass" else "pass"
    edit_json(d / "receipt.json", change)
    not_verified(run_cli("verify", d), "receipt.json/runs/1/gate")


def test_run_receipt_gate_edited(made, tmp_path):
    d = copy(made, "exp", tmp_path)

    def change(r):
        r["gate"]["result"] = "fail"
    edit_json(d / "runs" / "t2" / "receipt.json", change)
    not_verified(run_cli("verify", d), "runs/t2/receipt.json", "receipt_sha256")
    reseal_run(d, "t2")
    not_verified(run_cli("verify", d), "t2/receipt.json/gate/result")


@pytest.mark.parametrize("key,value", [("capacity", 17), ("paranoid", True)])
def test_experiment_config_edited(made, tmp_path, key, value):
    d = copy(made, "exp", tmp_path)

    def change(r):
        r["config"][key] = value
    edit_json(d / "receipt.json", change)
    not_verified(run_cli("verify", d), f"receipt.json/config/{key}")


def test_experiment_source_edited(made, tmp_path):
    d = copy(made, "exp", tmp_path)

    def change(r):
        r["source"]["traces"] = r["source"]["traces"][:2]
    edit_json(d / "receipt.json", change)
    not_verified(run_cli("verify", d), "receipt.json/source/traces")


def test_experiment_runs_csv_edited(made, tmp_path):
    d = copy(made, "exp", tmp_path)
    lines = (d / "runs.csv").read_text().splitlines(keepends=True)
    lines[1] = lines[1].replace("lru", "lrv", 1)
    (d / "runs.csv").write_text("".join(lines))
    not_verified(run_cli("verify", d), "runs.csv: SHA-256")


def test_experiment_value_changed_inside_runs(made, tmp_path):
    d = copy(made, "exp", tmp_path)

    def change(r):
        r["runs"][0]["metrics"]["candidate"]["totals"]["hit_fraction"] = 0.9
    edit_json(d / "receipt.json", change)
    not_verified(run_cli("verify", d), "receipt.json/runs/0/metrics/candidate/totals")


def test_experiment_appended_ledger_row(made, tmp_path):
    d = copy(made, "exp", tmp_path)
    p = d / "runs" / "t3" / "ledger.csv"
    with open(p, "a") as fh:
        fh.write(p.read_text().splitlines(keepends=True)[-1])
    not_verified(run_cli("verify", d), "runs/t3/ledger.csv: SHA-256")


def test_experiment_run_output_deleted(made, tmp_path):
    d = copy(made, "exp", tmp_path)
    (d / "runs" / "t1" / "requests.csv").unlink()
    not_verified(run_cli("verify", d), "runs/t1/requests.csv: missing")


def test_generated_trace_edited(made, tmp_path):
    d = copy(made, "wl", tmp_path)
    p = d / "traces" / "run-000.jsonl"
    lines = p.read_text().splitlines(keepends=True)
    p.write_text("".join(lines[:-1]))
    not_verified(run_cli("verify", d), "traces/run-000.jsonl:")


def test_experiment_verified_from_elsewhere_with_the_gate_named(made, tmp_path, monkeypatch):
    """Recorded relative paths (the corpus, the gate file) are found again: the traces
    through each run's receipt, the gate file with --gate."""
    d = tmp_path / "x"
    (tmp_path / "corp").symlink_to(made / "corp")
    shutil.copy(made / "impossible.toml", tmp_path / "g.toml")
    monkeypatch.chdir(tmp_path)
    assert replay("--trace", "corp", "--out", d, "--resamples", "100",
                  "--gate", "g.toml").code == 1
    assert run_cli("verify", d).code == 0
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    one_line_error(run_cli("verify", d), "g.toml", "--gate")
    ran = run_cli("verify", d, "--gate", tmp_path / "g.toml")
    assert ran.code == 0, ran.out


# --- malformed receipts and ledgers: exit 2, one line naming the file ---------------------

def _capacity(value):
    def change(r):
        r["config"]["capacity"] = value
    return change


def _no_config(r):
    del r["config"]


MALFORMED = {
    "array": (lambda p: p.write_text("[]"), "receipt.json", "JSON object"),
    "empty": (lambda p: p.write_text("{}"), "receipt.json", "psgate_receipt"),
    "no-config": (lambda p: edit_json(p, _no_config), "receipt.json", "'config'"),
    "capacity-float": (lambda p: edit_json(p, _capacity(16.0)), "config.capacity", "16.0"),
    "capacity-string": (lambda p: edit_json(p, _capacity("16")), "config.capacity", "'16'"),
}


def _commands(d: Path, other: Path, out: Path):
    return {"verify": ["verify", d], "diff": ["diff", other, d],
            "explain": ["explain", d, "--decision", "3"],
            "report": ["report", d, "-o", out / "r.html"]}


@pytest.mark.parametrize("command", ["verify", "diff", "explain", "report"])
@pytest.mark.parametrize("kind", sorted(MALFORMED))
def test_malformed_receipt(made, tmp_path, command, kind):
    d = copy(made, "one", tmp_path)
    spoil, *needles = MALFORMED[kind]
    spoil(d / "receipt.json")
    args = _commands(d, made / "one", tmp_path)[command]
    one_line_error(run_cli(*args), str(d / "receipt.json"), *needles)


def _not_utf8(p: Path, line: int) -> None:
    lines = p.read_bytes().split(b"\n")
    lines[line - 1] += b"\xff\xfe"
    p.write_bytes(b"\n".join(lines))


@pytest.mark.parametrize("command,name", [("verify", "ledger.csv"), ("explain", "ledger.csv"),
                                          ("verify", "requests.csv"),
                                          ("report", "requests.csv")])
def test_non_utf8_output(made, tmp_path, command, name):
    d = copy(made, "one", tmp_path)
    _not_utf8(d / name, 3)
    args = _commands(d, made / "one", tmp_path)[command]
    one_line_error(run_cli(*args), f"{name}:3:", "UTF-8")


@pytest.mark.parametrize("command", ["verify", "explain"])
def test_corrupt_gzip_ledger(made, tmp_path, command):
    d = copy(made, "gz", tmp_path)
    raw = (d / "ledger.csv.gz").read_bytes()
    (d / "ledger.csv.gz").write_bytes(raw[: len(raw) // 2])
    args = _commands(d, made / "gz", tmp_path)[command]
    one_line_error(run_cli(*args), "ledger.csv.gz:", "gzip")


@pytest.mark.parametrize("kind", ["capacity-string", "array"])
def test_malformed_experiment_receipts(made, tmp_path, kind):
    """The experiment's own receipt and a run's receipt inside it are held to their
    schemas too."""
    spoil, *needles = MALFORMED[kind]
    d = copy(made, "exp", tmp_path)
    spoil(d / "receipt.json")
    one_line_error(run_cli("verify", d), str(d / "receipt.json"), *needles)
    d = copy(made, "exp", tmp_path / "run")
    spoil(d / "runs" / "t2" / "receipt.json")
    one_line_error(run_cli("verify", d), str(d / "runs" / "t2" / "receipt.json"), *needles)


# --- what is in the directory besides what the receipt records (issue 52) -----------------

def test_planted_run_directory_is_named(made, tmp_path):
    d = copy(made, "exp", tmp_path)
    shutil.copytree(d / "runs" / "t2", d / "runs" / "run-009")
    not_verified(run_cli("verify", d), "runs/run-009")


def test_planted_generated_trace_is_named(made, tmp_path):
    d = copy(made, "wl", tmp_path)
    first = sorted((d / "traces").iterdir())[0]
    shutil.copy(first, d / "traces" / "run-999.jsonl")
    not_verified(run_cli("verify", d), "traces/run-999.jsonl")


@pytest.mark.parametrize("name,planted", [("one", "requests.csv"), ("gz", "ledger.csv"),
                                          ("exp", "ledger.csv"), ("exp", "runs/t1/runs.csv")])
def test_planted_output_the_receipt_does_not_record_is_named(made, tmp_path, name, planted):
    d = copy(made, name, tmp_path)
    if planted == "requests.csv":       # one records it: plant a second ledger instead
        planted = "ledger.csv.gz"
    (d / planted).write_text("run,policy\n")
    not_verified(run_cli("verify", d), planted, "not an output this receipt records")


def test_converted_ledger_beside_the_compact_one_verifies_unless_edited(made, tmp_path):
    d = tmp_path / "c"
    assert replay("--trace", made / "corp" / "t1.jsonl", "--out", d).code in (0, 1)
    assert run_cli("ledger", "convert", d).code == 0
    ran = run_cli("verify", d)
    assert ran.code == 0, (ran.err, ran.out)
    with open(d / "ledger.csv", "a") as fh:
        fh.write("candidate,lru,999\n")
    not_verified(run_cli("verify", d), "ledger.csv", "not the conversion")


def test_reindented_receipt_verifies_as_the_readme_says(made, tmp_path):
    """receipt.json is compared as JSON values, not bytes (docs/reference/verify.md):
    the same receipt re-indented with its keys in another order still verifies."""
    d = copy(made, "one", tmp_path)
    doc = json.loads((d / "receipt.json").read_text())
    (d / "receipt.json").write_text(json.dumps(dict(reversed(list(doc.items()))), indent=7))
    ran = run_cli("verify", d)
    assert ran.code == 0 and ran.result["verified"] is True, (ran.err, ran.out)
    edit_json(d / "receipt.json", pass_everything)      # a changed value still is caught
    not_verified(run_cli("verify", d), "receipt.json/gate/")
    readme = (Path(__file__).resolve().parents[2] / "docs" / "reference" /
              "verify.md").read_text()
    assert "compared with the replay's as JSON values" in readme
