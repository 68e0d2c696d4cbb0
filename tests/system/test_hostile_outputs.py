"""Outputs under hostile conditions: --force over the inputs, late failures, signals,
leftovers of killed runs, bad -o/--junit targets, a read-only or full disk, no memory.
Whatever happens, inputs and previous outputs survive and the error is one line."""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from psgate import api, cli
from psgate.errors import InputError
from psgate.trace.writer import write_trace
from psgate.workloads.paper import one_touch

from test_cli import assert_one_line_error, psgate

EXP = ["--baseline", "lru", "--candidate", "prefixshield", "--capacity", "16", "--quiet"]
# The big trace's prompts fit 128 blocks, so its replay does real work for seconds (at 16
# blocks every request is rejected and the whole replay is over in one).
BIG = ["--baseline", "lru", "--candidate", "prefixshield", "--capacity", "128", "--quiet"]


def _corpus(d: Path, seeds=(1, 2, 3)) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    for n in seeds:
        proc = psgate("trace", "gen", "random", "--seed", n, "--param", "requests=120",
                      "-o", d / f"t{n}.jsonl")
        assert proc.returncode == 0, proc.stderr
    return d


def _snapshot(d: Path) -> dict[str, bytes]:
    """Every file under ``d`` (psgate's own bookkeeping included) and its bytes."""
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def _leftovers(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir() if p.name.startswith(".psgate"))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return _corpus(tmp_path_factory.mktemp("corp"))


@pytest.fixture(scope="module")
def big_corpus(tmp_path_factory) -> Path:
    """One trace long enough that a replay of it is still running when it is signalled."""
    d = tmp_path_factory.mktemp("big")
    write_trace(d / "big.jsonl", one_touch(attack_requests=2000))
    return d


@pytest.fixture
def finished(tmp_path, corpus) -> Path:
    """A finished experiment, the previous outputs every test below must keep."""
    out = tmp_path / "exp"
    proc = psgate("replay", "--trace", corpus, "--out", out, *EXP)
    assert proc.returncode in (0, 1), proc.stderr
    assert (out / "receipt.json").is_file() and len(list((out / "runs").iterdir())) == 3
    return out


# --force never touches an input ---------------------------------------------------------

def test_force_over_own_input_corpus_keeps_the_corpus(tmp_path, corpus):
    proj = tmp_path / "proj"
    shutil.copytree(corpus, proj / "traces")
    before = _snapshot(proj)
    proc = psgate("replay", "--trace", proj / "traces", "--out", proj, "--force", *EXP)
    assert_one_line_error(proc, 2, "traces", "inside the output directory")
    assert _snapshot(proj) == before
    # the corpus directory itself as --out
    proc = psgate("replay", "--trace", proj / "traces", "--out", proj / "traces", "--force",
                  *EXP)
    assert_one_line_error(proc, 2, "inside the output directory")
    assert _snapshot(proj) == before


def test_force_over_a_directory_holding_the_trace_or_gate_file(tmp_path, corpus):
    out = tmp_path / "o"
    out.mkdir()
    shutil.copy(corpus / "t1.jsonl", out / "t1.jsonl")
    (out / "gate.toml").write_text('[[check]]\nmetric = "hit_fraction"\nop = ">="\n'
                                   'ref = "baseline"\ndelta = -1.0\n')
    before = _snapshot(out)
    proc = psgate("replay", "--trace", out / "t1.jsonl", "--out", out, "--force", *EXP)
    assert_one_line_error(proc, 2, "t1.jsonl", "inside the output directory")
    proc = psgate("replay", "--trace", corpus / "t1.jsonl", "--gate", out / "gate.toml",
                  "--out", out, "--force", *EXP)
    assert_one_line_error(proc, 2, "gate.toml", "inside the output directory")
    assert _snapshot(out) == before


# late failures and signals keep the previous outputs -------------------------------------

def test_late_failure_after_force_keeps_the_old_experiment(tmp_path, corpus, finished):
    bad = tmp_path / "bad"
    bad.mkdir()
    shutil.copy(corpus / "t1.jsonl", bad / "t1.jsonl")
    # valid as a trace, refused by the replay once it reaches the first request
    text = (corpus / "t2.jsonl").read_text().replace('"contract":"standard"', '"contract":"gold"')
    text = text.replace('"contract":"critical"', '"contract":"gold"')
    (bad / "t2.jsonl").write_text(text.replace('"contract":"best-effort"', '"contract":"gold"'))
    before = _snapshot(finished)
    proc = psgate("replay", "--trace", bad, "--out", finished, "--force", *EXP)
    assert_one_line_error(proc, 2, "t2.jsonl", "contract")
    assert _snapshot(finished) == before
    assert _leftovers(finished) == []


def _wait_for(pattern_root: Path, pattern: str, proc: subprocess.Popen) -> None:
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if any(pattern_root.glob(pattern)):
            time.sleep(0.3)
            return
        time.sleep(0.05)
    raise AssertionError(f"never saw {pattern} (exit {proc.poll()})")


@pytest.mark.parametrize("sig,code,word", [(signal.SIGTERM, 143, "terminated"),
                                           (signal.SIGINT, 130, "interrupted")])
def test_signal_during_forced_experiment_keeps_old_outputs(finished, big_corpus, sig, code,
                                                           word):
    before = _snapshot(finished)
    proc = subprocess.Popen([sys.executable, "-m", "psgate.cli", "replay", "--trace",
                             str(big_corpus), "--out", str(finished), "--force", *BIG],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # a run is being written inside the experiment's staging directory
    _wait_for(finished, ".psgate-staging-*/runs/*/.psgate-staging-*/ledger*", proc)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == code, err
    assert f"psgate: {word}" in err and "Traceback" not in err
    assert _snapshot(finished) == before
    assert _leftovers(finished) == []


# leftovers of killed runs ----------------------------------------------------------------

def test_sigkill_leftovers_are_cleaned_by_the_next_run(tmp_path, big_corpus, corpus):
    out = tmp_path / "o"
    proc = subprocess.Popen([sys.executable, "-m", "psgate.cli", "replay", "--trace",
                             str(big_corpus / "big.jsonl"), "--out", str(out), *BIG],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _wait_for(out, ".psgate-staging-*/ledger*", proc)
    proc.kill()
    proc.wait()
    assert any(p.name.startswith(".psgate-staging-") for p in out.iterdir())
    # a stale lock naming a process that is gone, and a second stale staging directory
    (out / ".psgate.lock").write_text(f"pid 999999999 on {socket.gethostname()}\n")
    (out / ".psgate-staging-old").mkdir()
    (out / ".psgate-staging-old" / "ledger.csv").write_text("half")
    proc = psgate("replay", "--trace", corpus / "t1.jsonl", "--out", out, *EXP)
    assert proc.returncode in (0, 1), proc.stderr
    assert (out / "receipt.json").is_file()
    assert _leftovers(out) == []


def test_live_lock_is_a_clear_exit_2_naming_the_holder(tmp_path, corpus):
    out = tmp_path / "o"
    out.mkdir()
    with open(out / ".psgate.lock", "w") as fh:
        fh.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
        fh.flush()
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        proc = psgate("replay", "--trace", corpus / "t1.jsonl", "--out", out, *EXP)
    assert_one_line_error(proc, 2, "another psgate is writing", f"pid {os.getpid()}")
    assert not (out / "receipt.json").exists()


# every single-file writer checks its destination ------------------------------------------

@pytest.fixture(scope="module")
def receipt_dir(tmp_path_factory, corpus) -> Path:
    out = tmp_path_factory.mktemp("r") / "o"
    proc = psgate("replay", "--trace", corpus / "t1.jsonl", "--out", out, *EXP)
    assert proc.returncode in (0, 1), proc.stderr
    return out


WRITERS = {
    "gen": lambda t, c, r: ["trace", "gen", "random", "-o", t],
    "import": lambda t, c, r: ["trace", "import", c / "t1.jsonl", "--format", "mooncake",
                               "-o", t],
    "redact": lambda t, c, r: ["trace", "redact", c / "t1.jsonl", "--unkeyed", "-o", t],
    "report": lambda t, c, r: ["report", r, "-o", t],
}


@pytest.mark.parametrize("command", sorted(WRITERS))
@pytest.mark.parametrize("target", ["directory", "missing parent", "file as parent"])
def test_writer_refuses_a_bad_destination(tmp_path, corpus, receipt_dir, command, target):
    work = tmp_path / "w"
    work.mkdir()
    (work / "f").write_text("x")
    dest = {"directory": work, "missing parent": work / "no" / "x.out",
            "file as parent": work / "f" / "x.out"}[target]
    proc = psgate(*WRITERS[command](dest, corpus, receipt_dir), cwd=tmp_path)
    assert_one_line_error(proc, 2, str(dest))
    assert sorted(p.name for p in work.iterdir()) == ["f"]     # nothing beside it, no temp
    assert not (tmp_path / ".w.tmp").exists() and not (tmp_path / "no").exists()


def test_writer_replaces_whole_or_keeps_the_old_file(tmp_path):
    dest = tmp_path / "t.jsonl"
    dest.write_text("old")

    def failing():
        yield {"psgate_trace": 1, "block_size": 4}
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    with pytest.raises(InputError, match="No space left on device"):
        write_trace(dest, failing())
    assert dest.read_text() == "old"
    write_trace(dest, [{"psgate_trace": 1, "block_size": 4}])
    assert dest.read_text() == '{"psgate_trace":1,"block_size":4}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.jsonl"]


def test_junit_to_missing_directory_is_exit_2_before_anything(tmp_path, corpus):
    out = tmp_path / "o"
    proc = psgate("replay", "--trace", corpus / "t1.jsonl", "--out", out,
                  "--junit", tmp_path / "no" / "j.xml", *EXP)
    assert_one_line_error(proc, 2, "j.xml", "does not exist")
    assert not out.exists()
    proc = psgate("replay", "--trace", corpus, "--out", out, "--junit", tmp_path, *EXP)
    assert_one_line_error(proc, 2, "is a directory")
    assert not out.exists()


# the file system refuses, memory runs out: in process, with the failure injected ----------

@pytest.fixture
def run_main(monkeypatch, capsys):
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

    def run(*args):
        monkeypatch.setattr(sys, "argv", ["psgate", *map(str, args)])
        with pytest.raises(SystemExit) as exc:
            cli.main()
        out, err = capsys.readouterr()
        return exc.value.code, err
    yield run
    for s, h in saved.items():
        signal.signal(s, h)


def _one_line(code, err, want_code, *needles):
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == want_code and len(lines) == 1, (code, err)
    assert lines[0].startswith("psgate: error:") and "Traceback" not in err
    for n in needles:
        assert n in lines[0], lines[0]


def test_read_only_out_is_one_line_and_keeps_old_outputs(monkeypatch, run_main, finished,
                                                        corpus):
    before = _snapshot(finished)
    root = str(finished)
    real_os_open, real_open = os.open, open

    def refuse(path):
        if str(path).startswith(root):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))

    def os_open(path, flags, *a, **k):
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            refuse(path)
        return real_os_open(path, flags, *a, **k)

    def builtin_open(path, mode="r", *a, **k):
        if any(c in mode for c in "wax+"):
            refuse(path)
        return real_open(path, mode, *a, **k)

    monkeypatch.setattr(os, "open", os_open)
    monkeypatch.setattr("builtins.open", builtin_open)
    code, err = run_main("replay", "--trace", corpus, "--out", finished, "--force", *EXP)
    monkeypatch.undo()
    _one_line(code, err, 2, str(finished), "Read-only file system")
    assert _snapshot(finished) == before


def test_full_disk_at_commit_keeps_old_outputs(monkeypatch, run_main, finished, corpus):
    before = _snapshot(finished)

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(os, "fsync", full)
    code, err = run_main("replay", "--trace", corpus, "--out", finished, "--force", *EXP)
    monkeypatch.undo()
    _one_line(code, err, 2, str(finished), "No space left on device")
    assert _snapshot(finished) == before
    assert _leftovers(finished) == []


def test_full_disk_on_a_real_tiny_file_system(tmp_path, corpus):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs",
                                            str(mnt)], capture_output=True).returncode != 0:
        pytest.skip("mounting a tmpfs needs root")
    try:
        proc = psgate("replay", "--trace", corpus / "t1.jsonl", "--out", mnt / "o", *EXP)
        assert_one_line_error(proc, 2, "No space left on device")
        proc = psgate("trace", "gen", "random", "--param", "requests=3000", "-o", mnt / "t")
        assert_one_line_error(proc, 2, "No space left on device")
        assert list(mnt.iterdir()) == []
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


def test_immutable_out_is_one_line(tmp_path, corpus, finished):
    if os.geteuid() != 0 or shutil.which("chattr") is None or subprocess.run(
            ["chattr", "+i", str(finished)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i needs root and a file system that supports it")
    try:
        before = _snapshot(finished)
        proc = psgate("replay", "--trace", corpus, "--out", finished, "--force", *EXP)
        assert_one_line_error(proc, 2, str(finished), "not permitted")
        assert _snapshot(finished) == before
    finally:
        subprocess.run(["chattr", "-i", str(finished)], check=False)


def test_memory_error_is_one_line(monkeypatch, run_main, tmp_path, corpus):
    def exhausted(*a, **k):
        raise MemoryError
    monkeypatch.setattr(api, "_replay_into", exhausted)
    code, err = run_main("replay", "--trace", corpus / "t1.jsonl", "--out", tmp_path / "o",
                         "--capacity", "100000000", "--baseline", "lru", "--candidate", "lru",
                         "--quiet")
    _one_line(code, err, 2, "out of memory")
    assert not (tmp_path / "o").exists()


# an output is never an input (issue 52) -----------------------------------------------------

CI = Path(__file__).resolve().parents[2] / "examples" / "ci"
R = ["replay", "--trace", "t.jsonl", "--baseline", "lru", "--candidate", "prefixshield",
     "--quiet"]


def _bounded(*args, cwd=None, timeout=120):
    """psgate in a subprocess that cannot hang the suite (a FIFO opened for reading blocks
    until a writer comes)."""
    try:
        return subprocess.run([sys.executable, "-m", "psgate.cli", *map(str, args)],
                              capture_output=True, text=True, cwd=cwd, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"psgate {' '.join(map(str, args))} hung") from None


@pytest.fixture
def ci(tmp_path) -> Path:
    """The reproduction's directory: t.jsonl, g.toml and a receipt in o2 (compact ledger)."""
    shutil.copy(CI / "incident.jsonl", tmp_path / "t.jsonl")
    shutil.copy(CI / "gate.toml", tmp_path / "g.toml")
    proc = _bounded(*R, "--out", "o2", cwd=tmp_path)
    assert proc.returncode in (0, 1), proc.stderr
    return tmp_path


FORCED = {
    "junit-trace": (R + ["--out", "o1", "--junit", "t.jsonl"], "--junit", "t.jsonl"),
    "junit-gate": (R + ["--out", "o1", "--gate", "g.toml", "--junit", "g.toml"], "--junit",
                   "g.toml"),
    "junit-own-receipt": (R + ["--out", "o2", "--junit", "o2/receipt.json"], "--junit",
                          "o2/receipt.json"),
    "junit-hard-link": (R + ["--out", "o1", "--junit", "hard.xml"], "--junit", "t.jsonl"),
    "junit-symlink": (R + ["--out", "o1", "--junit", "soft.xml"], "--junit", "t.jsonl"),
    "report-receipt": (["report", "o2", "-o", "o2/receipt.json"], "--output", "receipt"),
    "report-ledger": (["report", "o2", "-o", "o2/ledger.compact.csv.gz"], "--output",
                      "ledger.compact.csv.gz"),
    "convert-receipt": (["ledger", "convert", "o2", "-o", "o2/receipt.json"], "--out",
                        "receipt"),
    "redact-key": (["trace", "redact", "t.jsonl", "--key-file", "k.hex", "-o", "k.hex"],
                   "--output", "--key-file"),
    "diff-receipt": (["diff", "o2", "o2", "--junit", "o2/requests.csv"], "--junit",
                     "requests.csv"),
}


@pytest.mark.parametrize("case", sorted(FORCED))
def test_force_never_replaces_an_input(ci, case):
    args, option, collides = FORCED[case]
    (ci / "k.hex").write_text("ab" * 32 + "\n")
    os.link(ci / "t.jsonl", ci / "hard.xml")
    (ci / "soft.xml").symlink_to("t.jsonl")
    before = _snapshot(ci)
    proc = _bounded(*args, "--force", cwd=ci)
    assert_one_line_error(proc, 2, option, collides)
    assert _snapshot(ci) == before
    assert not (ci / "o1").exists()


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_force_never_replaces_a_fifo_or_a_device(ci, kind):
    if kind == "fifo":
        target = ci / "pipe"
        os.mkfifo(target)
    else:
        # a node of its own for /dev/null's device, never the system's: a regression here
        # must not replace the machine's /dev/null with a JUnit file
        target = ci / "null"
        try:
            os.mknod(target, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        except PermissionError:
            pytest.skip("making a device node needs root (CAP_MKNOD); the FIFO case takes "
                        "the same path through the check for a regular file")
    for args in (R + ["--out", "o1", "--junit", target], ["report", "o2", "-o", target],
                 ["trace", "gen", "random", "-o", target]):
        proc = _bounded(*args, "--force", cwd=ci)
        assert_one_line_error(proc, 2, str(target),
                              "a FIFO" if kind == "fifo" else "a character device")
    assert target.is_fifo() if kind == "fifo" else target.is_char_device()
    assert not (ci / "o1").exists()


def test_planted_lock_symlink_is_refused_not_written_through(ci):
    (ci / "victim.txt").write_text("keep me\n")
    (ci / "o4").mkdir()
    (ci / "o4" / ".psgate.lock").symlink_to("../victim.txt")
    proc = _bounded(*R, "--out", "o4", cwd=ci)
    assert_one_line_error(proc, 2, "o4", ".psgate.lock", "symbolic link")
    assert (ci / "victim.txt").read_text() == "keep me\n"
    assert sorted(p.name for p in (ci / "o4").iterdir()) == [".psgate.lock"]


@pytest.mark.parametrize("command", ["verify", "summary", "explain", "report", "diff"])
def test_fifo_receipt_is_refused_not_read(ci, command):
    (ci / "o6").mkdir()
    os.mkfifo(ci / "o6" / "receipt.json")
    args = {"verify": ["verify", "o6"], "summary": ["summary", "o6"],
            "explain": ["explain", "o6", "--decision", "1"],
            "report": ["report", "o6", "-o", "r.html"], "diff": ["diff", "o2", "o6"]}[command]
    proc = _bounded(*args, cwd=ci, timeout=60)
    assert_one_line_error(proc, 2, "o6/receipt.json", "FIFO")


@pytest.mark.parametrize("option", ["--key-file", "--gate", "--trace", "ledger"])
def test_fifo_inputs_are_refused_not_read(ci, option):
    os.mkfifo(ci / "pipe")
    args = {"--key-file": ["trace", "redact", "t.jsonl", "--key-file", "pipe", "-o", "r.jsonl"],
            "--gate": R + ["--out", "o7", "--gate", "pipe"],
            "--trace": ["replay", "--trace", "pipe", *EXP, "--out", "o7"],
            "ledger": ["ledger", "convert", "pipe", "-o", "l.csv"]}[option]
    proc = _bounded(*args, cwd=ci, timeout=60)
    assert_one_line_error(proc, 2, "pipe", "FIFO" if option.startswith("--") and
                          option != "--trace" else "")


def test_single_replay_with_force_clears_an_old_experiment(finished, corpus):
    assert (finished / "runs").is_dir() and (finished / "runs.csv").is_file()
    proc = psgate("replay", "--trace", corpus / "t1.jsonl", "--out", finished, "--force", *EXP)
    assert proc.returncode in (0, 1), proc.stderr
    names = sorted(p.name for p in finished.iterdir())
    assert names == ["ledger.compact.csv.gz", "receipt.json", "requests.csv"], names


def test_junit_mode_follows_the_umask_like_every_output(tmp_path, corpus):
    proc = subprocess.run(
        [sys.executable, "-m", "psgate.cli", "replay", "--trace", str(corpus / "t1.jsonl"),
         "--out", str(tmp_path / "o"), "--junit", str(tmp_path / "j.xml"), *EXP],
        capture_output=True, text=True, timeout=300, preexec_fn=lambda: os.umask(0o022))
    assert proc.returncode in (0, 1), proc.stderr
    assert (tmp_path / "j.xml").stat().st_mode & 0o777 == 0o644
    assert (tmp_path / "o" / "receipt.json").stat().st_mode & 0o777 == 0o644


def test_full_disk_on_the_junit_file_names_it(monkeypatch, run_main, receipt_dir, tmp_path):
    junit = tmp_path / "j.xml"
    real_replace = os.replace

    def full(src, dst, *a, **k):
        if str(dst) == str(junit):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_replace(src, dst, *a, **k)
    monkeypatch.setattr(os, "replace", full)
    code, err = run_main("diff", receipt_dir, receipt_dir, "--junit", junit)
    monkeypatch.undo()
    last = err.strip().splitlines()[-1]     # after diff's table, which goes first
    assert code == 2 and last.startswith("psgate: error:") and "Traceback" not in err, err
    assert str(junit) in last and "No space left on device" in last, last
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_unwritable_junit_is_refused_before_anything_is_written(monkeypatch, run_main,
                                                                tmp_path, corpus):
    ro = tmp_path / "ro"
    ro.mkdir()
    real_os_open = os.open

    def os_open(path, flags, *a, **k):
        if str(path).startswith(str(ro)) and flags & os.O_CREAT:
            raise OSError(errno.EACCES, os.strerror(errno.EACCES), str(path))
        return real_os_open(path, flags, *a, **k)
    monkeypatch.setattr(os, "open", os_open)
    code, err = run_main("replay", "--trace", corpus / "t1.jsonl", "--out", tmp_path / "o",
                         "--junit", ro / "j.xml", *EXP)
    monkeypatch.undo()
    _one_line(code, err, 2, str(ro / "j.xml"), "Permission denied")
    assert not (tmp_path / "o").exists()
