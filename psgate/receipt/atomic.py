"""Atomic output: a reader of the output directory sees whole files or none.

Every file is written into a hidden staging directory inside the output
directory and renamed into place only when the whole receipt is complete, so
a crash, a kill or a bad input never leaves a half-written receipt or ledger
under its real name. The staging directory is removed on failure; after a
SIGKILL it may remain as ``.psgate-staging-*``, which nothing reads.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from pathlib import Path

from psgate.errors import InputError

OUTPUT_FILES = ("receipt.json", "ledger.csv", "ledger.csv.gz", "requests.csv")
LOCK_NAME = ".psgate.lock"


def _ours(name: str) -> bool:
    """psgate's own bookkeeping in an output directory (ignored when checking emptiness)."""
    return name.startswith(".psgate-staging-") or name == LOCK_NAME


def prepare_out_dir(out: Path, force: bool) -> bool:
    """Check and create the output directory; True when this call created it."""
    if out.exists() and not out.is_dir():
        raise InputError("exists and is not a directory", path=str(out))
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
                         path=str(out)) from None


class StagedOutput:
    """``with StagedOutput(out) as st: open(st.path('ledger.csv'), 'w')...; st.commit()``"""

    def __init__(self, out: Path) -> None:
        self.out = out
        # One writer per directory: a second replay into it refuses instead of racing.
        self._lock = open(out / LOCK_NAME, "a")
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock.close()
            raise InputError("another psgate is writing to this output directory",
                             path=str(out)) from None
        self.staging = Path(tempfile.mkdtemp(prefix=".psgate-staging-", dir=out))
        self._committed = False

    def path(self, name: str) -> Path:
        return self.staging / name

    def commit(self) -> None:
        for p in sorted(self.staging.iterdir()):
            with open(p, "rb") as fh:
                os.fsync(fh.fileno())
        # receipt.json last: its presence means the ledgers beside it are complete.
        names = sorted(p.name for p in self.staging.iterdir())
        names.sort(key=lambda n: n == "receipt.json")
        stale = self.out / "receipt.json"
        if stale.exists():
            stale.unlink()      # never leave an old receipt beside new ledgers
        for name in OUTPUT_FILES:   # nor an old ledger in the other format (--force)
            if name not in names:
                (self.out / name).unlink(missing_ok=True)
        for name in names:
            os.replace(self.staging / name, self.out / name)
        self._committed = True

    def __enter__(self) -> "StagedOutput":
        return self

    def __exit__(self, *exc) -> None:
        shutil.rmtree(self.staging, ignore_errors=True)
        (self.out / LOCK_NAME).unlink(missing_ok=True)
        self._lock.close()
