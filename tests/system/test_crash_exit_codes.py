"""A crash is never exit 1: CI reads 1 as "the gate failed", a policy regression.

Every command of the app (listed from the typer app itself, so a new command must be added
here) runs in-process once clean, counting the calls into psgate's own Python code, then
again with a RuntimeError raised at seeded call numbers, deep in whatever that command
runs. An unexpected exception must end as exit 4 (internal error, one line saying it is a
psgate bug); a fault psgate deliberately absorbs leaves the clean run's exit code. Exit 1
is allowed only where the clean run failed its gate, and for check-policy only as a
contract failure that names the injected fault (a policy's exception fails a contract).
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest
import typer.main

from psgate import cli

REPO = Path(__file__).resolve().parents[2]
PSGATE = str(REPO / "psgate") + "/"
INCIDENT = REPO / "examples" / "ci" / "incident.jsonl"
SEEDS = 3
FAULT = "injected fault"


def command_paths(command, prefix=()) -> list[tuple[str, ...]]:
    subs = getattr(command, "commands", None)
    if not subs:
        return [prefix]
    return [p for name, sub in sorted(subs.items()) for p in command_paths(sub, (*prefix, name))]


COMMANDS = command_paths(typer.main.get_command(cli.app))


@pytest.fixture(scope="module")
def receipt(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("receipt") / "o"
    code, _ = _main(["replay", "--trace", str(INCIDENT), "--baseline", "lru", "--candidate",
                     "prefixshield", "--quiet", "--out", str(out)])
    assert code == 0
    return out


def args_for(path: tuple[str, ...], tmp: Path, receipt: Path) -> list:
    return [*path, *map(str, arguments(tmp, receipt)[path])]


def arguments(tmp: Path, receipt: Path) -> dict[tuple[str, ...], list]:
    """Each command's arguments: a run that does real work where a short one exists."""
    raw = tmp / "raw.jsonl"
    if tmp.is_dir():
        raw.write_text('{"t": 0, "id": 1, "group": "g", "contract": "standard", '
                   '"prompt_token_ids": [1, 2, 3, 4, 5, 6, 7, 8, 9]}\n')
    return {
        ("replay",): ["--trace", INCIDENT, "--baseline", "lru", "--candidate", "prefixshield",
                      "--quiet", "--out", tmp / "o", "--junit", tmp / "j.xml"],
        ("verify",): [receipt],
        ("explain",): [receipt, "--decision", 1],
        ("diff",): [receipt, receipt],
        ("report",): [receipt, "-o", tmp / "r.html"],
        ("summary",): [receipt],
        ("curve",): ["--trace", INCIDENT, "--policy", "lru", "--capacities", "64,256",
                     "--json"],
        ("validate",): [INCIDENT],
        ("contracts", "suggest"): ["--trace", INCIDENT, "--capacity", "96", "--json"],
        ("policies",): ["--json"],
        ("check-policy",): ["lru", "--examples", 1],
        ("ledger", "convert"): [receipt, "-o", tmp / "l.csv"],
        ("trace", "gen"): ["random", "-o", tmp / "g.jsonl"],
        ("trace", "import"): [REPO / "examples" / "traces" / "mooncake_conversation_head.jsonl",
                              "--format", "mooncake", "-o", tmp / "i.jsonl"],
        ("trace", "redact"): [raw, "-o", tmp / "red.jsonl", "--unkeyed", "--block-size", 4],
        ("trace", "stats"): [INCIDENT],
        ("trace", "kinds"): ["--json"],
        ("sweep",): ["--workload", "random", "--out", tmp / "sw", "--runs", 2, "--axis",
                     "capacity=8", "--baseline", "lru", "--candidate", "lru", "--quiet",
                     "--resamples", 100],
        # a version-2 file, refused after it is read: measuring needs torch and minutes
        ("calibrate",): ["--convert", REPO / "examples" / "cost-models" / "h200-qwen2.5-1.5b.json",
                         "-o", tmp / "c.json", "--quiet"],
        ("bench",): ["--repeats", 0],           # refused before any work: the full bench is minutes
        ("version",): [],
    }


def _main(argv: list[str], inject_at: int | None = None) -> tuple[int, int]:
    """(exit code, psgate calls made inside the app) of ``psgate ARGV`` in-process; with
    ``inject_at`` the call of that number raises RuntimeError instead."""
    calls = 0

    def profile(frame, event, arg):
        nonlocal calls
        if event == "call" and frame.f_code.co_filename.startswith(PSGATE):
            calls += 1
            if calls == inject_at:
                sys.setprofile(None)
                raise RuntimeError(FAULT)

    inner = cli._run_app

    def run_app():
        sys.setprofile(profile)
        try:
            inner()
        finally:
            sys.setprofile(None)

    old_argv, old_app, old_signal = sys.argv, cli._run_app, cli.signal.signal
    sys.argv, cli._run_app = ["psgate", *argv], run_app
    cli.signal.signal = lambda *a: None
    code = 0
    try:
        cli.main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        sys.argv, cli._run_app, cli.signal.signal = old_argv, old_app, old_signal
    return code, calls


def test_every_command_has_arguments_here():
    assert len(COMMANDS) > 10
    assert set(arguments(Path("/nonexistent"), Path("/nonexistent"))) == set(COMMANDS)


@pytest.mark.parametrize("path", COMMANDS, ids=" ".join)
def test_a_fault_anywhere_is_never_exit_1(path, tmp_path, receipt, capsys, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", None)
    clean_dir = tmp_path / "clean"
    clean_dir.mkdir()
    clean, n = _main(args_for(path, clean_dir, receipt))
    capsys.readouterr()
    assert clean in (0, 1, 2, 3), clean
    assert n > 0
    rng = random.Random(" ".join(path))
    for seed in range(SEEDS):
        at = rng.randint(1, n)
        work = tmp_path / f"fault{seed}"
        work.mkdir()
        code, _ = _main(args_for(path, work, receipt), inject_at=at)
        err = capsys.readouterr().err
        where = f"{' '.join(path)}: fault at call {at} of {n}: exit {code}: {err[-600:]}"
        if code == 1 and path == ("check-policy",):
            assert "FAIL" in err and FAULT in err, where
            continue
        assert code != 1 or clean == 1, where
        assert code in (4, clean), where
        if code == 4:
            lines = [ln for ln in err.splitlines() if ln.strip()]
            assert lines[-1].startswith("psgate: internal error") and "psgate bug" in lines[-1]
            assert "Traceback" not in err, where
