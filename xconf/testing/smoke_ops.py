"""Smoke-only selected-logprob backends. Unregistered by default; see SMOKE_OPERATORS.md.

Using one needs both explicit registration (``register_smoke_operators``) and the command-line
authorization (``--allow-smoke-operators`` / ``allow_smoke_operators=true``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from xconf.operators.capability import BackendCapability
from xconf.operators.catalog import SELECTED_LOGPROB, OperatorDescriptor, SemanticOperatorCatalog
from xconf.ops.reference import ReferenceSelectedLogprob

if TYPE_CHECKING:  # registered while planning, which needs no torch
    import torch

    from xconf.ops.logprob.contract import LogprobContract

# Larger than every contract threshold, so an offset case must fail whatever the dtypes.
DEFAULT_OFFSET = 0.25


class OffsetSelectedLogprob:
    """Proves mismatch detection: the training side is the reference shifted by a fixed,
    authorized offset; the rollout side is the plain reference. Selecting it through
    ``logp.backend`` (both sides) therefore always produces a known, one-sided drift.
    """

    def __init__(self, side: str, offset: float = DEFAULT_OFFSET) -> None:
        self._reference = ReferenceSelectedLogprob()
        self._offset = float(offset) if side == "training" else 0.0

    def contract_for(self, logits: torch.Tensor) -> LogprobContract:
        return self._reference.contract_for(logits)

    def __call__(
        self, logits: torch.Tensor, target_ids: torch.Tensor, active_mask: torch.Tensor
    ) -> torch.Tensor:
        import torch

        selected = self._reference(logits, target_ids, active_mask)
        return torch.where(active_mask.bool(), selected + self._offset, selected)


def smoke_descriptors() -> tuple[OperatorDescriptor, ...]:
    # Both compute the reference's way: one whole, unpadded vocabulary per call, CPU only.
    capability = BackendCapability(
        platform="cpu",
        tier="smoke",
        tp_sizes=frozenset({1}),
        cp_sizes=frozenset({1}),
        supports_padding=False,
    )
    common = {
        "semantic_operation": SELECTED_LOGPROB,
        "version": "1",
        "is_smoke_only": True,
        "capabilities": (capability,),
    }
    return (
        OperatorDescriptor(
            backend_id="smoke_only.logp_reference",
            factory="xconf.ops.reference:ReferenceSelectedLogprob",
            **common,  # type: ignore[arg-type]
        ),
        OperatorDescriptor(
            backend_id="smoke_only.logp_offset",
            factory="xconf.testing.smoke_ops:OffsetSelectedLogprob",
            factory_takes_side=True,
            **common,  # type: ignore[arg-type]
        ),
    )


def register_smoke_operators(catalog: SemanticOperatorCatalog) -> None:
    for descriptor in smoke_descriptors():
        catalog.register(descriptor, replace=True)
