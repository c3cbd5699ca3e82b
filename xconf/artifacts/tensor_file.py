"""A safetensors file as its parts: the header, then views of each tensor's own memory
(read back without a copy by :mod:`xconf.artifacts.tensor_views`).

``safetensors.torch.save`` returns the whole file as one ``bytes``: a second copy of every
tensor, built before the first byte is written. :func:`tensor_parts` gives the same bytes
(the same layout, header and padding; the metadata sorted) as a header and zero-copy views, which
:func:`xconf.artifacts.safe_io.publish_bytes` writes and digests in place. Any safetensors
reader reads the result.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping

import torch

from xconf.artifacts.safe_io import Parts
from xconf.errors import ArtifactError

# safetensors' names, in the order its writer lays the data out (widest dtype first).
DTYPES = {
    torch.int64: "I64",
    torch.float64: "F64",
    torch.float32: "F32",
    torch.int32: "I32",
    torch.bfloat16: "BF16",
    torch.float16: "F16",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}
_ORDER = {dtype: rank for rank, dtype in enumerate(DTYPES)}


def _bytes_of(tensor: torch.Tensor) -> memoryview:
    """The tensor's memory as bytes, without a copy when it is contiguous on the CPU."""
    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    if flat.numel() == 0:
        return memoryview(b"")
    return flat.view(torch.uint8).numpy().data  # 1-D uint8: a flat byte view


def tensor_parts(tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str]) -> Parts:
    """The safetensors file of ``tensors`` and ``metadata`` as (header, data...)."""
    for name, tensor in tensors.items():
        if tensor.dtype not in DTYPES:
            raise ArtifactError(
                "artifacts.bad_tensor", f"tensor {name!r} has dtype {tensor.dtype}", name
            )
    order = sorted(tensors, key=lambda name: (_ORDER[tensors[name].dtype], name))
    # sorted: safetensors' own writer orders the metadata as its hash map happens to
    header: dict[str, object] = {"__metadata__": dict(sorted(metadata.items()))} if metadata else {}
    views, offset = [], 0
    for name in order:
        view = _bytes_of(tensors[name])
        header[name] = {
            "dtype": DTYPES[tensors[name].dtype],
            "shape": list(tensors[name].shape),
            "data_offsets": [offset, offset + len(view)],
        }
        views.append(view)
        offset += len(view)
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned, as safetensors pads it
    return (struct.pack("<Q", len(text)) + text, *views)
