"""Each side's settings: the materialized knob values an engine is built from, typed.

One field per knob of the side (``batch.size`` and ``logp.backend`` on both), named by
``setting_name`` (the path without its side: ``rollout.dtype`` -> ``dtype``), so the fields
follow from the knob table and ``tests/core/test_settings.py`` checks that they do. A field
holds what the runtime's handler materialized, which may differ from the request
(``native`` attention is ``sdpa``); ``None`` where the case declares the knob and the
runtime materialized nothing (``unsupported``), and the field's default where the case does
not declare an optional (extended) knob: the engine's own default. An engine is built from
these records (``runtime/materialization.settings_for``), never from a mapping keyed
by knob paths.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeAlias

from xconf.knobs import KnobSpec


@dataclass(frozen=True)
class RolloutSettings:
    """The rollout engine's construction, process and request settings."""

    batch_size: int | None = None
    """``batch.size``: samples per scoring request (the last request may be shorter)."""
    tensor_parallel_size: int | None = None
    """``rollout.tensor_parallel_size``: ranks the rollout model is tensor-parallel over."""
    context_parallel_size: int | None = None
    """``rollout.context_parallel_size``: ranks a prefill's context is split over."""
    dtype: str | None = None
    """``rollout.dtype``: compute dtype of the rollout model (``float32``, ``bfloat16``,
    ``float16``)."""
    enable_prefix_caching: bool | None = None
    """``rollout.enable_prefix_caching``: reuse cached KV blocks of a shared prompt prefix."""
    enforce_eager: bool | None = None
    """``rollout.enforce_eager``: eager PyTorch, no compiled or CUDA-graph path."""
    logp_backend: str | None = None
    """``logp.backend``: the selected-logprob backend id (the operator binding owns it)."""
    kv_cache_dtype: str | None = "auto"
    """``rollout.kv_cache_dtype``: element dtype of the paged KV cache (``auto``: the model's
    dtype)."""
    enable_chunked_prefill: bool | None = None
    """``rollout.enable_chunked_prefill``: split long prefills into token-budget chunks
    (None: the engine's default)."""
    max_num_batched_tokens: int | None = None
    """``rollout.max_num_batched_tokens``: tokens the scheduler batches per step (None: the
    engine's default)."""
    batch_invariant: bool | None = False
    """``rollout.batch_invariant``: vLLM's batch-invariant kernels (VLLM_BATCH_INVARIANT)."""


@dataclass(frozen=True)
class TrainingSettings:
    """The training scorer's construction, process and request settings."""

    batch_size: int | None = None
    """``batch.size``: samples per scoring forward (the last forward may be shorter)."""
    attention_backend: str | None = None
    """``training.attention_backend``: transformers ``attn_implementation`` (``eager``,
    ``sdpa``, ``flash_attention_2``)."""
    compute_dtype: str | None = None
    """``training.compute_dtype``: dtype the scorer's parameters are loaded in."""
    sharding: str | None = None
    """``training.sharding``: ``unsharded`` (one module) or ``fsdp`` (FSDP2 over
    ``knobs.FSDP_DEGREE`` ranks)."""
    logp_backend: str | None = None
    """``logp.backend``: the selected-logprob backend id (the operator binding owns it)."""
    param_dtype: str | None = "none"
    """``training.param_dtype``: FSDP2 MixedPrecisionPolicy.param_dtype (``none``: unset)."""
    reduce_dtype: str | None = "none"
    """``training.reduce_dtype``: FSDP2 MixedPrecisionPolicy.reduce_dtype (``none``: unset)."""
    remove_padding: bool | None = False
    """``training.remove_padding``: score each request as one packed row (per-sample
    positions, no padding) instead of a right-padded batch."""
    tensor_parallel_size: int | None = 1
    """``training.tensor_parallel_size``: ranks the Megatron model is tensor-parallel over."""
    sequence_parallel: bool | None = False
    """``training.sequence_parallel``: Megatron sequence parallelism (needs TP > 1)."""
    bias_activation_fusion: bool | None = False
    """``training.bias_activation_fusion``: Megatron's fused bias + SwiGLU kernel."""
    bias_dropout_fusion: bool | None = False
    """``training.bias_dropout_fusion``: Megatron's fused bias + dropout + residual add."""
    masked_softmax_fusion: bool | None = False
    """``training.masked_softmax_fusion``: Megatron's fused scale + mask + softmax kernel."""
    apply_rope_fusion: bool | None = False
    """``training.apply_rope_fusion``: Megatron's fused rotary-embedding kernel."""
    cross_entropy_loss_fusion: bool | None = False
    """``training.cross_entropy_loss_fusion``: Megatron's fused vocab-parallel cross entropy
    for the native selected logprob."""


Settings: TypeAlias = RolloutSettings | TrainingSettings


def setting_name(spec: KnobSpec) -> str:
    """The settings field of a knob: its path without the side (``logp.backend`` keeps its
    namespace: ``logp_backend``)."""
    head, _, rest = spec.path.partition(".")
    return rest if head in ("rollout", "training") else spec.path.replace(".", "_")
