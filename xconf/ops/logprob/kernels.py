"""Fixed-shape reduction kernels: the same compiled code for a tile on any rank and batch.

A compiler may split a reduction differently for every shape it sees. Here each kernel
is compiled (``dynamic=False``) for exactly one block shape that depends only on the
contract (tile width, dtype), never on the TP degree or the batch size: callers cut
their work into row blocks of that fixed shape and pad the last block. Each kernel
reduces every row independently, so a row's bits do not depend on its neighbours.
Every compiled kernel gets its own code object, so one kernel's guards never evict
another's and no shape is ever silently run uncompiled.
"""

from __future__ import annotations

import threading
import types
from collections.abc import Callable
from typing import Any, Literal

import torch

from xconf.ops.logprob.errors import LogprobValidationError

Impl = Literal["compiled", "eager"]
IMPLS: tuple[Impl, ...] = ("compiled", "eager")
NEG_INF = float("-inf")
MERGE_BLOCK_ROWS = 256


def block_rows(width: int) -> int:
    """Rows per block for a row width: about 2**21 elements, a function of width only.

    Big enough that per-call overhead (and each call's parallel-region barrier) stays
    small, small enough that a padded last block costs a few MB at most.
    """
    return max(1, min(4096, (1 << 21) // width))


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


_LOCK = threading.Lock()
_COMPILED: dict[tuple[object, ...], Callable[..., object]] = {}


def _fresh(fn: Callable[..., object], tag: str) -> Callable[..., object]:
    """A copy of ``fn`` with its own code object, hence its own compile cache."""
    code = fn.__code__.replace(co_name=f"{fn.__name__}__{tag}")
    return types.FunctionType(code, fn.__globals__, code.co_name, fn.__defaults__)


def _kernel(
    fn: Callable[..., object], key: tuple[object, ...], impl: Impl
) -> Callable[..., object]:
    if impl == "eager":
        return fn
    if impl != "compiled":
        raise LogprobValidationError(
            "logprob.call.invalid_impl", f"impl must be one of {list(IMPLS)}, got {impl!r}", "impl"
        )
    with _LOCK:
        compiled = _COMPILED.get(key)
        if compiled is None:
            tag = "_".join(str(part).replace(".", "_") for part in key)
            compiled = torch.compile(_fresh(fn, tag), dynamic=False, fullgraph=True)
            _COMPILED[key] = compiled
        return compiled


def run_row_blocks(
    kernel: Callable[..., object],
    rows: int,
    inputs: tuple[torch.Tensor, ...],
    pads: tuple[float | bool, ...],
    block: int,
) -> list[torch.Tensor]:
    """Apply ``kernel`` to fixed ``block``-row slices of ``inputs``; pad the last block.

    Every input has ``rows`` leading rows; outputs are concatenated and cut to ``rows``.
    """
    outs: list[list[torch.Tensor]] = []
    for start in range(0, rows, block):
        stop = min(start + block, rows)
        if stop - start == block:
            args = tuple(t[start:stop] for t in inputs)
        else:
            args = tuple(
                _padded(t[start:stop], block, pad) for t, pad in zip(inputs, pads, strict=True)
            )
        result: Any = kernel(*args)
        parts: list[torch.Tensor] = list(result) if isinstance(result, tuple) else [result]
        outs.append([p[: stop - start] for p in parts])
    if not outs:
        return []
    return [torch.cat([o[i] for o in outs]) for i in range(len(outs[0]))]


def _padded(t: torch.Tensor, block: int, pad: float | bool) -> torch.Tensor:
    out = torch.full((block, *t.shape[1:]), pad, dtype=t.dtype, device=t.device)
    out[: t.shape[0]] = t
    return out


def _upcasting(kernel: Callable[..., object], dtype: torch.dtype) -> Callable[..., object]:
    """Feed a low-precision block to the fp32 kernel: the cast is exact, so bits are too."""
    if dtype == torch.float32:
        return kernel

    def call(x: torch.Tensor, *rest: torch.Tensor) -> object:
        return kernel(x.float(), *rest)

    return call


def partials_kernel(width: int, dtype: torch.dtype, impl: Impl) -> Callable[..., object]:
    key = ("partials", width, block_rows(width))
    return _upcasting(_kernel(tile_partials, key, impl), dtype)


def merge_kernel(tiles: int, impl: Impl) -> Callable[..., object]:
    return _kernel(merge_partials, ("merge", tiles, MERGE_BLOCK_ROWS), impl)


def grad_kernel(width: int, dtype: torch.dtype, impl: Impl) -> Callable[..., object]:
    key = ("grad", width, block_rows(width))
    return _upcasting(_kernel(softmax_grad, key, impl), dtype)
