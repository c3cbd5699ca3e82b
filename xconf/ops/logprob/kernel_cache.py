"""What the native kernel cache may load: a library whose bytes match the digest recorded
when it was built, from a directory only this user can write.

Beside each library ``<name>.so`` its SHA-256 is recorded in ``<name>.so.sha256`` (written
by :func:`publish_text`, a rename). :func:`open_recorded` returns a descriptor on a
library only when its bytes, read from that descriptor, match the record; the caller
loads it while the descriptor is open and the name is still that file. Whoever can write
the directory could plant a library and a matching record together, so
:func:`unsafe_cache_dir` refuses a directory not owned by this user or writable by group or
others.
"""

from __future__ import annotations

import hashlib
import os
import stat
import tempfile
from pathlib import Path

from xconf.artifacts.layout import read_regular
from xconf.errors import XconfError

DIGEST_SUFFIX = ".sha256"


def record_path(path: Path) -> Path:
    return path.with_name(path.name + DIGEST_SUFFIX)


def publish_text(directory: Path, target: Path, text: str) -> None:
    handle, temp = tempfile.mkstemp(dir=directory, prefix=".record-")
    try:
        with os.fdopen(handle, "w") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temp, target)
    finally:
        if os.path.exists(temp):
            os.unlink(temp)


def unsafe_cache_dir(directory: Path) -> str | None:
    """Why ``directory`` may not hold libraries this process loads, or None when it may.

    It is created ``0700`` when missing; an existing one must be a directory (a link to
    one is resolved) owned by this user and writable by neither group nor others.
    """
    try:
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        info = directory.stat()
    except OSError as exc:
        return f"cannot use the kernel cache {directory}: {exc}"
    if not stat.S_ISDIR(info.st_mode):
        return f"the kernel cache {directory} is not a directory"
    if info.st_uid != os.getuid():
        return f"the kernel cache {directory} is owned by uid {info.st_uid}, not this user"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return (
            f"the kernel cache {directory} is writable by others (mode "
            f"{stat.S_IMODE(info.st_mode):o}): refused, make it 0700 or point "
            "XCONF_KERNEL_CACHE at a private directory"
        )
    return None


def open_recorded(path: Path) -> int | str:
    """An open descriptor on ``path`` whose bytes match its recorded digest, or why not
    (``"missing"`` when there is no library yet)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return "missing"
    except OSError as exc:
        return f"cannot open it ({exc.strerror})"
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise _Refused("not a regular file")
        if info.st_size == 0:
            raise _Refused("it is empty")
        try:
            # A bounded regular file, never a link or a FIFO (a read that would block).
            record = read_regular(record_path(path), limit=256)
            recorded = (record or b"").decode("ascii").strip()
        except (OSError, UnicodeDecodeError, XconfError):
            recorded = ""
        if not recorded:
            raise _Refused("no digest of the build is recorded beside it")
        digest = hashlib.sha256()
        with os.fdopen(os.dup(fd), "rb") as stream:
            for block in iter(lambda: stream.read(1 << 20), b""):
                digest.update(block)
        if digest.hexdigest() != recorded:
            raise _Refused("its bytes do not match the digest recorded when it was built")
    except _Refused as refused:
        os.close(fd)
        return str(refused)
    except OSError as exc:
        os.close(fd)
        return f"cannot read it ({exc.strerror})"
    return fd


class _Refused(Exception):
    pass
