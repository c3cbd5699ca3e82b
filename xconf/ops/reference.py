"""Core selected-logprob backends: the runtime's native path and the float reference."""

from __future__ import annotations

from typing import TYPE_CHECKING

from xconf.operators.capability import BackendCapability
from xconf.operators.catalog import SELECTED_LOGPROB, OperatorDescriptor

if TYPE_CHECKING:  # the catalog loads descriptors() while planning, which needs no torch
    import torch

    from xconf.ops.logprob.contract import LogprobContract

REFERENCE_ID = "xconf.reference_logp"


class ReferenceSelectedLogprob:
    """log_softmax + gather, computed in float32 whatever the logits' dtype: for checking."""

    def contract_for(self, logits: torch.Tensor) -> LogprobContract:
        """The whole, unpadded vocabulary in one call, explicit mask, repeatable bits."""
        from xconf.ops.logprob.contract import (
            LogprobContract,
            ReductionSpec,
            ShardingSpec,
            dtype_name,
        )

        vocab = int(logits.shape[-1])
        return LogprobContract(
            sharding=ShardingSpec.even(vocab, vocab),
            logits_dtype=dtype_name(logits.dtype),  # type: ignore[arg-type]
            reduction=ReductionSpec(determinism_scope="fixed_topology"),
            requested_backend=REFERENCE_ID,
        )

    def __call__(
        self, logits: torch.Tensor, target_ids: torch.Tensor, active_mask: torch.Tensor
    ) -> torch.Tensor:
        import torch

        logprobs = torch.log_softmax(logits.float(), dim=-1)
        selected = logprobs.gather(-1, target_ids.long().unsqueeze(-1)).squeeze(-1)
        return torch.where(active_mask.bool(), selected, torch.zeros_like(selected))


# Plain torch ops in fp32 over the full row: any device torch runs on. It sees one whole
# vocabulary (TP=1, CP=1) and softmaxes every column, so it cannot mask padding.
REFERENCE_CAPABILITIES = tuple(
    BackendCapability(
        platform=platform,
        tier="reference",
        tp_sizes=frozenset({1}),
        cp_sizes=frozenset({1}),
        supports_padding=False,
    )
    for platform in ("cpu", "cuda")
)


def descriptors() -> tuple[OperatorDescriptor, ...]:
    return (
        OperatorDescriptor(
            semantic_operation=SELECTED_LOGPROB,
            backend_id="native",
            factory="",
            version="1",
            # The runtime's own path: never called with logits, so only side, device and
            # dtype are declared (whatever the runtime itself runs on).
            capabilities=tuple(
                BackendCapability(platform=platform, tier="runtime") for platform in ("cpu", "cuda")
            ),
            alignment_properties=frozenset(),
            runtime_native=True,
        ),
        OperatorDescriptor(
            semantic_operation=SELECTED_LOGPROB,
            backend_id=REFERENCE_ID,
            factory="xconf.ops.reference:ReferenceSelectedLogprob",
            version="1",
            capabilities=REFERENCE_CAPABILITIES,
            alignment_properties=frozenset({"fp32_accumulation", "batch_invariant"}),
        ),
    )
