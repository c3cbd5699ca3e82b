"""The bytes of one dump, read once from one open file, and the tensors parsed from them.

Judge digests exactly the bytes it parses: the file is opened once and every byte is hashed
as it is read; a safetensors dump is read in file order straight into its wanted tensors
(nothing else is kept: no whole-file buffer, no second copy), every other format is read into
memory and parsed from that buffer. A dump replaced (renamed over) while judge reads it
therefore cannot put one file's digest on another file's verdict.

Formats: safetensors (parsed here), npz without pickle, Parquet and JSON Lines. Parquet and
JSONL hold one row per sequence; rows of different lengths (ragged) are padded, and the
lengths come back beside the values so a mask can be built from them. Pickle formats are
refused before the file is opened.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from xconf.artifacts.columnar import npz_arrays, parquet_table
from xconf.artifacts.layout import (
    UNBOUNDED,
    StreamDigest,
    decoded_budget,
    input_budget,
    open_regular,
    parse_json,
)
from xconf.artifacts.safetensors_header import Entry, Header, header_length, parse_header
from xconf.errors import ArtifactError, XconfError

PICKLE_SUFFIXES = (".pt", ".pth", ".pkl", ".pickle", ".bin", ".ckpt", ".joblib")
SUFFIXES = (".safetensors", ".npz", ".parquet", ".jsonl")
META_KEYS = ("dtype", "rollout_dtype", "training_dtype")  # string entries a dump may declare
EXPORT_HINT = (
    "export the tensors once with safetensors instead:\n"
    "    from safetensors.torch import save_file\n"
    '    save_file({k: batch[k].contiguous() for k in ("rollout_log_probs", "old_log_probs", '
    '"response_mask")}, "step.safetensors")'
)
# safetensors dtype names; BOOL is read as bytes (0/1 is checked where it matters).
ST_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.uint8,
}


class JudgeError(XconfError):
    """A dump that cannot be judged; nothing is written."""


@dataclass(frozen=True)
class Column:
    """A [B, T] tensor; ``lengths`` [B] when the rows were ragged (padded with zeros)."""

    values: torch.Tensor
    lengths: torch.Tensor | None = None


@dataclass(frozen=True)
class Parsed:
    sha256: str
    size: int
    columns: dict[str, Column]
    meta: dict[str, str]
    names: frozenset[str]  # every key the file holds (for messages)


Read = tuple[dict[str, Column], dict[str, str], set[str]]


CHUNK = 16 << 20  # bytes read (and handed to the digest) at a time


@contextmanager
def _dump_file(path: Path) -> Iterator[tuple[int, int]]:
    """(descriptor, size) of the dump; a missing or unreadable file is a coded error."""
    try:
        with open_regular(path, UNBOUNDED, follow=True) as fd:
            yield fd, os.fstat(fd).st_size
    except FileNotFoundError:
        raise JudgeError("judge.missing_file", "dump file does not exist", str(path)) from None
    except ArtifactError as exc:
        raise JudgeError("judge.unreadable", exc.message, str(path)) from None
    except OSError as exc:
        raise JudgeError("judge.unreadable", f"cannot read {path}: {exc}", str(path)) from None


def _read_into(fd: int, view: memoryview, digest: StreamDigest, path: Path) -> None:
    """Fill ``view`` from ``fd``, each chunk handed to the digest as it arrives."""
    done = 0
    while done < len(view):
        got = os.readv(fd, [view[done : done + CHUNK]])
        if got == 0:
            raise JudgeError("judge.changed", f"{path.name} shrank while it was read", str(path))
        digest.update(view[done : done + got])
        done += got


def _at_end(fd: int, path: Path) -> None:
    if os.read(fd, 1):
        raise JudgeError("judge.changed", f"{path.name} grew while it was read", str(path))


def _allocated(size: int, path: Path) -> bytearray:
    try:
        return bytearray(size)
    except MemoryError:
        raise JudgeError(
            "judge.too_large", f"{path.name} ({size} bytes) does not fit in memory", str(path)
        ) from None


def read_once(path: Path) -> tuple[bytearray, str]:
    """The whole file from one descriptor, and the SHA-256 of exactly those bytes."""
    with _dump_file(path) as (fd, size), StreamDigest() as digest:
        _within_budget(size, path, "the file's bytes")
        buffer = _allocated(size, path)
        _read_into(fd, memoryview(buffer), digest, path)  # each chunk hashed as the next is read
        _at_end(fd, path)
        return buffer, digest.hexdigest()


def _skip(fd: int, count: int, digest: StreamDigest, path: Path) -> None:
    """Read and digest ``count`` bytes nothing keeps, through two alternating buffers (the
    digest may still be hashing the previous one)."""
    buffers = [bytearray(min(count, CHUNK)) for _ in range(2 if count > CHUNK else 1)]
    for turn, start in enumerate(range(0, count, CHUNK)):
        view = memoryview(buffers[turn % len(buffers)])[: min(CHUNK, count - start)]
        _read_into(fd, view, digest, path)


def _tensor_bytes(tensor: torch.Tensor) -> memoryview:
    return tensor.reshape(-1).view(torch.uint8).numpy().data  # contiguous: a flat byte view


def read_safetensors(path: Path, wanted: set[str]) -> Parsed:
    """A safetensors dump read once, in file order, from one descriptor: each wanted tensor
    straight into memory of its own (nothing else is kept, no whole-file buffer), every byte
    of the file digested as it is read."""
    where = str(path)
    with _dump_file(path) as (fd, size), StreamDigest() as digest:
        _within_budget(size, path, "the file's bytes")  # every one is read and digested
        prefix = bytearray(8)
        if size >= 8:
            _read_into(fd, memoryview(prefix), digest, path)
        header = _st_header(fd, prefix, size, wanted, digest, path)
        meta, names, data = header.metadata, set(header.names), size - 8 - header.length
        entries = sorted(
            ((e.name, _st_dtype(e, where), list(e.shape), e.begin, e.end)
             for e in header.entries.values()),
            key=lambda entry: (entry[3], entry[4]),
        )  # fmt: skip
        _within_budget(sum(e.nbytes for e in header.entries.values()), path, "its tensors")
        columns: dict[str, Column] = {}
        position = 0
        for name, dtype, shape, begin, end in entries:
            if begin < position:  # safetensors' own loader refuses overlapping tensors too
                raise JudgeError("judge.unreadable", f"'{name}' overlaps another tensor", where)
            _skip(fd, begin - position, digest, path)
            tensor = torch.empty(shape, dtype=dtype)
            if end > begin:
                _read_into(fd, _tensor_bytes(tensor), digest, path)
            columns[name] = Column(tensor)
            position = end
        _skip(fd, data - position, digest, path)
        _at_end(fd, path)
        return Parsed(digest.hexdigest(), size, columns, meta, frozenset(names))


def _st_header(
    fd: int, prefix: bytearray, size: int, wanted: set[str], digest: StreamDigest, path: Path
) -> Header:
    """The header after the 8-byte prefix, read (and digested) and checked by the one
    safetensors header parser: a name given twice, a shape such as ``[0, 2**70]``, offsets
    past the data are ``judge.unreadable``, an unknown dtype ``judge.bad_dtype``."""
    where = str(path)
    try:
        length = header_length(bytes(prefix), size, where)
        text = _allocated(length, path)
        _read_into(fd, memoryview(text), digest, path)
        return parse_header(text, size - 8 - length, where, only=wanted)
    except ArtifactError as exc:
        code = "judge.bad_dtype" if exc.code == "safetensors.dtype" else "judge.unreadable"
        raise JudgeError(code, f"safetensors header: {exc.message}", exc.path or where) from None


def _st_dtype(entry: Entry, where: str) -> torch.dtype:
    dtype = ST_DTYPES.get(entry.dtype)
    if dtype is None:
        raise JudgeError(
            "judge.bad_dtype", f"'{entry.name}' has dtype {entry.dtype!r}; not judged",
            f"{where}:{entry.name}",
        )  # fmt: skip
    return dtype


def _within_budget(nbytes: int, path: Path, what: str) -> None:
    """What the dump makes judge read or allocate (``what``: the file, its tensors), checked
    before a byte of it is read or allocated."""
    if nbytes > input_budget():
        raise JudgeError(
            "judge.too_large",
            f"{path.name}: {what} take {nbytes} bytes, more than the {input_budget()} one "
            "input may take (XCONF_MAX_INPUT_BYTES)",
            str(path),
        )


def _npz(buffer: bytearray, wanted: set[str], where: str) -> Read:
    import numpy as np

    columns: dict[str, Column] = {}
    meta: dict[str, str] = {}
    arrays = _bounded(lambda: npz_arrays(buffer, where, decoded_budget(len(buffer))), where)
    for key, arr in arrays.items():
        if arr.dtype.kind in "US":
            meta[key] = str(arr.reshape(-1)[0])[:200] if arr.size else ""
        elif key in wanted:
            columns[key] = Column(torch.from_numpy(np.ascontiguousarray(_numeric(arr, key, where))))
    return columns, meta, set(arrays)


def _numeric(arr: Any, key: str, where: str) -> Any:
    """An array torch computes with: unsigned ids wider than a byte (uint16/32/64) as int64
    (a uint64 above 2**63 - 1 is refused); anything but booleans, integers and floats is
    ``judge.bad_dtype``."""
    import numpy as np

    if arr.dtype.kind == "u" and arr.dtype.itemsize > 1:
        if arr.size and int(arr.max()) > np.iinfo(np.int64).max:
            raise JudgeError("judge.bad_value", f"'{key}' holds ids above 2**63 - 1", where)
        return arr.astype(np.int64)
    if arr.dtype.kind not in "biuf" or (arr.dtype.kind == "f" and arr.dtype.itemsize > 8):
        raise JudgeError(
            "judge.bad_dtype", f"'{key}' holds {arr.dtype}; not judged", f"{where}:{key}"
        )
    return arr


def _bounded(read: Any, where: str) -> Any:
    """A bounded columnar read (:mod:`xconf.artifacts.columnar`) with judge's codes."""
    try:
        return read()
    except ArtifactError as exc:
        code = "judge.too_large" if exc.code == "columnar.too_large" else "judge.unreadable"
        raise JudgeError(code, exc.message, where) from None


def _pad(flat: Any, lengths: Any, name: str, where: str) -> Column:
    """Rows of ``lengths`` from the 1-D numpy ``flat``, as a zero-padded [B, max] tensor."""
    import numpy as np

    lengths = np.asarray(lengths, dtype=np.int64)
    if flat.dtype.kind not in "fiub":
        raise JudgeError(
            "judge.bad_value", f"'{name}' holds {flat.dtype}, not numbers", f"{where}:{name}"
        )
    rows, width = len(lengths), int(lengths.max()) if len(lengths) else 0
    values = torch.from_numpy(np.require(flat, requirements=("C", "W")))
    if bool((lengths == width).all()):
        return Column(values.reshape(rows, width))
    out = torch.zeros((rows, width), dtype=values.dtype)
    row = torch.repeat_interleave(torch.arange(rows), torch.from_numpy(lengths))
    starts = torch.from_numpy(np.concatenate([[0], np.cumsum(lengths)[:-1]]))
    col = torch.arange(len(values)) - torch.repeat_interleave(starts, torch.from_numpy(lengths))
    out[row, col] = values
    return Column(out, torch.from_numpy(lengths))


def _parquet(buffer: bytearray, wanted: set[str], where: str) -> Read:
    import pyarrow as pa
    import pyarrow.parquet as pq

    source = pq.ParquetFile(pa.BufferReader(memoryview(buffer)))
    schema = source.schema_arrow
    # only the dtype keys of the string columns: a prompt or response text column is not read
    strings = [
        f.name
        for f in schema
        if f.name in META_KEYS and (pa.types.is_string(f.type) or pa.types.is_large_string(f.type))
    ]
    lists = [f.name for f in schema if f.name in wanted]
    names = sorted(set(strings) | set(lists))
    budget = decoded_budget(len(buffer))
    table = _bounded(lambda: parquet_table(buffer, names, where, budget), where)
    meta = {}
    for name in strings:
        first = table.column(name).slice(0, 1).to_pylist()
        if first and first[0] is not None:
            meta[name] = str(first[0])
    columns: dict[str, Column] = {}
    for name in lists:
        column = table.column(name).combine_chunks()
        kind = column.type
        if not (
            pa.types.is_list(kind)
            or pa.types.is_large_list(kind)
            or pa.types.is_fixed_size_list(kind)
        ):
            continue  # scalar columns (uid, step, ...) are not per-token data
        if column.null_count or column.flatten().null_count:
            raise JudgeError("judge.bad_value", f"'{name}' has null entries", f"{where}:{name}")
        if pa.types.is_fixed_size_list(kind):
            lengths = [kind.list_size] * len(column)
        else:
            offsets = column.offsets.to_numpy()
            lengths = offsets[1:] - offsets[:-1]
            column = column.flatten()  # honours a sliced array's offsets
        flat = column.flatten() if pa.types.is_fixed_size_list(kind) else column
        columns[name] = _pad(flat.to_numpy(zero_copy_only=False), lengths, name, where)
    return columns, meta, set(schema.names)


def _jsonl(buffer: bytearray, wanted: set[str], where: str) -> Read:
    import numpy as np

    rows: dict[str, list[list[Any]]] = {}
    meta: dict[str, str] = {}
    names: set[str] = set()
    first: frozenset[str] = frozenset()
    number_of_rows = 0
    # Split on "\n" only: U+2028 / U+0085 inside a JSON string are not line breaks.
    for number, line in enumerate(bytes(buffer).split(b"\n"), start=1):
        if not line.strip():
            continue
        try:  # bounded in depth, every key once (a row naming old_log_probs twice is refused)
            record = parse_json(line, f"line {number}", f"{where}:{number}")
        except ArtifactError as exc:
            raise JudgeError("judge.unreadable", exc.message, f"{where}:{number}") from None
        if not isinstance(record, dict):
            raise JudgeError(
                "judge.unreadable", f"line {number} is not an object", f"{where}:{number}"
            )
        carried = frozenset(wanted & set(record))
        if number_of_rows and carried != first:
            raise JudgeError(
                "judge.bad_value",
                f"line {number} carries {sorted(carried)}, the first row {sorted(first)}",
                f"{where}:{number}",
            )
        first, number_of_rows = carried, number_of_rows + 1
        names.update(record)
        for key, value in record.items():
            if isinstance(value, str):
                meta.setdefault(key, value)
            elif key in wanted:
                if not isinstance(value, list) or not all(
                    isinstance(v, int | float) and not isinstance(v, bool) for v in value
                ):
                    raise JudgeError(
                        "judge.bad_value",
                        f"line {number}: '{key}' is not a list of numbers",
                        f"{where}:{key}",
                    )
                rows.setdefault(key, []).append(value)
    columns: dict[str, Column] = {}
    for key, values in rows.items():
        # JSON numbers carry no storage dtype: floats are float64, integers int64.
        floats = any(isinstance(v, float) for row in values for v in row)
        flat = np.array(
            [v for row in values for v in row], dtype=np.float64 if floats else np.int64
        )
        columns[key] = _pad(flat, [len(row) for row in values], key, where)
    return columns, meta, names


READERS = {".npz": _npz, ".parquet": _parquet, ".jsonl": _jsonl}  # parsed from the read bytes


def parse_dump(path: Path, wanted: set[str]) -> Parsed:
    """Read ``path`` once, digest those bytes, parse the ``wanted`` columns from them."""
    suffix = path.suffix.lower()
    if suffix in PICKLE_SUFFIXES:
        raise JudgeError(
            "judge.pickle_format",
            f"{path.name} is a pickle format; xconf never loads pickles. {EXPORT_HINT}",
            str(path),
        )
    if suffix not in SUFFIXES:
        raise JudgeError("judge.format", f"a dump is one of {', '.join(SUFFIXES)}", str(path))
    if suffix == ".safetensors":
        return read_safetensors(path, wanted)
    buffer, sha256 = read_once(path)
    try:
        columns, meta, names = READERS[suffix](buffer, wanted, str(path))
    except JudgeError:
        raise
    except Exception as exc:  # each format's parser raises its own types for a bad file
        raise JudgeError(
            "judge.unreadable", f"cannot read {path.name}: {type(exc).__name__}: {exc}", str(path)
        ) from exc
    return Parsed(sha256, len(buffer), columns, meta, frozenset(names))
