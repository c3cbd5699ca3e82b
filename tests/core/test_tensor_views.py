"""A safetensors file's bytes read as numpy views: what safetensors reads, without a copy;
and what safetensors would refuse is a coded error."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
import torch
from safetensors.numpy import load
from safetensors.torch import save

from xconf.artifacts.tensor_file import tensor_parts
from xconf.artifacts.tensor_views import tensor_views
from xconf.errors import ArtifactError

TENSORS = {
    "abs_diff": torch.rand(5, 7),
    "rollout_logprobs": -torch.rand(5, 7, dtype=torch.float64),
    "active_mask": (torch.rand(5, 7) > 0.5).to(torch.uint8),
    "token_ids": torch.randint(0, 1 << 20, (5, 7), dtype=torch.int32),
    "ids64": torch.randint(0, 1 << 40, (3,)),
    "threshold": torch.tensor(1e-5),
    "empty": torch.zeros(0, 4),
    "flags": torch.tensor([True, False, True]),
}


@pytest.mark.parametrize("writer", ["safetensors", "xconf"])
def test_the_views_are_what_safetensors_reads(writer: str) -> None:
    if writer == "safetensors":
        data = save(TENSORS, metadata={"case_id": "c"})
    else:
        data = b"".join(bytes(p) for p in tensor_parts(TENSORS, {"case_id": "c"}))
    views = tensor_views(data, "here")
    theirs = load(data)
    assert views.keys() == theirs.keys() == TENSORS.keys()
    for name, view in views.items():
        assert view.dtype == theirs[name].dtype and view.shape == theirs[name].shape, name
        assert np.array_equal(view, theirs[name]), name
        assert not view.flags.writeable and (view.size == 0 or view.base is not None), name


def _file(header: dict[str, object], data: bytes, pad: bytes = b"") -> bytes:
    text = json.dumps(header).encode() + pad
    return struct.pack("<Q", len(text)) + text + data


def _f32(begin: int, end: int, shape: list[int]) -> dict[str, object]:
    return {"dtype": "F32", "shape": shape, "data_offsets": [begin, end]}


def _twice() -> bytes:
    entry = '{"dtype":"F32","shape":[1],"data_offsets":[%d,%d]}'
    text = ('{"a":' + entry % (0, 4) + ',"a":' + entry % (4, 8) + "}").encode()
    return struct.pack("<Q", len(text)) + text + b"\0" * 8


HOSTILE = {
    "short": (b"\x01\x00", "shorter than a safetensors header"),
    "header-past-the-end": (struct.pack("<Q", 1 << 40) + b"{}", "runs past the file"),
    "not-json": (struct.pack("<Q", 3) + b"{x}", "not JSON"),
    "not-an-object": (_file([], b""), "not an object"),  # type: ignore[arg-type]
    "bfloat16": (
        _file({"a": {"dtype": "BF16", "shape": [1], "data_offsets": [0, 2]}}, b"\0\0"),
        "no dtype numpy reads",
    ),
    "bad-shape": (
        _file({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}, b"\0" * 4),
        "malformed",
    ),
    "too-few-bytes": (_file({"a": _f32(0, 4, [2])}, b"\0" * 4), "holds 4 bytes for shape [2]"),
    "gap": (_file({"a": _f32(4, 8, [1])}, b"\0" * 8), "starts at 4, not at 0"),
    "overlap": (_file({"a": _f32(0, 8, [2]), "b": _f32(4, 12, [2])}, b"\0" * 12), "not at 8"),
    "trailing-bytes": (_file({"a": _f32(0, 4, [1])}, b"\0" * 8), "cover 4 of the 8 data bytes"),
    "a-name-twice": (_twice(), "appears twice"),
    "bool-not-0-or-1": (
        _file({"a": {"dtype": "BOOL", "shape": [2], "data_offsets": [0, 2]}}, b"\x01\x02"),
        "bytes other than 0 and 1",
    ),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_a_file_safetensors_would_refuse_is_a_coded_error(name: str) -> None:
    data, said = HOSTILE[name]
    with pytest.raises(ArtifactError) as err:
        tensor_views(data, "/run/x/token_diffs.safetensors")
    assert err.value.code == "artifacts.bad_tensor_file" and said in err.value.message, err.value
    assert err.value.path == "/run/x/token_diffs.safetensors"
