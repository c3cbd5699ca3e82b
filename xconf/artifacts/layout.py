"""The on-disk format of a run (docs/artifacts.md): names, bounds and bounded readers.

The one owner of the format's vocabulary: file names, attempt names, the per-kind size and
JSON-depth bounds, the regular-file reader every reader goes through and the one file
digest. The seal check built on it lives in ``xconf.artifacts.seal``; the writers in
``xconf.artifacts.safe_io``. Torch-free on purpose, so the report and ``verify`` can
import it cheaply.

Every read opens the final path component with ``O_NOFOLLOW | O_NONBLOCK`` and checks the
type on the open descriptor: a symlink, FIFO, socket, device or directory in place of a
file is reported with a code, never followed, never waited on. Sizes are checked with
``fstat`` before a byte is read, so a sparse 1 GB file costs nothing to refuse.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import stat
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from xconf.errors import ArtifactError

FORMAT = "xconf.artifacts.v1"
SEAL_NAME = "COMPLETE"
SEAL_SCHEMA = "xconf.seal.v1"
SEAL_KEYS = frozenset(
    {"schema", "experiment_id", "case_id", "attempt_id", "execution_key", "result", "files"}
)
HEADER_NAME = "experiment.json"
PLAN_NAME = "plan.jsonl"
CASES_DIR = "cases"
JSON_PAYLOADS = (
    "requested.json",
    "materialized.json",
    "actual.json",
    "identity.json",
)
COMPARISON_NAME = "comparison.json"
SCORE_FILES = {"rollout": "score_rollout.safetensors", "training": "score_training.safetensors"}
TOKEN_DIFFS_NAME = "token_diffs.safetensors"
# The score files' tensor schema (a field of every execution key).
TENSOR_SCHEMA = "xconf.tensors.v1"
PAYLOAD_FILES = (
    *JSON_PAYLOADS,
    SCORE_FILES["rollout"],
    SCORE_FILES["training"],
    TOKEN_DIFFS_NAME,
    COMPARISON_NAME,
)
# Results a resume runs again: an attempt with one of them gives its case no verdict.
NON_REUSABLE_RESULTS = frozenset({"error"})
# experiment.json's scenario level of a run of `xconf judge` (dumps another system scored).
JUDGED_LEVEL = "judge"

_ATTEMPT = re.compile(r"a-(\d{1,9})")
# The staging file of an interrupted publication (safe_io.publish_bytes): never an attempt.
_STALE_TEMP = re.compile(r"\.a-\d+\.[A-Za-z0-9._-]+\.tmp-[0-9a-f]{12}")

KIB, MIB = 1 << 10, 1 << 20
# Per-kind size bounds: far above anything xconf writes, far below what hurts a reader.
MAX_BYTES = {
    SEAL_NAME: 64 * KIB,
    HEADER_NAME: 4 * MIB,
    PLAN_NAME: 64 * MIB,
    **{name: 32 * MIB for name in (*JSON_PAYLOADS, COMPARISON_NAME)},
    **{name: 1024 * MIB for name in (*SCORE_FILES.values(), TOKEN_DIFFS_NAME)},
}
UNBOUNDED = 1 << 62  # for files outside a run (model weights): the digest has no size bound
# What one input (a dump, a prompt file) may make xconf allocate: declared sizes are checked
# against it before anything is allocated. XCONF_MAX_INPUT_BYTES sets another.
INPUT_BUDGET = 8 << 30
# What a compressed input (an npz, a Parquet file) may decode to: at least DECODED_FLOOR
# (XCONF_MAX_DECODED_BYTES sets another), or DECODED_RATIO times its own bytes.
DECODED_FLOOR = 1 << 30
DECODED_RATIO = 16
MAX_PLAN_LINE = 1 * MIB
MAX_JSON_DEPTH = 64
_DEFAULT_MAX = 32 * MIB
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_OPEN_FLAGS = os.O_RDONLY | _NOFOLLOW | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)


def attempt_name(number: int) -> str:
    return f"a-{number:04d}"


def attempt_number(name: str) -> int | None:
    """The number of an attempt directory name (``a-0007`` → 7); None for anything else."""
    match = _ATTEMPT.fullmatch(name)
    return int(match.group(1)) if match else None


def is_stale_temp(name: str) -> bool:
    return _STALE_TEMP.fullmatch(name) is not None


def input_budget() -> int:
    """Bytes one input may make xconf allocate (:data:`INPUT_BUDGET`, or
    ``$XCONF_MAX_INPUT_BYTES``)."""
    value = os.environ.get("XCONF_MAX_INPUT_BYTES", "")
    return int(value) if value.isdigit() and int(value) > 0 else INPUT_BUDGET


def decoded_budget(size: int) -> int:
    """Bytes a compressed input of ``size`` bytes may decode to, never above the input
    budget: a 2 MB archive of deflated zeros declaring 2 GiB, or a 15 KB Parquet file of
    run-length-encoded zeros declaring 3 GB, is a bomb; real logprobs compress a few times."""
    value = os.environ.get("XCONF_MAX_DECODED_BYTES", "")
    floor = int(value) if value.isdigit() and int(value) > 0 else DECODED_FLOOR
    return min(input_budget(), max(floor, DECODED_RATIO * size))


def judged_run(header: Any) -> bool:
    """Whether the run whose ``experiment.json`` is ``header`` holds judged dumps: the kind
    of every attempt is the run's, never what an attempt's own records claim (a scored
    attempt dressed as a dump stays a scored attempt, and is checked as one)."""
    scenario = header.get("scenario") if isinstance(header, dict) else None
    return isinstance(scenario, dict) and scenario.get("level") == JUDGED_LEVEL


def max_bytes(name: str) -> int:
    return MAX_BYTES.get(name, _DEFAULT_MAX)


@contextmanager
def open_regular(path: Path, limit: int | None = None, *, follow: bool = False) -> Iterator[int]:
    """A read descriptor on the regular file ``path``, bounded; coded errors otherwise.

    Raises ``FileNotFoundError`` when absent (callers decide what absence means), else
    ``artifacts.symlink``, ``artifacts.not_a_file``, ``artifacts.too_large`` or
    ``artifacts.io``.
    """
    limit = max_bytes(path.name) if limit is None else limit
    try:
        fd = os.open(path, _OPEN_FLAGS & ~_NOFOLLOW if follow else _OPEN_FLAGS)
    except FileNotFoundError:
        raise
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ArtifactError(
                "artifacts.symlink", f"{path.name} is a symlink and is never followed", str(path)
            ) from None
        raise ArtifactError("artifacts.io", f"cannot read {path}: {exc}", str(path)) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ArtifactError(
                "artifacts.not_a_file", f"{path.name} is not a regular file", str(path)
            )
        if st.st_size > limit:
            raise ArtifactError(
                "artifacts.too_large",
                f"{path.name} is {st.st_size} bytes, more than the {limit} a {path.name} may have",
                str(path),
            )
        yield fd
    finally:
        os.close(fd)


def read_regular(path: Path, limit: int | None = None, *, follow: bool = False) -> bytes | None:
    """The bytes of a bounded regular file, None if absent; anything else is coded.
    ``follow`` only for files outside a run (a model snapshot may be a symlink farm)."""
    try:
        with open_regular(path, limit, follow=follow) as fd:
            return _read_all(fd, path, max_bytes(path.name) if limit is None else limit)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ArtifactError("artifacts.io", f"cannot read {path}: {exc}", str(path)) from None


def _read_all(fd: int, path: Path, limit: int) -> bytes:
    # The whole file in one read when it has not grown since fstat: one buffer, returned as
    # is (the join of one chunk copies nothing), not twice its size.
    expected = os.fstat(fd).st_size
    chunks, total = [], 0
    while chunk := os.read(fd, min(limit + 1 - total, max(MIB, expected + 1 - total))):
        chunks.append(chunk)
        total += len(chunk)
        if total > limit:  # the file grew after fstat
            raise ArtifactError(
                "artifacts.too_large", f"{path.name} grew past {limit} bytes", str(path)
            )
    return b"".join(chunks)


def owned_privately(st: os.stat_result) -> bool:
    """Owned by this user and writable by neither group nor others: nobody else could have
    written it."""
    return st.st_uid == os.geteuid() and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def read_cache_entry(path: Path, limit: int) -> bytes | None:
    """A cache entry xconf wrote (a file digest, frozen tokens): its bytes when the file and
    its directory are the user's own (:func:`owned_privately`), else None, as if absent:
    what another user could have written is never believed, the entry is rebuilt."""
    try:
        folder = os.stat(path.parent)
        if not stat.S_ISDIR(folder.st_mode) or not owned_privately(folder):
            return None
        with open_regular(path, limit) as fd:
            if not owned_privately(os.fstat(fd)):
                return None
            return _read_all(fd, path, limit)
    except (OSError, ArtifactError):
        return None


def sha256_file(path: Path, limit: int | None = None, *, follow: bool = False) -> str:
    """The SHA-256 of a bounded regular file, streamed (``hashlib.file_digest``).

    ``follow`` only for files outside a run (a model snapshot may be a symlink farm).
    """
    with open_regular(path, limit, follow=follow) as fd, os.fdopen(os.dup(fd), "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


class StreamDigest:
    """The SHA-256 of consecutive chunks, each large one hashed on a worker thread while the
    caller reads or writes the next (hashlib releases the GIL): with a second core free the
    digest of a large payload costs little more than its I/O. A chunk must stay unchanged
    until the next :meth:`update` or :meth:`hexdigest`. Use it as a context manager."""

    THREADED = 1 << 20  # below this a chunk is hashed inline: a thread would cost more

    def __init__(self) -> None:
        self._hash = hashlib.sha256()
        self._pool: ThreadPoolExecutor | None = None
        self._pending: Future[None] | None = None

    def __enter__(self) -> StreamDigest:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)

    def _wait(self) -> None:
        if self._pending is not None:
            pending, self._pending = self._pending, None
            pending.result()

    def update(self, chunk: bytes | memoryview) -> None:
        self._wait()
        if len(chunk) < self.THREADED:
            self._hash.update(chunk)
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="xconf-digest")
        self._pending = self._pool.submit(self._hash.update, chunk)

    def hexdigest(self) -> str:
        self._wait()
        return self._hash.hexdigest()


def _depth(value: Any) -> int:
    """Nesting depth of a parsed JSON value, without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, level = stack.pop()
        if isinstance(node, dict | list):
            deepest = max(deepest, level)
            if level > MAX_JSON_DEPTH:
                break
            children = node.values() if isinstance(node, dict) else node
            stack.extend((child, level + 1) for child in children)
    return deepest


class _DuplicateKey(ValueError):
    pass


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object whose every key appears once: a key given twice means two things (a
    safetensors header naming a tensor twice was read from the last of the two)."""
    found = dict(pairs)
    if len(found) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKey(key)
            seen.add(key)
    return found


def parse_json(data: bytes | bytearray | memoryview, what: str, path: str | None = None) -> Any:
    """Parse JSON bytes, bounded in depth, every key of an object once; ``artifacts.malformed``
    (``artifacts.too_deep``, ``artifacts.duplicate_key``) for anything bad.

    A document nested past the interpreter's recursion limit raises RecursionError inside
    the parser: it is caught here and never escapes.
    """
    try:
        value = json.loads(bytes(data).decode("utf-8"), object_pairs_hook=_unique)
    except _DuplicateKey as exc:
        key = str(exc)[:200]
        raise ArtifactError(
            "artifacts.duplicate_key", f"{what} holds the key {key!r} twice", path
        ) from None
    except RecursionError:
        raise ArtifactError(
            "artifacts.too_deep", f"{what} is nested deeper than {MAX_JSON_DEPTH}", path
        ) from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise ArtifactError(
            "artifacts.malformed", f"{what} is not valid JSON: {exc}", path
        ) from None
    if _depth(value) > MAX_JSON_DEPTH:
        raise ArtifactError(
            "artifacts.too_deep", f"{what} is nested deeper than {MAX_JSON_DEPTH}", path
        )
    return value


def read_json(path: Path, limit: int | None = None, *, follow: bool = False) -> Any:
    """A bounded regular JSON file; ``artifacts.missing`` when absent."""
    data = read_regular(path, limit, follow=follow)
    if data is None:
        raise ArtifactError("artifacts.missing", f"{path.name} is missing", str(path))
    return parse_json(data, path.name, str(path))


def read_plan_lines(path: Path) -> Iterator[tuple[int, Any | ArtifactError]]:
    """Each non-empty plan.jsonl line (1-based number) parsed, or the coded reason it is not.

    Absent plan → nothing. A torn or hostile line is reported per line, never raised.
    """
    data = read_regular(path)
    if data is None:
        return
    for number, line in enumerate(data.split(b"\n"), start=1):
        if not line.strip():
            continue
        if len(line) > MAX_PLAN_LINE:
            yield (
                number,
                ArtifactError(
                    "artifacts.too_large", f"line {number} is over {MAX_PLAN_LINE} bytes", str(path)
                ),
            )
            continue
        try:
            yield number, parse_json(line, f"{PLAN_NAME} line {number}", str(path))
        except ArtifactError as exc:
            yield number, exc
