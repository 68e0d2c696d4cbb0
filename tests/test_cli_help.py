"""Help that fits a terminal: every command's --help at 80 columns shows every option name
whole (rich cuts a name that does not fit its column with an ellipsis), no line is wider
than the terminal, every command's summary is one line, and --version answers."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import typer

from psgate import __version__
from psgate.cli import app


def _commands(group, path=()):
    for name in sorted(group.commands):
        cmd = group.commands[name]
        if hasattr(cmd, "commands"):
            yield from _commands(cmd, (*path, name))
        else:
            yield (*path, name), cmd


ROOT_CMD = typer.main.get_command(app)
COMMANDS = list(_commands(ROOT_CMD))


def _help(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, COLUMNS="80", NO_COLOR="1", TERM="dumb")
    return subprocess.run([sys.executable, "-m", "psgate", *args, "--help"],
                          capture_output=True, text=True, env=env, timeout=120)


@pytest.mark.parametrize("path,cmd", [((), ROOT_CMD), *COMMANDS],
                         ids=["psgate"] + [" ".join(p) for p, _ in COMMANDS])
def test_help_at_80_columns_shows_every_option_name_whole(path, cmd):
    proc = _help(*path)
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout + proc.stderr
    assert "…" not in text, text
    assert max(len(line) for line in text.splitlines()) <= 80
    for param in cmd.params:
        for name in (*param.opts, *getattr(param, "secondary_opts", ())):
            if name.startswith("-"):
                assert name in text, (name, text)


@pytest.mark.parametrize("path,cmd", COMMANDS, ids=[" ".join(p) for p, _ in COMMANDS])
def test_every_summary_is_one_line(path, cmd):
    first = (cmd.help or "").strip().split("\n\n")[0]
    assert first and "\n" not in first and len(first) <= 100, first


def test_version_option_and_command_agree():
    for args in (["--version"], ["version"]):
        proc = subprocess.run([sys.executable, "-m", "psgate", *args], capture_output=True,
                              text=True, timeout=60)
        assert proc.returncode == 0 and proc.stdout.strip() == __version__, proc.stderr
