"""Row-wise reduction kernels whose per-row code depends only on the contract.

A compiler may split a reduction differently for every shape it sees. Here every kernel
reduces each row independently over a row width fixed by the contract (a tile, or the
global tile count), never by the TP degree or the batch: ``compiled`` kernels have only
the row count dynamic and are always first traced with the same size hint, so their
code generation is the same in every process; ``eager`` kernels run in fixed-size row
blocks. Every compiled kernel gets its own code object, so one kernel's guards never
evict another's and nothing is ever silently run uncompiled.
"""

from __future__ import annotations

import threading
import types
from collections.abc import Callable
from typing import Any, Literal

import torch

from xconf.ops.logprob.errors import LogprobValidationError

KernelImpl = Literal["compiled", "eager"]
KERNEL_IMPLS: tuple[KernelImpl, ...] = ("compiled", "eager")
NEG_INF = float("-inf")
# Compiled calls cover a multiple of this many rows (a multiple of every SIMD width);
# it also keeps row counts of 0 and 1, which a compiler specializes, out of the kernels.
ROW_ALIGN = 64


def block_rows(width: int) -> int:
    """Eager rows per block for a row width: about 2**21 elements (8 MB of fp32)."""
    return max(1, min(4096, (1 << 21) // width))


def warm_rows(width: int) -> int:
    """The row-count hint a compiled kernel is traced with: a function of width only."""
    return max(ROW_ALIGN, min(4096, WARM_ELEMENTS // width) // ROW_ALIGN * ROW_ALIGN)


def tile_partials(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row: fp32 ``(m, s) = (max, sum exp(x - m))``; an all ``-inf`` row gives (-inf, 0)."""
    xf = x.float()
    m = xf.amax(-1)
    shift = torch.where(m == NEG_INF, torch.zeros_like(m), m)
    s = torch.exp(xf - shift[:, None]).sum(-1)
    return m, s


def merge_partials(m: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """Per row, over all tiles in order: ``M + log(sum_t s_t * exp(m_t - M))``."""
    big = m.amax(-1)
    shift = torch.where(big == NEG_INF, torch.zeros_like(big), big)
    return shift + torch.log((s * torch.exp(m - shift[:, None])).sum(-1))


def softmax_grad(
    x: torch.Tensor, lse: torch.Tensor, coef: torch.Tensor, keep: torch.Tensor
) -> torch.Tensor:
    """Per row: ``exp(x - lse) * coef`` in fp32, zero where ``keep`` is False."""
    grad = torch.exp(x.float() - lse[:, None]) * coef[:, None]
    return torch.where(keep[:, None], grad, torch.zeros_like(grad))


WARM_ELEMENTS = 1 << 22  # size hint: every compiled kernel is first traced with this many


class Kernel:
    """One row-wise reduction kernel for one row width and dtype.

    ``compiled``: compiled once with only the row count dynamic (the row width, dtype and
    strides are static), first traced with a size hint of ``warm_rows(width)`` rows, then called
    once over all rows: one parallel region per call, and the same per-row code for any
    row count. ``eager``: the same function over fixed ``block_rows(width)``-row blocks
    (the last one padded), so no full-size temporaries are ever allocated.
    """

    def __init__(
        self, fn: Callable[..., object], key: tuple[object, ...], impl: KernelImpl
    ) -> None:
        if impl not in KERNEL_IMPLS:
            raise LogprobValidationError(
                "logprob.call.invalid_impl",
                f"impl must be one of {list(KERNEL_IMPLS)}, got {impl!r}",
            )
        self.fn, self.key, self.impl = fn, key, impl
        self.width = int(key[1])  # type: ignore[call-overload]
        self._compiled: Callable[..., object] | None = None
        if impl == "compiled":
            tag = "_".join(str(part).replace(".", "_") for part in key)
            self._compiled = torch.compile(_fresh(fn, tag), dynamic=None, fullgraph=True)
        self._warm = False

    def run(
        self, rows: int, inputs: tuple[torch.Tensor, ...], pads: tuple[float | bool, ...]
    ) -> list[torch.Tensor]:
        """Outputs for ``rows`` leading rows of every input (each output cut to ``rows``)."""
        compiled = self._compiled
        if compiled is None:
            return _run_blocks(self.fn, rows, inputs, pads, block_rows(self.width))
        if not self._warm:
            hint = warm_rows(self.width)
            warm = tuple(_padded(t[:hint], hint, p) for t, p in zip(inputs, pads, strict=True))
            _call(compiled, warm)
            self._warm = True
        # Every call covers a multiple of ROW_ALIGN rows, so a loop the compiler vectorizes
        # across rows never sends a row down its scalar remainder path.
        main = rows - rows % ROW_ALIGN
        parts: list[list[torch.Tensor]] = []
        if main:
            parts.append(_call(compiled, tuple(t[:main] for t in inputs)))
        if rows > main:
            rest = tuple(
                _padded(t[main:rows], ROW_ALIGN, p) for t, p in zip(inputs, pads, strict=True)
            )
            parts.append([out[: rows - main] for out in _call(compiled, rest)])
        if len(parts) == 1:
            return parts[0]
        return [torch.cat(pieces) for pieces in zip(*parts, strict=True)]


def _call(compiled: Callable[..., object], inputs: tuple[torch.Tensor, ...]) -> list[torch.Tensor]:
    for tensor in inputs:
        torch._dynamo.mark_dynamic(tensor, 0)
    result: Any = compiled(*inputs)
    return list(result) if isinstance(result, tuple) else [result]


def _fresh(fn: Callable[..., object], tag: str) -> Callable[..., object]:
    """A copy of ``fn`` with its own code object, hence its own compile cache."""
    code = fn.__code__.replace(co_name=f"{fn.__name__}__{tag}")
    return types.FunctionType(code, fn.__globals__, code.co_name, fn.__defaults__)


_LOCK = threading.Lock()
_KERNELS: dict[tuple[object, ...], Kernel] = {}


def _kernel(fn: Callable[..., object], key: tuple[object, ...], impl: KernelImpl) -> Kernel:
    with _LOCK:
        kernel = _KERNELS.get((*key, impl))
        if kernel is None:
            kernel = Kernel(fn, key, impl)
            _KERNELS[(*key, impl)] = kernel
        return kernel


def _run_blocks(
    fn: Callable[..., object],
    rows: int,
    inputs: tuple[torch.Tensor, ...],
    pads: tuple[float | bool, ...],
    block: int,
) -> list[torch.Tensor]:
    outs: list[list[torch.Tensor]] = []
    for start in range(0, rows, block):
        stop = min(start + block, rows)
        if stop - start == block:
            args = tuple(t[start:stop] for t in inputs)
        else:
            args = tuple(
                _padded(t[start:stop], block, pad) for t, pad in zip(inputs, pads, strict=True)
            )
        result: Any = fn(*args)
        parts: list[torch.Tensor] = list(result) if isinstance(result, tuple) else [result]
        outs.append([p[: stop - start] for p in parts])
    if not outs:
        return []
    return [torch.cat([o[i] for o in outs]) for i in range(len(outs[0]))]


def _padded(t: torch.Tensor, block: int, pad: float | bool) -> torch.Tensor:
    """``t`` grown (or cut) to ``block`` rows with the same row strides, filled with ``pad``."""
    rows = min(t.shape[0], block)
    if t.dim() == 2 and t.stride(1) == 1 and t.stride(0) > t.shape[1]:
        # Keep a strided view's row stride, so a compiled kernel sees the same layout.
        base = torch.full((block, t.stride(0)), pad, dtype=t.dtype, device=t.device)
        out = base[:, : t.shape[1]]
    else:
        out = torch.full((block, *t.shape[1:]), pad, dtype=t.dtype, device=t.device)
    out[:rows] = t[:rows]
    return out


def partials_kernel(width: int, dtype: torch.dtype, impl: KernelImpl) -> Kernel:
    return _kernel(tile_partials, ("partials", width, dtype), impl)


def merge_kernel(tiles: int, impl: KernelImpl) -> Kernel:
    return _kernel(merge_partials, ("merge", tiles, torch.float32), impl)


def grad_kernel(width: int, dtype: torch.dtype, impl: KernelImpl) -> Kernel:
    return _kernel(softmax_grad, ("grad", width, dtype), impl)
