"""Core selected-logprob backends: the runtime's native path and the float reference."""

from __future__ import annotations

from typing import TYPE_CHECKING

from xconf.semantic_registry import SELECTED_LOGPROB, OperatorDescriptor

if TYPE_CHECKING:  # the catalog loads descriptors() while planning, which needs no torch
    import torch

ALL_DEVICES = frozenset({"cpu", "cuda"})


class ReferenceSelectedLogprob:
    """log_softmax + gather, computed in float32 whatever the logits' dtype: for checking."""

    def __call__(
        self, logits: torch.Tensor, target_ids: torch.Tensor, active_mask: torch.Tensor
    ) -> torch.Tensor:
        import torch

        logprobs = torch.log_softmax(logits.float(), dim=-1)
        selected = logprobs.gather(-1, target_ids.long().unsqueeze(-1)).squeeze(-1)
        return torch.where(active_mask.bool(), selected, torch.zeros_like(selected))


def descriptors() -> tuple[OperatorDescriptor, ...]:
    return (
        OperatorDescriptor(
            semantic_operation=SELECTED_LOGPROB,
            backend_id="native",
            factory="",
            version="1",
            devices=ALL_DEVICES,
            alignment_properties=frozenset(),
            runtime_native=True,
        ),
        OperatorDescriptor(
            semantic_operation=SELECTED_LOGPROB,
            backend_id="xconf.reference_logp",
            factory="xconf.ops.reference:ReferenceSelectedLogprob",
            version="1",
            devices=ALL_DEVICES,
            alignment_properties=frozenset({"fp32_accumulation", "batch_invariant"}),
        ),
    )
