"""The Megatron side's settings: the one record each knob's materialized value lands in
(``runtime/materialization.settings_for``), one field per knob its handlers honour, named by
``runtime.settings.setting_name``, each default what the side builds without the knob.
``model.MegatronConfig`` is built from it field by field (``MegatronConfig.from_settings``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MegatronSettings:
    """The Megatron training side's construction, process and request settings."""

    batch_size: int | None = None
    """``batch.size``: samples per scoring forward (the last forward may be shorter)."""
    compute_dtype: str = "float32"
    """``training.compute_dtype``: dtype of every parameter and of the forward."""
    attention_backend: str = "eager"
    """``training.attention_backend``: the core attention of the layer spec (``eager``:
    Megatron's own DotProductAttention; ``sdpa``: xconf's SDPA module in that slot)."""
    sharding: str = "unsharded"
    """``training.sharding``: always ``unsharded`` (no FSDP; the side shards by TP)."""
    param_dtype: str = "none"
    """``training.param_dtype``: always ``none`` (no FSDP2 MixedPrecisionPolicy)."""
    reduce_dtype: str = "none"
    """``training.reduce_dtype``: always ``none`` (no FSDP2 MixedPrecisionPolicy)."""
    remove_padding: bool = False
    """``training.remove_padding``: one packed row per request (per-sample positions, a
    block-diagonal causal mask) instead of a right-padded batch."""
    tensor_parallel_size: int = 1
    """``training.tensor_parallel_size``: ranks the model's heads, MLP and vocabulary are
    split over (a sub-group of the launched world; 1: a private one-rank group)."""
    sequence_parallel: bool = False
    """``training.sequence_parallel``: Megatron sequence parallelism (needs TP > 1)."""
    bias_activation_fusion: bool = False
    """``training.bias_activation_fusion``: Megatron's fused bias + SwiGLU kernel."""
    bias_dropout_fusion: bool = False
    """``training.bias_dropout_fusion``: Megatron's fused bias + dropout + residual add."""
    masked_softmax_fusion: bool = False
    """``training.masked_softmax_fusion``: Megatron's fused scale + mask + softmax kernel."""
    apply_rope_fusion: bool = False
    """``training.apply_rope_fusion``: Megatron's fused rotary-embedding kernel."""
    cross_entropy_loss_fusion: bool = False
    """``training.cross_entropy_loss_fusion``: Megatron's fused vocab-parallel cross entropy
    for the native selected logprob."""
    logp_backend: str | None = None
    """``logp.backend``: the selected-logprob backend id (the operator binding owns it)."""
