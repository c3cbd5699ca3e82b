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
    scoring_mode: str | None = None
    """``rollout.scoring_mode``: ``decode`` (forced decoding) or ``prefill`` (prompt logprobs
    in one pass); None: the identity's ``scoring_mode``."""


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
    scoring_mode: str | None = "full"
    """``training.scoring_mode``: ``full`` (one teacher-forced forward per request) or
    ``decode`` (token by token over a KV cache, in the rollout engine's step shapes)."""
    align_rms_norm: str | None = "off"
    """``training.align.rms_norm``: ``vllm``: RMS norms and fused residual adds as vLLM's."""
    align_linear: str | None = "off"
    """``training.align.linear``: ``vllm``: linear layers through vLLM's GEMM and fused
    weights."""
    align_rotary: str | None = "off"
    """``training.align.rotary``: ``vllm``: vLLM's rotary embedding (its cos/sin cache)."""
    align_attention: str | None = "off"
    """``training.align.attention``: ``vllm``: vLLM's CPU attention over a paged KV cache."""
    align_activation: str | None = "off"
    """``training.align.activation``: ``vllm``: vLLM's SiluAndMul."""
    align_logits: str | None = "off"
    """``training.align.logits``: ``vllm``: vLLM's logits processor and raw logprobs."""
    align_all: str | None = "off"
    """``training.align.all``: ``vllm``: every kind above (the full arm)."""


Settings: TypeAlias = RolloutSettings | TrainingSettings


def setting_name(spec: KnobSpec) -> str:
    """The settings field of a knob: its path without the side, dots as underscores
    (``training.align.rms_norm`` -> ``align_rms_norm``; ``logp.backend`` keeps its namespace:
    ``logp_backend``)."""
    head, _, rest = spec.path.partition(".")
    return (rest if head in ("rollout", "training") else spec.path).replace(".", "_")
