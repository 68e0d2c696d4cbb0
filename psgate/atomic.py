"""Atomic output: a reader of the output directory sees whole files or none, and a run that
fails or is killed leaves the previous outputs exactly as they were.

Everything a command writes goes into a hidden staging directory inside the output directory
(so the final renames stay on one file system) and is swapped in only when the whole result
is complete: the previous outputs are moved aside, the new ones renamed in (receipt.json
last, since its presence means the files beside it are complete), and the old ones deleted
afterwards. A failure during the swap moves everything back. An interrupt arriving during
the swap waits until it is over.

One writer per directory: ``.psgate.lock`` is locked with flock(2), which the kernel releases
when its holder dies, however it dies; the file records the holder's pid and host for the
message a second writer gets. Whoever holds the lock owns every ``.psgate-staging-*`` there,
so any it finds were left by a writer that was killed, and it removes them.

Single files (``-o``, ``--junit``) are written the same way on a small scale: a temporary
file beside the target, then a rename, after checking that the target can be a file at all.
"""

from __future__ import annotations

import errno
import fcntl
import os
import secrets
import shutil
import signal
import socket
import tempfile
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from psgate.errors import InputError

LOCK_NAME = ".psgate.lock"
STAGING_PREFIX = ".psgate-staging-"
# What a replay replaces in its output directory, and what an experiment replaces.
OUTPUT_FILES = ("receipt.json", "ledger.csv", "ledger.csv.gz", "ledger.compact.csv.gz", "requests.csv")
EXPERIMENT_OUTPUTS = OUTPUT_FILES + ("runs.csv", "runs", "traces")
_REPLACED = ".replaced"      # inside the staging directory: the previous outputs, until done


def _ours(name: str) -> bool:
    """psgate's own bookkeeping in an output directory (ignored when checking emptiness)."""
    return name.startswith(STAGING_PREFIX) or name == LOCK_NAME


def _where(exc: OSError, fallback: Path) -> str:
    return str(exc.filename) if exc.filename is not None else str(fallback)


def check_inputs(out: Path, inputs: Iterable[str | Path | None]) -> None:
    """Refuse an output directory that is, or holds, one of the command's inputs.

    The outputs replace whole entries of the directory (``runs/``, ``traces/``, the
    receipt), so an input kept there could be replaced, moved aside or read half-way
    through the swap; no option makes that safe, so none allows it."""
    target = out.resolve()
    for item in inputs:
        if item is None or str(item).startswith("bundled:"):
            continue
        p = Path(item).resolve()
        if p == target or target in p.parents:
            raise InputError(f"is inside the output directory {out}; psgate replaces what it "
                             f"writes there, so choose another --out", path=str(item))


def prepare_out_dir(out: Path, force: bool, inputs: Iterable[str | Path | None] = ()) -> bool:
    """Check and create the output directory; True when this call created it."""
    if out.exists() and not out.is_dir():
        raise InputError("exists and is not a directory", path=str(out))
    check_inputs(out, inputs)
    if out.exists() and not force:
        visible = [p.name for p in out.iterdir() if not _ours(p.name)]
        if visible:
            raise InputError(f"output directory is not empty ({', '.join(sorted(visible)[:3])}"
                             f"{'...' if len(visible) > 3 else ''}); pass --force to overwrite",
                             path=str(out))
    created = not out.exists()
    try:
        out.mkdir(parents=True, exist_ok=True)
        return created
    except OSError as exc:
        raise InputError(f"cannot create output directory: {exc.strerror}",
                         path=_where(exc, out)) from None


@contextmanager
def _signals_deferred() -> Iterator[None]:
    """SIGINT and SIGTERM wait until the block is over, then take effect as usual.

    A swap stopped half-way would leave some old and some new outputs side by side;
    delivering the signal afterwards keeps its meaning without that risk. Handlers can
    only be changed from the main thread; elsewhere the block runs unprotected."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    for s in saved:
        signal.signal(s, lambda signum, frame: pending.append(signum))
    try:
        yield
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)
        for s in dict.fromkeys(pending):
            signal.raise_signal(s)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _lock_holder(fd: int) -> str:
    try:
        return os.pread(fd, 200, 0).decode(errors="replace").strip()
    except OSError:
        return ""


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class StagedOutput:
    """``with StagedOutput(out) as st: write into st.path('ledger.csv')...; st.commit()``

    ``replaces``: the entries of ``out`` that the new outputs supersede; each is removed on
    commit whether or not this run writes it again (an old ledger in the other format, an
    old experiment's runs), and restored if the commit fails."""

    def __init__(self, out: Path, replaces: Iterable[str] = OUTPUT_FILES) -> None:
        self.out = Path(out)
        self.replaces = tuple(replaces)
        self._committed = False
        self._lock_fd = self._acquire()
        try:
            self._remove_stale()
            self.staging = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=self.out))
        except OSError as exc:
            self._release()
            raise InputError(f"cannot write here: {exc.strerror}", path=str(self.out)) from None

    def _acquire(self) -> int:
        path = self.out / LOCK_NAME
        while True:
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            except OSError as exc:
                raise InputError(f"cannot write here: {exc.strerror}",
                                 path=str(self.out)) from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _lock_holder(fd)
                os.close(fd)
                raise InputError("another psgate is writing to this output directory"
                                 + (f" ({holder})" if holder else ""),
                                 path=str(self.out)) from None
            except OSError:     # a file system without flock: fall back on the recorded pid
                self._check_recorded_holder(fd)
            try:
                same = os.fstat(fd).st_ino == os.stat(path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)    # its previous holder removed it on the way out: lock the new one
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
        return fd

    def _check_recorded_holder(self, fd: int) -> None:
        holder = _lock_holder(fd).split()
        if len(holder) == 4 and holder[0] == "pid" and holder[1].isdigit():
            pid, host = int(holder[1]), holder[3]
            if host == socket.gethostname() and pid != os.getpid() and _pid_alive(pid):
                os.close(fd)
                raise InputError(f"another psgate is writing to this output directory "
                                 f"(pid {pid} on {host})", path=str(self.out))

    def _remove_stale(self) -> None:
        """Staging directories of writers killed before they could clean up."""
        for p in self.out.iterdir():
            if p.name.startswith(STAGING_PREFIX) and p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)

    def path(self, name: str) -> Path:
        return self.staging / name

    def commit(self) -> None:
        # Hidden names in the staging directory are scratch space, never outputs.
        names = sorted(p.name for p in self.staging.iterdir() if not p.name.startswith("."))
        for name in names:
            if (self.staging / name).is_file():
                _fsync(self.staging / name)
        names.sort(key=lambda n: n == "receipt.json")
        aside = self.staging / _REPLACED
        aside.mkdir()
        done: list[tuple[Path, Path]] = []
        with _signals_deferred():
            try:
                # The old receipt goes first: no moment has it beside new ledgers.
                old = sorted(set(self.replaces) | set(names),
                             key=lambda n: (n != "receipt.json", n))
                for name in old:
                    if os.path.lexists(self.out / name):
                        os.rename(self.out / name, aside / name)
                        done.append((self.out / name, aside / name))
                for name in names:
                    os.rename(self.staging / name, self.out / name)
                    done.append((self.staging / name, self.out / name))
                _fsync(self.out)
            except BaseException:
                for src, dst in reversed(done):
                    try:
                        os.rename(dst, src)
                    except OSError:
                        pass
                raise
        self._committed = True

    def _release(self) -> None:
        try:
            (self.out / LOCK_NAME).unlink(missing_ok=True)
        except OSError:
            pass
        os.close(self._lock_fd)

    def __enter__(self) -> "StagedOutput":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        shutil.rmtree(self.staging, ignore_errors=True)
        self._release()
        if isinstance(exc, OSError) and exc.filename is None and exc.errno is not None:
            # A failed write() or fsync() names no file: name the directory instead.
            raise InputError(f"cannot write the outputs: {exc.strerror}",
                             path=str(_outermost(self.out))) from None


def _outermost(out: Path) -> Path:
    """The directory a user named: a run staged inside an experiment's staging directory
    reports the experiment's output directory, not the hidden path it was built in."""
    parts = out.parts
    for i, part in enumerate(parts):
        if part.startswith(STAGING_PREFIX):
            return Path(*parts[:i]) if i else out
    return out


def check_destination(path: str | Path) -> Path:
    """A file about to be written: refuse, before any work, a directory or a missing or
    non-directory parent (a rename would fail late, or write somewhere unexpected)."""
    path = Path(path)
    if path.is_dir():
        raise InputError("is a directory; expected the path of a file to write", path=str(path))
    parent = path.parent
    if not parent.exists():
        raise InputError(f"directory '{parent}' does not exist", path=str(path))
    if not parent.is_dir():
        raise InputError(f"'{parent}' is not a directory", path=str(path))
    return path


@contextmanager
def atomic_file(path: str | Path) -> Iterator[BinaryIO]:
    """``with atomic_file(p) as fh: fh.write(...)``: ``p`` appears whole when the block
    ends, or not at all (a previous ``p`` is kept) when it raises."""
    path = check_destination(path)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
    except OSError as exc:
        raise InputError(f"cannot write here: {exc.strerror}", path=str(path)) from None
    try:
        with os.fdopen(fd, "wb") as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.errno is not None and (
                exc.filename is None or exc.errno == errno.EISDIR):
            raise InputError(f"cannot write: {exc.strerror}", path=str(path)) from None
        raise


def write_atomic(path: str | Path, data: bytes) -> None:
    with atomic_file(path) as fh:
        fh.write(data)
