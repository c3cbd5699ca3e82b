"""Which code computes the operator's row reductions, and what ranks compare about it.

``triton``: Triton kernels (``triton_kernels.py``) for the tile pass and the merges, for
logits on a CUDA device (and on CPU under Triton's interpreter, which the tests use); the
backward is elementwise and runs as ``eager``. ``auto`` on a CUDA device is ``triton``.

``native``: the hand-written row-partials kernel (``native.py``) for the hot per-tile
pass, torch.compile'd kernels for the small merges and the backward. ``compiled``: every
reduction through torch.compile (inductor's C++ backend). ``eager``: plain PyTorch ops
over fixed row blocks. ``auto``: ``native`` where it builds, else ``compiled``. Each one
keeps a row's bits independent of the TP degree and of the batch, but the three give
different bits from one another, so the resolved label is part of the cross-rank check.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from xconf.ops.logprob import native, triton_kernels
from xconf.ops.logprob.kernels import KernelImpl

Impl = Literal["auto", "native", "compiled", "eager", "triton"]
IMPLS: tuple[Impl, ...] = ("auto", "native", "compiled", "eager", "triton")


@dataclass(frozen=True)
class ResolvedImpl:
    name: Literal["native", "compiled", "eager", "triton"]
    label: str  # compared across ranks: equal labels run identical code
    # The row-reduction kernel (tile partials and the merge).
    kernel: native.NativeKernel | triton_kernels.TritonKernel | None = None

    @property
    def torch_impl(self) -> KernelImpl:
        """The implementation of the torch-level kernels (merges, backward)."""
        return "eager" if self.name in ("eager", "triton") else "compiled"


def resolve_impl(impl: Impl, device_type: str = "cpu") -> ResolvedImpl:
    """``impl`` made concrete for logits on ``device_type``; ``native`` that cannot be
    built, or ``triton`` that cannot be imported, raises with the reason."""
    if impl == "compiled" or impl == "eager":
        return ResolvedImpl(impl, impl)
    if impl == "triton" or (impl == "auto" and device_type == "cuda"):
        built_triton = triton_kernels.kernel()
        return ResolvedImpl("triton", built_triton.label, built_triton)
    if impl == "auto" and not native.available():
        return ResolvedImpl("compiled", "compiled")
    built = native.kernel()
    return ResolvedImpl("native", built.label, built)
