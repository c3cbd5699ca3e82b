"""The one atomic writer: never overwrites by accident, never follows a link, never escapes.

Every write happens relative to an open directory descriptor (:class:`Dir`): each level of
a path is opened with ``O_DIRECTORY | O_NOFOLLOW`` relative to the level above, and files
are created ``O_EXCL | O_NOFOLLOW`` with ``dir_fd=``. A path is resolved once, when its
directory is opened; swapping a directory for a symlink afterwards redirects nothing (the
descriptor still names the real directory), and swapping it before the open is refused.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from xconf.artifacts.layout import (
    StreamDigest,
    attempt_name,
    attempt_number,
    owned_privately,
    sha256_file,
)
from xconf.errors import ArtifactError
from xconf.experiment import is_safe_id

__all__ = ["Dir", "sha256_file"]  # sha256_file: re-exported, owned by layout

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | _NOFOLLOW | _CLOEXEC
_FULL = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)


@dataclass(frozen=True)
class Dir:
    """An open directory: ``fd`` is what writes use, ``path`` only names it in messages."""

    fd: int
    path: Path

    def close(self) -> None:
        os.close(self.fd)


def io_error(exc: OSError, path: Path) -> ArtifactError:
    """A coded error for a failed write: ``artifacts.disk_full`` or ``artifacts.io``."""
    code = "artifacts.disk_full" if exc.errno in _FULL else "artifacts.io"
    return ArtifactError(code, f"cannot write {path}: {exc.strerror or exc}", str(path))


def check_id(value: str, what: str) -> str:
    if not is_safe_id(value):
        raise ArtifactError("artifacts.unsafe_id", f"unsafe {what} {value!r}", what)
    return value


def _open_child(parent: Dir, name: str, *, create: bool) -> Dir:
    path = parent.path / name
    if create:
        try:
            os.mkdir(name, 0o755, dir_fd=parent.fd)
        except FileExistsError:
            pass
        except OSError as exc:
            raise io_error(exc, path) from None
    try:
        return Dir(os.open(name, _DIR_FLAGS, dir_fd=parent.fd), path)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise ArtifactError(
                "artifacts.not_a_directory", f"{path} is not a real directory", str(path)
            ) from None
        raise io_error(exc, path) from None


def open_root(root: Path, *, create: bool = True, follow: bool = False) -> Dir:
    """The directory ``root`` (created if asked), resolved once, here.

    Its last component must not be a symlink unless ``follow`` (a user-chosen output
    directory); everything below it is then reached relative to the returned descriptor.
    """
    flags = _DIR_FLAGS & ~_NOFOLLOW if follow else _DIR_FLAGS
    try:
        if create:
            root.mkdir(parents=True, exist_ok=True)
        return Dir(os.open(root, flags), root)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.EEXIST):
            message = f"{root} is not a real directory"
            raise ArtifactError("artifacts.symlink", message, str(root)) from None
        raise io_error(exc, root) from None


@contextlib.contextmanager
def real_dir(root: Path, *parts: str, create: bool = True) -> Iterator[Dir]:
    """``root/parts...`` opened one level at a time, refusing a symlink at every level."""
    current = open_root(root, create=create)
    try:
        for part in parts:
            check_id(part, "path component")
            child = _open_child(current, part, create=create)
            current.close()
            current = child
        yield current
    finally:
        current.close()


def ensure_real_dir(root: Path, *parts: str) -> Path:
    """Create ``root/parts...`` one level at a time, refusing symlinks at every level."""
    with real_dir(root, *parts) as directory:
        return directory.path


def _as_dir(directory: Dir | Path) -> tuple[Dir, bool]:
    """``directory`` as an open Dir, and whether the caller must close it."""
    if isinstance(directory, Dir):
        return directory, False
    return open_root(directory, create=False), True


Parts = tuple[bytes | bytearray | memoryview, ...]  # a file as its consecutive pieces
CHUNK = 16 << 20  # bytes hashed and written at a time: the digest reads them while cached


def publish_bytes(
    directory: Dir | Path,
    name: str,
    data: bytes | Parts,
    *,
    staging: Dir | Path | None = None,
    replace: bool = False,
) -> str:
    """Write ``data`` as ``directory/name`` atomically and durably; returns its sha256.

    ``data`` may be the file's consecutive parts (a header and views of tensor memory): they
    are written and digested in place, so a large payload is never joined into one copy.

    The bytes go to a fresh temporary file (``O_EXCL | O_NOFOLLOW``) in ``staging`` (same
    filesystem) or ``directory``, are fsynced, then linked into place: ``link`` refuses an
    existing name (``artifacts.exists``) unless ``replace``, when ``rename`` swaps the entry
    itself (a symlink planted there is replaced, never followed). A temporary in
    ``staging`` means a crash between the link and the unlink never leaves a stray entry
    inside ``directory``: a sealed attempt holds exactly its payloads and ``COMPLETE``.
    """
    target, close_target = _as_dir(directory)
    try:
        stage, close_stage = (target, False) if staging is None else _as_dir(staging)
    except BaseException:
        if close_target:
            target.close()
        raise
    final = target.path / name
    prefix = f".{name}" if staging is None else f".{target.path.name}.{name}"
    tmp = f"{prefix}.tmp-{secrets.token_hex(6)}"
    try:
        try:
            fd = os.open(
                tmp,
                os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC,
                0o644,
                dir_fd=stage.fd,
            )
        except OSError as exc:
            raise io_error(exc, final) from None
        try:
            try:
                parts = (data,) if isinstance(data, bytes | bytearray | memoryview) else data
                digest = _write_parts(fd, parts)
                os.fsync(fd)
            finally:
                os.close(fd)
            if replace:
                os.rename(tmp, name, src_dir_fd=stage.fd, dst_dir_fd=target.fd)
            else:
                try:  # link, unlike rename, refuses to replace an existing file
                    os.link(
                        tmp, name, src_dir_fd=stage.fd, dst_dir_fd=target.fd, follow_symlinks=False
                    )
                except FileExistsError:
                    raise ArtifactError(
                        "artifacts.exists", f"{final} exists and is never overwritten", str(final)
                    ) from None
        except OSError as exc:
            raise io_error(exc, final) from None
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp, dir_fd=stage.fd)
        try:
            os.fsync(target.fd)
        except OSError as exc:
            raise io_error(exc, final) from None
    finally:
        if close_stage:
            stage.close()
        if close_target:
            target.close()
    return digest


def _write_parts(fd: int, parts: Parts) -> str:
    """Write every part in order (a short write is not a success); the SHA-256 of them all,
    each chunk hashed while it is written."""
    with StreamDigest() as digest:
        for part in parts:
            view = memoryview(part).cast("B")
            for start in range(0, len(view), CHUNK):
                pending = view[start : start + CHUNK]
                digest.update(pending)
                while pending:  # a short write (file-size limit, full disk) is not a success
                    pending = pending[os.write(fd, pending) :]
        return digest.hexdigest()


def write_file(path: Path, data: bytes) -> None:
    """Replace ``path`` atomically and durably; its directory is created if needed.

    For derived files that are rewritten (report.html, launch.json, caches): the parent is
    resolved once, when it is opened; the write is relative to that descriptor and swaps
    the entry itself, so a symlink planted at ``path`` is replaced, never written through.
    """
    directory = open_root(path.parent, create=True, follow=True)
    try:
        publish_bytes(directory, path.name, data, replace=True)
    finally:
        directory.close()


def write_cache_entry(path: Path, data: bytes) -> bool:
    """Write a cache entry (``write_file``) into a directory that is the user's own, created
    ``0700`` when missing; False, and nothing written, when the directory is another's or
    writable by others (its entries would never be believed:
    :func:`~xconf.artifacts.layout.read_cache_entry`) or cannot be written (a read-only
    cache, a full disk): an unusable cache costs time, never correctness."""
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not owned_privately(os.stat(path.parent)):
            return False
        write_file(path, data)
    except (OSError, ArtifactError):
        return False
    return True


def _open_append(target: Dir, name: str, *, readable: bool, replace_link: bool) -> int:
    """``name`` in ``target`` opened for appending (created if missing), never through a
    link: a symlink there is an error, or with ``replace_link`` is replaced by a real file."""
    access = os.O_RDWR if readable else os.O_WRONLY
    flags = access | os.O_CREAT | os.O_APPEND | _NOFOLLOW | _CLOEXEC
    try:
        return os.open(name, flags, 0o644, dir_fd=target.fd)
    except OSError as exc:
        if not replace_link or exc.errno != errno.ELOOP:
            raise
    os.unlink(name, dir_fd=target.fd)
    return os.open(name, flags | os.O_EXCL, 0o644, dir_fd=target.fd)


def append_line(directory: Dir | Path, name: str, line: bytes) -> None:
    """Append one line to ``directory/name`` (durably); a torn earlier line is ended first."""
    target, close_target = _as_dir(directory)
    path = target.path / name
    try:
        fd = _open_append(target, name, readable=True, replace_link=False)
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
        raise io_error(exc, path) from None
    finally:
        if close_target:
            target.close()


def append_stream(directory: Path, name: str, header: bytes, source: BinaryIO) -> None:
    """Append ``header`` and then ``source`` (read from its start) to ``directory/name``.

    For logs that grow (the run's ``xconf.log``). The directory is opened once and the file
    relative to it with ``O_NOFOLLOW``: a symlink planted at ``name`` is replaced by a real
    file, never written through.
    """
    target = open_root(directory, create=False, follow=True)
    path = target.path / name
    try:
        fd = _open_append(target, name, readable=False, replace_link=True)
        with os.fdopen(fd, "ab") as log:
            log.write(header)
            source.seek(0)
            shutil.copyfileobj(source, log)
    except OSError as exc:
        raise io_error(exc, path) from None
    finally:
        target.close()


def allocate_attempt_dir(case_dir: Dir | Path) -> tuple[str, Dir]:
    """Atomic ``mkdir`` allocation, then the new directory opened without following links.

    Two runners can never publish into one attempt; an attempt directory swapped for a
    symlink between its creation and its open is refused (``artifacts.not_a_directory``).
    The caller closes the returned :class:`Dir`.
    """
    case, close_case = _as_dir(case_dir)
    try:
        numbers = (attempt_number(name) for name in os.listdir(case.fd))
        number = max((n for n in numbers if n is not None), default=0) + 1
        while True:
            attempt_id = attempt_name(number)
            try:
                os.mkdir(attempt_id, 0o755, dir_fd=case.fd)
            except FileExistsError:
                number += 1
                continue
            except OSError as exc:
                raise io_error(exc, case.path / attempt_id) from None
            os.fsync(case.fd)
            return attempt_id, _open_child(case, attempt_id, create=False)
    finally:
        if close_case:
            case.close()
