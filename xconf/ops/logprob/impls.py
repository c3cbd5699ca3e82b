"""Which code computes the operator's row reductions, and what ranks compare about it.

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

from xconf.ops.logprob import native
from xconf.ops.logprob.kernels import KernelImpl

Impl = Literal["auto", "native", "compiled", "eager"]
IMPLS: tuple[Impl, ...] = ("auto", "native", "compiled", "eager")


@dataclass(frozen=True)
class ResolvedImpl:
    name: Literal["native", "compiled", "eager"]
    label: str  # compared across ranks: equal labels run identical code
    kernel: native.NativeKernel | None = None

    @property
    def torch_impl(self) -> KernelImpl:
        """The implementation of the torch-level kernels (merges, backward)."""
        return "eager" if self.name == "eager" else "compiled"


def resolve_impl(impl: Impl) -> ResolvedImpl:
    """``impl`` made concrete; ``native`` that cannot be built raises with the reason."""
    if impl == "compiled" or impl == "eager":
        return ResolvedImpl(impl, impl)
    if impl == "auto" and not native.available():
        return ResolvedImpl("compiled", "compiled")
    built = native.kernel()
    return ResolvedImpl("native", built.label, built)
