"""A safetensors file's bytes as read-only numpy views of its tensors: nothing copied, no
torch imported (the report reads xconf's token files so; :mod:`xconf.artifacts.tensor_file`
writes them)."""

from __future__ import annotations

import json
import math
import struct
from typing import TYPE_CHECKING

from xconf.errors import ArtifactError

if TYPE_CHECKING:
    import numpy as np


# safetensors' dtype names as numpy reads them (numpy has no bfloat16: such a file is refused).
NUMPY_DTYPES = {
    "F64": "<f8",
    "F32": "<f4",
    "F16": "<f2",
    "I64": "<i8",
    "I32": "<i4",
    "I16": "<i2",
    "I8": "i1",
    "U8": "u1",
    "BOOL": "?",
}
MAX_HEADER = 100 << 20  # safetensors' own limit on the header


def tensor_views(data: bytes, where: str) -> dict[str, np.ndarray]:
    """The tensors of a safetensors file's bytes as read-only numpy views into ``data``.

    ``safetensors.numpy.load`` copies every tensor out of the bytes it is given (a second
    copy of the file): these views copy nothing. The file is checked as safetensors checks
    it: a JSON header object of known dtypes whose tensors tile the data section exactly
    (in offset order, no gap, no overlap), each of the bytes its shape needs, no name twice.
    A file that is not so is an ``artifacts.bad_tensor_file`` error naming ``where``.
    """
    import numpy as np

    def bad(message: str) -> ArtifactError:
        return ArtifactError("artifacts.bad_tensor_file", message, where)

    if len(data) < 8:
        raise bad("shorter than a safetensors header")
    (length,) = struct.unpack_from("<Q", data, 0)
    if length > min(MAX_HEADER, len(data) - 8):
        raise bad(f"header length {length} runs past the file")

    def unique(pairs: list[tuple[str, object]]) -> dict[str, object]:
        names = [name for name, _ in pairs]
        if len(set(names)) != len(names):
            raise bad("a tensor name appears twice in the header")
        return dict(pairs)

    try:
        header = json.loads(bytes(data[8 : 8 + length]).decode("utf-8"), object_pairs_hook=unique)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise bad(f"header is not JSON: {exc}") from None
    if not isinstance(header, dict):
        raise bad("header is not an object")
    header.pop("__metadata__", None)
    start, size = 8 + length, len(data) - 8 - length
    entries = []
    for name, info in header.items():
        if not isinstance(info, dict) or str(info.get("dtype")) not in NUMPY_DTYPES:
            raise bad(f"tensor {name!r} has no dtype numpy reads")
        shape, offsets = info.get("shape"), info.get("data_offsets")
        if not (
            isinstance(shape, list)
            and isinstance(offsets, list)
            and len(offsets) == 2
            and all(type(v) is int and v >= 0 for v in [*shape, *offsets])
        ):
            raise bad(f"tensor {name!r} has a malformed shape or offsets")
        dtype = np.dtype(NUMPY_DTYPES[info["dtype"]])
        count = math.prod(shape)
        if offsets[1] - offsets[0] != count * dtype.itemsize:
            raise bad(f"tensor {name!r} holds {offsets[1] - offsets[0]} bytes for shape {shape}")
        entries.append((offsets[0], offsets[1], name, dtype, shape, count))
    entries.sort(key=lambda e: (e[0], e[1]))
    position = 0
    views: dict[str, np.ndarray] = {}
    for begin, end, name, dtype, shape, count in entries:
        if begin != position:
            raise bad(f"tensor {name!r} starts at {begin}, not at {position}")
        view = np.frombuffer(data, dtype, count, start + begin).reshape(shape)
        if dtype.kind == "b" and count and int(view.view(np.uint8).max()) > 1:
            raise bad(f"bool tensor {name!r} holds bytes other than 0 and 1")
        views[name] = view
        position = end
    if position != size:
        raise bad(f"the tensors cover {position} of the {size} data bytes")
    return views
