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
so any it finds were left by a writer that was killed, and it removes them. The lock is
opened without following a symbolic link: one planted there would have psgate write its pid
into whatever file the link names.

Single files (``-o``, ``--junit``) are written the same way on a small scale: a temporary
file beside the target, then a rename, after checking that the target can be a file at all.
An output never replaces an input (:func:`check_output`): ``--force`` is permission to
replace a previous output, and a trace, gate file or receipt named as ``-o`` by mistake is
not one.
"""

from __future__ import annotations

import errno
import fcntl
import os
import secrets
import shutil
import signal
import socket
import stat
import tempfile
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

import orjson

from psgate.errors import InputError
from psgate.inputs import file_kind, read_input

LOCK_NAME = ".psgate.lock"
STAGING_PREFIX = ".psgate-staging-"
# What a replay writes in its output directory, and what an experiment writes. Either
# replaces all of EXPERIMENT_OUTPUTS: a replay over an experiment's directory must not
# leave the old runs beside a receipt that does not name them.
OUTPUT_FILES = ("receipt.json", "ledger.csv", "ledger.csv.gz", "ledger.compact.csv.gz", "requests.csv")
EXPERIMENT_OUTPUTS = OUTPUT_FILES + ("runs.csv", "runs", "traces")
_REPLACED = ".replaced"      # inside the staging directory: the previous outputs, until done


def _ours(name: str) -> bool:
    """psgate's own bookkeeping in an output directory (ignored when checking emptiness)."""
    return name.startswith(STAGING_PREFIX) or name == LOCK_NAME


def _where(exc: OSError, fallback: Path) -> str:
    return str(exc.filename) if exc.filename is not None else str(fallback)


def _resolved(path: Path, option: str) -> Path:
    """``path.resolve()``; a symbolic link loop (RuntimeError before Python 3.13, OSError
    ELOOP after) is bad input naming the path, not a crash."""
    try:
        return path.resolve()
    except (RuntimeError, OSError) as exc:
        if isinstance(exc, OSError) and exc.errno != errno.ELOOP:
            raise
        raise InputError(f"is a symbolic link loop; name another {option}",
                         path=str(path)) from None


def check_inputs(out: Path, inputs: Iterable[str | Path | None]) -> None:
    """Refuse an output directory that is, or holds, one of the command's inputs.

    The outputs replace whole entries of the directory (``runs/``, ``traces/``, the
    receipt), so an input kept there could be replaced, moved aside or read half-way
    through the swap; no option makes that safe, so none allows it."""
    target = _resolved(out, "--out")
    for item in inputs:
        if item is None or str(item).startswith("bundled:"):
            continue
        p = _resolved(Path(item), "the path")
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

    def __init__(self, out: Path, replaces: Iterable[str] = EXPERIMENT_OUTPUTS) -> None:
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
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
                             | os.O_NONBLOCK, 0o644)
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    raise InputError(f"{LOCK_NAME} is a symbolic link; psgate's lock is a "
                                     f"file it creates itself (remove the link)",
                                     path=str(self.out)) from None
                raise InputError(f"cannot write here: {exc.strerror}",
                                 path=str(self.out)) from None
            mode = os.fstat(fd).st_mode
            if not stat.S_ISREG(mode):
                os.close(fd)
                raise InputError(f"{LOCK_NAME} is {file_kind(mode)}; psgate's lock is a "
                                 f"regular file it creates itself (remove it)",
                                 path=str(self.out))
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


def check_destination(path: str | Path, option: str | None = None) -> Path:
    """A file about to be written: refuse, before any work, a directory or a missing or
    non-directory parent (a rename would fail late, or write somewhere unexpected), and
    anything else that is not a regular file (a rename would replace a FIFO or a device
    node with a file)."""
    path = Path(path)
    named = f"{option} " if option else ""
    if path.is_dir():
        raise InputError(f"{named}is a directory; expected the path of a file to write",
                         path=str(path))
    try:
        mode = os.stat(path).st_mode
    except OSError:
        mode = None         # absent, or a dangling link the rename replaces
    if mode is not None and not stat.S_ISREG(mode):
        raise InputError(f"{named}is {file_kind(mode)}; expected a regular file or a new "
                         f"path to write", path=str(path))
    parent = path.parent
    if not parent.exists():
        raise InputError(f"directory '{parent}' does not exist", path=str(path))
    if not parent.is_dir():
        raise InputError(f"'{parent}' is not a directory", path=str(path))
    return path


Input = tuple[str, "str | Path | None"]


def check_output(path: str | Path, option: str, *, inputs: Iterable[Input] = (),
                 receipts: Iterable[str | Path | None] = (), out_dir: Path | None = None
                 ) -> Path:
    """Every single-file writer's check, before any work: :func:`check_destination`, then
    refuse, with or without ``--force``, a path that is (after links, or as a hard link) one
    of the command's inputs, then make sure the directory takes a new file.

    ``inputs``: (what, path) of the files the command reads; a directory stands for every
    file under it (a corpus). ``receipts``: receipt directories it reads: their receipt.json,
    recorded outputs, runs and traces. ``out_dir``: the directory it writes: the names psgate
    writes there (a --junit written after the receipt would replace it)."""
    path = check_destination(path, option)
    target = os.path.realpath(path)
    for what, item in _protected(inputs, receipts, out_dir):
        if os.path.realpath(item) == target or _same_file(path, item):
            raise InputError(f"{option} is {what}, which no output replaces, with or "
                             f"without --force: name another {option}", path=str(path))
    if out_dir is not None:
        for sub in ("runs", "traces"):
            if target.startswith(os.path.realpath(out_dir / sub) + os.sep):
                raise InputError(f"{option} is inside {out_dir / sub}, which this command "
                                 f"replaces: name another {option}", path=str(path))
    _probe(path)
    return path


def _same_file(a: Path, b: str | Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError):
        return False


def _protected(inputs: Iterable[Input], receipts: Iterable[str | Path | None],
               out_dir: Path | None) -> Iterator[tuple[str, str | Path]]:
    for what, item in inputs:
        if item is None or str(item).startswith("bundled:"):
            continue
        if os.path.isdir(item):
            for root, _, files in os.walk(item):
                for f in files:
                    yield f"{what} {item} (its file {f})", os.path.join(root, f)
        else:
            yield f"{what} {item}", item
    for d in receipts:
        if d is None:
            continue
        d = Path(d)
        if not d.is_dir():
            d = d.parent            # a receipt.json named directly
        yield f"the receipt {d / 'receipt.json'} this command reads", d / "receipt.json"
        for name in _recorded_outputs(d):
            yield f"the receipt's {name} ({d}) this command reads", d / name
        for sub in ("runs", "traces"):
            for root, _, files in os.walk(d / sub):
                for f in files:
                    p = Path(root, f)
                    yield f"the receipt's {p.relative_to(d)} ({d})", p
    if out_dir is not None:
        for name in EXPERIMENT_OUTPUTS:
            yield f"{out_dir / name}, an output of this command", out_dir / name


def _recorded_outputs(d: Path) -> Iterable[str]:
    """The outputs a receipt records, or every name psgate writes when it cannot be read
    (the command will say why; the check must not be weaker for it)."""
    if not os.path.lexists(d / "receipt.json"):
        return ()
    try:
        doc = orjson.loads(read_input(d / "receipt.json", "receipt file"))
        return [n for n in doc["outputs"] if isinstance(n, str)] + ["runs.csv"]
    except Exception:       # any failure here: protect every name instead
        return EXPERIMENT_OUTPUTS


def _probe(path: Path) -> None:
    """A file the directory refuses (read-only, no permission) is bad input now, before
    any work, not after the receipt was written."""
    probe = path.with_name(f".{path.name}.{secrets.token_hex(4)}.probe")
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600)
    except OSError as exc:
        raise InputError(f"cannot write here: {exc.strerror}", path=str(path)) from None
    os.close(fd)
    os.unlink(probe)


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
