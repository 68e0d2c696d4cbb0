"""Inputs that must be regular files: every trace, receipt, ledger, gate, key and
cost-model file a command reads is opened through :func:`open_input`.

Opening a FIFO for reading blocks until something writes to it, so a FIFO planted as
``receipt.json`` or named as ``--key-file`` would hang a command for ever; a device node
reads without end (``/dev/zero``) or with side effects. Neither is a file psgate could
have written or been given, so both are refused before the first byte is read, as one
line naming the file. The file is looked at with stat(2) before it is opened and opened
with ``O_NONBLOCK``, then checked again on the open descriptor: a FIFO swapped in
between the two cannot block the open either.

Directories and missing files are left to the caller's own messages: they raise
IsADirectoryError and FileNotFoundError as ``open`` does.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from pathlib import Path
from typing import BinaryIO

from psgate.errors import InputError


def file_kind(mode: int) -> str:
    """What a non-regular file is, in words for an error message."""
    for test, words in ((stat.S_ISFIFO, "a FIFO (named pipe)"),
                        (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                        (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory")):
        if test(mode):
            return words
    return "not a regular file"


def _refuse(mode: int, path: str | Path, what: str) -> InputError:
    return InputError(f"is {file_kind(mode)}; expected a regular {what}", path=str(path))


def require_regular(path: str | Path, what: str = "file") -> None:
    """Refuse ``path`` if it exists and is neither a regular file nor a directory."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return          # the open that follows reports it as it always did
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        raise _refuse(mode, path, what)


def open_input(path: str | Path, what: str = "file") -> BinaryIO:
    """``open(path, "rb")`` for a file that must be regular (see the module's docstring)."""
    require_regular(path, what)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
        if not stat.S_ISREG(mode):
            raise _refuse(mode, path, what)
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "rb")


def read_input(path: str | Path, what: str = "file") -> bytes:
    with open_input(path, what) as fh:
        return fh.read()


def read_capped(path: str | Path, what: str, cap: int) -> bytes:
    """:func:`read_input` for a small file (a gate, key or cost-model file) that has a size
    cap: one that is larger, or that grows while it is read, is refused naming the cap,
    before it can fill memory. The size is taken from the open descriptor and at most
    ``cap + 1`` bytes are read, so a file that claims one size and holds more is caught."""
    with open_input(path, what) as fh:
        size = os.fstat(fh.fileno()).st_size
        data = b"" if size > cap else fh.read(cap + 1)
    if size > cap:
        raise InputError(f"is {size} bytes; a {what} may hold at most {cap} bytes",
                         path=str(path))
    if len(data) > cap:
        raise InputError(f"holds more than {cap} bytes (it grew while it was read); a {what} "
                         f"may hold at most {cap} bytes", path=str(path))
    return data
