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

import io
import json
import math
import os
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from xconf.artifacts.layout import UNBOUNDED, StreamDigest, open_regular
from xconf.errors import ArtifactError, XconfError

PICKLE_SUFFIXES = (".pt", ".pth", ".pkl", ".pickle", ".bin", ".ckpt", ".joblib")
SUFFIXES = (".safetensors", ".npz", ".parquet", ".jsonl")
META_KEYS = ("dtype", "rollout_dtype", "training_dtype")  # string entries a dump may declare
MAX_HEADER = 100 << 20  # a safetensors header (JSON) larger than this is not a dump
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
        if size < 8:
            raise JudgeError("judge.unreadable", "shorter than a safetensors header", where)
        prefix = bytearray(8)
        _read_into(fd, memoryview(prefix), digest, path)
        (length,) = struct.unpack_from("<Q", prefix, 0)
        if length > min(MAX_HEADER, size - 8):
            raise JudgeError(
                "judge.unreadable", f"safetensors header length {length} runs past the file", where
            )
        text = _allocated(length, path)
        _read_into(fd, memoryview(text), digest, path)
        try:
            header = json.loads(bytes(text).decode("utf-8"))
        except (ValueError, UnicodeDecodeError, RecursionError) as exc:
            raise JudgeError("judge.unreadable", f"safetensors header: {exc}", where) from None
        if not isinstance(header, dict):
            raise JudgeError("judge.unreadable", "safetensors header is not an object", where)
        raw_meta = header.pop("__metadata__", None) or {}
        meta = {str(k): str(v) for k, v in raw_meta.items()} if isinstance(raw_meta, dict) else {}
        names, data = set(header), size - 8 - length
        entries = sorted(
            (_st_entry(name, header[name], data, where) for name in names & wanted),
            key=lambda entry: (entry[3], entry[4]),
        )
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


def _ints(value: Any) -> list[int] | None:
    """``value`` if it is a list of non-negative ints (JSON booleans excluded), else None."""
    if not isinstance(value, list):
        return None
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value):
        return None
    return value


def _st_entry(
    name: str, info: Any, data: int, where: str
) -> tuple[str, torch.dtype, list[int], int, int]:
    """(name, dtype, shape, begin, end) of a header entry, checked against the data section."""
    here = f"{where}:{name}"
    if not isinstance(info, dict):
        raise JudgeError("judge.unreadable", f"header entry '{name}' is not an object", here)
    dtype = ST_DTYPES.get(str(info.get("dtype")))
    if dtype is None:
        raise JudgeError(
            "judge.bad_dtype", f"'{name}' has dtype {info.get('dtype')!r}; not judged", here
        )
    shape, offsets = _ints(info.get("shape")), _ints(info.get("data_offsets"))
    if shape is None or offsets is None or len(offsets) != 2:
        raise JudgeError("judge.unreadable", f"'{name}' has a malformed shape or offsets", here)
    begin, end = offsets
    numel = math.prod(shape)
    itemsize = torch.empty((), dtype=dtype).element_size()
    if not begin <= end <= data or end - begin != numel * itemsize:
        raise JudgeError(
            "judge.unreadable",
            f"'{name}' claims {numel} x {itemsize} bytes at [{begin}, {end}) of a {data}-byte "
            "data section",
            here,
        )
    return name, dtype, shape, begin, end


def _npz(buffer: bytearray, wanted: set[str], where: str) -> Read:
    import numpy as np

    columns: dict[str, Column] = {}
    meta: dict[str, str] = {}
    with np.load(io.BytesIO(buffer), allow_pickle=False) as npz:
        for key in npz.files:
            arr = npz[key]
            if arr.dtype.kind in "US":
                meta[key] = str(arr.reshape(-1)[0]) if arr.size else ""
            elif key in wanted:
                columns[key] = Column(torch.from_numpy(np.ascontiguousarray(arr)))
        names = set(npz.files)
    return columns, meta, names


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
    table = source.read(columns=sorted(set(strings) | set(lists)))
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
        try:
            record = json.loads(line)
        except (ValueError, UnicodeDecodeError, RecursionError) as exc:
            raise JudgeError(
                "judge.unreadable", f"line {number} is not JSON: {exc}", f"{where}:{number}"
            ) from None
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
