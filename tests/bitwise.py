"""Bitwise comparison of float tensors, for the tests that claim bit-identical results."""

from __future__ import annotations

import torch

_SAME_WIDTH_INT = {
    torch.float64: torch.int64,
    torch.float32: torch.int32,
    torch.bfloat16: torch.int16,
    torch.float16: torch.int16,
}


def bits(t: torch.Tensor) -> torch.Tensor:
    """``t``'s bit pattern as integers of its width: ``torch.equal`` on two of them is a
    bitwise comparison (NaN equals the same NaN, -0.0 differs from 0.0)."""
    t = t.detach().contiguous()
    return t.view(_SAME_WIDTH_INT[t.dtype])


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(bits(a), bits(b))
