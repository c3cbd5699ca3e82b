"""Filesystem primitives that never overwrite, never follow symlinks and never escape a root."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import secrets
import stat
from pathlib import Path

from xconf.errors import ArtifactError
from xconf.schema import is_safe_id

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


_FULL = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)


def io_error(exc: OSError, path: Path) -> ArtifactError:
    """A coded error for a failed write: ``artifacts.disk_full`` or ``artifacts.io``."""
    code = "artifacts.disk_full" if exc.errno in _FULL else "artifacts.io"
    return ArtifactError(code, f"cannot write {path}: {exc}", str(path))


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    fd = os.open(path, os.O_RDONLY | _NOFOLLOW)
    with os.fdopen(fd, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_regular(path: Path) -> bytes | None:
    """The bytes of a regular file, None if absent; a symlink or non-file is an error."""
    try:
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ArtifactError(
                "artifacts.symlink", f"{path} is a symlink and is never followed", str(path)
            ) from exc
        raise ArtifactError("artifacts.io", f"cannot read {path}: {exc}", str(path)) from exc
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise ArtifactError("artifacts.not_a_file", f"{path} is not a regular file", str(path))
        return handle.read()


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def check_id(value: str, what: str) -> str:
    if not is_safe_id(value):
        raise ArtifactError("artifacts.unsafe_id", f"unsafe {what} {value!r}", what)
    return value


def ensure_real_dir(root: Path, *parts: str) -> Path:
    """Create ``root/parts...`` one level at a time, refusing symlinks at every level."""
    current = root
    if current.is_symlink():
        raise ArtifactError("artifacts.symlink", f"{current} is a symlink", str(current))
    try:
        current.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise io_error(exc, current) from exc
    for part in parts:
        check_id(part, "path component")
        current = current / part
        try:
            os.mkdir(current)
        except FileExistsError:
            pass
        except OSError as exc:
            raise io_error(exc, current) from exc
        if current.is_symlink() or not current.is_dir():
            raise ArtifactError(
                "artifacts.not_a_directory", f"{current} is not a real directory", str(current)
            )
    return current


def publish_bytes(directory: Path, name: str, data: bytes, *, staging: Path | None = None) -> str:
    """Write ``data`` as ``directory/name`` atomically; fail if the name exists. Returns sha256.

    The temporary file lives in ``staging`` (same filesystem) when given, so that a crash
    between the link and the unlink never leaves a stray entry inside ``directory``: a sealed
    attempt directory then holds exactly its payloads and ``COMPLETE``.
    """
    final = directory / name
    if staging is None:
        tmp = directory / f".{name}.tmp-{secrets.token_hex(6)}"
    else:
        tmp = staging / f".{directory.name}.{name}.tmp-{secrets.token_hex(6)}"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o644)
    except OSError as exc:
        raise io_error(exc, final) from exc
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        try:
            os.link(tmp, final)  # link, unlike rename, refuses to replace an existing file
        except FileExistsError as exc:
            raise ArtifactError(
                "artifacts.exists", f"{final} exists and is never overwritten", str(final)
            ) from exc
    except OSError as exc:
        if isinstance(exc, ArtifactError):
            raise
        raise io_error(exc, final) from exc
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    fsync_dir(directory)
    return hashlib.sha256(data).hexdigest()


def append_line(path: Path, line: bytes) -> None:
    """Append one line (durably); a torn earlier line is terminated first."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND | _NOFOLLOW, 0o644)
        try:
            size = os.fstat(fd).st_size
            if size:
                os.lseek(fd, size - 1, os.SEEK_SET)
                if os.read(fd, 1) != b"\n":
                    line = b"\n" + line
            pending = memoryview(line + b"\n")
            while pending:  # a short write (file-size limit, full disk) is not a success
                pending = pending[os.write(fd, pending) :]
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        raise io_error(exc, path) from exc


def allocate_attempt_dir(case_dir: Path) -> tuple[str, Path]:
    """Atomic ``mkdir`` allocation: two runners can never publish into one attempt."""
    existing = [
        int(p.name[2:])
        for p in case_dir.iterdir()
        if p.name.startswith("a-") and p.name[2:].isdigit()
    ]
    number = max(existing, default=0) + 1
    while True:
        attempt_id = f"a-{number:04d}"
        path = case_dir / attempt_id
        try:
            os.mkdir(path)
        except FileExistsError:
            number += 1
            continue
        except OSError as exc:
            raise io_error(exc, path) from exc
        fsync_dir(case_dir)
        return attempt_id, path
