"""The Megatron side's live state: what the built model is now, and what its last call ran.

Every value here is read from the live ``GPTModel`` (its process groups, its layers' flags,
its parameters) or recorded by the scoring call itself, never copied from the settings it was
built with; the knob handlers (``handlers.py``) read each knob from it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from xconf.runtime.readback import (
    TRAINING_CROSS_ENTROPY,
    TRAINING_DEVICE,
    TRAINING_LAUNCHER_WORLD_SIZE,
    TRAINING_MODEL_CLASS,
    TRAINING_REQUEST_SIZES,
    TRAINING_STATE_DIGEST,
    TRAINING_VOCAB_LAYOUT,
    TRAINING_WEIGHTS_VERIFIED,
    TRAINING_WORLD_SIZE,
)


def _one(values: set[Any]) -> Any:
    """The one value every module holds (None: they disagree, or there is none)."""
    return values.pop() if len(values) == 1 else None


@dataclass(frozen=True)
class ModelReading:
    """The built model as it is: each field read from its modules."""

    tensor_parallel_size: int | None  # the size of the groups its parallel layers compute over
    sequence_parallel: bool | None  # every parallel linear's own flag (None: they disagree)
    param_dtypes: tuple[str, ...]
    attention: str | None  # "eager" (Megatron's DotProductAttention) or "sdpa" (xconf's)
    bias_activation_fusion: bool | None  # the flag the MLPs compute with
    bias_dropout_fusion: bool | None  # the flag the layers' bias-dropout-add run with
    masked_softmax_fusion: bool | None  # the attention softmax modules' flag (sdpa: none)
    apply_rope_fusion: bool | None  # the flag the attention modules apply RoPE with
    fsdp_wrapped: bool  # any module wrapped by FSDP (never, on this side)
    device: str


def read_model(model: Any) -> ModelReading:
    """Read the live model's modules."""
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    from xconf.adapters.megatron.modules import SdpaAttention

    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # pragma: no cover
        FSDPModule = ()  # type: ignore[assignment,misc]
    modules = list(model.modules())
    linears = [m for m in modules if isinstance(m, (ColumnParallelLinear, RowParallelLinear))]
    layers = list(model.decoder.layers)
    cores = [layer.self_attention.core_attention for layer in layers]
    kinds = {
        "eager"
        if isinstance(c, DotProductAttention)
        else "sdpa"
        if isinstance(c, SdpaAttention)
        else None
        for c in cores
    }
    params = list(model.parameters())
    softmax = {
        bool(c.scale_mask_softmax.scaled_masked_softmax_fusion)
        for c in cores
        if isinstance(c, DotProductAttention)
    }
    return ModelReading(
        tensor_parallel_size=_one({int(m.tp_group.size()) for m in linears}),
        sequence_parallel=_one({bool(m.sequence_parallel) for m in linears}),
        param_dtypes=tuple(sorted({str(p.dtype).removeprefix("torch.") for p in params})),
        attention=_one(kinds),
        bias_activation_fusion=_one({bool(x.mlp.config.bias_activation_fusion) for x in layers}),
        bias_dropout_fusion=_one({bool(x.config.bias_dropout_fusion) for x in layers}),
        # SDPA attention has no softmax module: no fused softmax runs anywhere.
        masked_softmax_fusion=_one(softmax) if softmax else False,
        apply_rope_fusion=_one({bool(x.self_attention.config.apply_rope_fusion) for x in layers}),
        fsdp_wrapped=any(isinstance(m, FSDPModule) for m in modules),
        device=str(params[0].device) if params else "none",
    )


@dataclass(frozen=True)
class MegatronState:
    """The side's live state, which its handlers read each knob from."""

    model: ModelReading
    model_class: str
    vocab_layout: Any  # ShardingSpec of the output layer over the TP group
    weights_verified: int  # parameters proven equal to their checkpoint slices
    launcher_world_size: int
    state_digest: dict[str, Any]  # this rank's parameters and buffers now
    request_sizes: tuple[int, ...]  # samples per forward of the last call
    requested_batch_size: int | None  # the batch size the last call asked for
    layouts: tuple[str, ...]  # per forward: "padded" or "packed"
    cross_entropy: str | None  # the last call's path: "fused", "unfused", "operator"

    def readings(self) -> dict[str, Any]:
        """What the side reports beside its knobs (``runtime/readback`` names)."""
        return {
            TRAINING_WORLD_SIZE.name: self.model.tensor_parallel_size,
            TRAINING_LAUNCHER_WORLD_SIZE.name: self.launcher_world_size,
            TRAINING_DEVICE.name: self.model.device,
            TRAINING_MODEL_CLASS.name: self.model_class,
            TRAINING_VOCAB_LAYOUT.name: self.vocab_layout,
            TRAINING_WEIGHTS_VERIFIED.name: self.weights_verified,
            TRAINING_STATE_DIGEST.name: self.state_digest,
            TRAINING_REQUEST_SIZES.name: list(self.request_sizes),
            TRAINING_CROSS_ENTROPY.name: self.cross_entropy,
        }
