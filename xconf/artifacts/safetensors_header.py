"""A safetensors header, read and checked: the one parser for every safetensors file xconf
reads without safetensors' own loader (a checkpoint's weights, ``xconf judge``'s dumps).

The file is ``<u64 length><JSON header><data>``. Everything is checked before a tensor is
allocated: the length fits the file and :data:`MAX_HEADER_BYTES`; the header is bounded
JSON (:func:`~xconf.artifacts.layout.parse_json`: depth, and every key once, so a header
naming a tensor twice is refused rather than read from the last of the two); ``__metadata__``
maps strings to strings; each tensor has a known dtype, a shape of at most
:data:`MAX_RANK` dimensions each below :data:`MAX_DIM` (``[0, 2**70]`` is no shape), and
data offsets whose span is exactly its bytes, inside the data section. Torch-free.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import Any

from xconf.artifacts.layout import parse_json
from xconf.errors import ArtifactError

# Bytes per element of every dtype the safetensors format names.
ITEMSIZE = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "F8_E8M0": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "I64": 8,
    "U64": 8,
    "F64": 8,
}
# torch's names of the floating dtypes a checkpoint's weights come in (what a header's code means).
FLOAT_NAMES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16"}
MAX_HEADER_BYTES = 100 << 20  # safetensors itself refuses headers above 100 MB
MAX_RANK = 16
MAX_DIM = 1 << 48
METADATA = "__metadata__"


@dataclass(frozen=True)
class Entry:
    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int  # offsets into the data section
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.begin


@dataclass(frozen=True)
class Header:
    length: int  # bytes of the JSON header; the data section starts at 8 + length
    entries: dict[str, Entry]
    metadata: dict[str, str]
    names: frozenset[str]  # every tensor the header names


def _bad(message: str, where: str, code: str = "safetensors.header") -> ArtifactError:
    return ArtifactError(code, message, where)


def header_length(prefix: bytes, file_size: int, where: str) -> int:
    """The JSON header's length from the file's first 8 bytes, checked against the file."""
    if len(prefix) < 8 or file_size < 8:
        raise _bad(f"{file_size}-byte file: no safetensors header", where)
    (length,) = struct.unpack_from("<Q", prefix, 0)
    if length > MAX_HEADER_BYTES or length > file_size - 8:
        raise _bad(f"header length {length} does not fit the {file_size}-byte file", where)
    return int(length)


def _ints(value: Any) -> list[int] | None:
    if not isinstance(value, list):
        return None
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value):
        return None
    return value


def _entry(name: str, info: Any, data_size: int, where: str) -> Entry:
    here = f"{where}:{name}"
    if not isinstance(info, dict):
        raise _bad(f"header entry '{name}' is not an object", here)
    dtype = info.get("dtype")
    if not isinstance(dtype, str) or dtype not in ITEMSIZE:
        raise _bad(f"unknown dtype {str(dtype)[:40]!r}", here, "safetensors.dtype")
    shape, offsets = _ints(info.get("shape")), _ints(info.get("data_offsets"))
    if shape is None or offsets is None or len(offsets) != 2:
        raise _bad("malformed shape or data offsets", here)
    if len(shape) > MAX_RANK or any(d >= MAX_DIM for d in shape):
        shown = shape[: MAX_RANK + 1]
        raise _bad(f"shape {shown} is not a tensor's (rank <= {MAX_RANK}, dims < 2**48)", here)
    begin, end = offsets
    want = math.prod(shape) * ITEMSIZE[dtype]
    if not begin <= end or end - begin != want:
        raise _bad(f"{dtype}{shape} needs {want} bytes, offsets give {end - begin}", here)
    if end > data_size:
        raise _bad(
            f"tensor data ends at byte {end}, the file holds {data_size} (truncated)",
            here,
            "safetensors.truncated",
        )
    return Entry(name, dtype, tuple(shape), begin, end)


def parse_header(
    text: bytes | bytearray, data_size: int, where: str, only: set[str] | None = None
) -> Header:
    """The header's tensors and metadata; ``data_size``: bytes after the header. ``only``:
    the tensors a reader wants (the others are neither checked nor returned; their names
    still count: no name twice)."""
    try:
        header = parse_json(text, "safetensors header", where)
    except ArtifactError as exc:
        raise ArtifactError(exc.code, exc.message, where) from None
    if not isinstance(header, dict):
        raise _bad("safetensors header is not a JSON object", where)
    raw_meta = header.pop(METADATA, None)
    if raw_meta is not None and not (
        isinstance(raw_meta, dict)
        and all(isinstance(k, str) and isinstance(v, str) for k, v in raw_meta.items())
    ):
        raise _bad("__metadata__ is not a map of strings to strings", where)
    entries = {
        name: _entry(name, info, data_size, where)
        for name, info in header.items()
        if only is None or name in only
    }
    return Header(len(text), entries, dict(raw_meta or {}), frozenset(header))
