"""The transformers sides' settings: the one record each knob's materialized value lands in
(``runtime/materialization.settings_for``), each field's default the scorer's own.
``model.TrainingScorerConfig`` takes its knob fields' defaults from ``HfSettings`` and is
built from it field by field (``TrainingScorerConfig.from_settings``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class HfSettings:
    """The training scorer's construction, process and request settings."""

    batch_size: int | None = None
    """``batch.size``: samples per scoring forward (the last forward may be shorter)."""
    attention_backend: str = "sdpa"
    """``training.attention_backend``: transformers ``attn_implementation`` (``eager``,
    ``sdpa``, ``flash_attention_2``)."""
    compute_dtype: str = "float32"
    """``training.compute_dtype``: dtype the scorer's parameters are loaded in."""
    sharding: str = "unsharded"
    """``training.sharding``: ``unsharded`` (one module) or ``fsdp`` (FSDP2 over
    ``knobs.FSDP_DEGREE`` ranks)."""
    logp_backend: str | None = None
    """``logp.backend``: the selected-logprob backend id (the operator binding owns it)."""
    param_dtype: str = "none"
    """``training.param_dtype``: FSDP2 MixedPrecisionPolicy.param_dtype (``none``: unset)."""
    reduce_dtype: str = "none"
    """``training.reduce_dtype``: FSDP2 MixedPrecisionPolicy.reduce_dtype (``none``: unset)."""
    remove_padding: bool = False
    """``training.remove_padding``: score each request as one packed row (per-sample
    positions, no padding) instead of a right-padded batch."""
    scoring_mode: str = "full"
    """``training.scoring_mode``: ``full`` (one teacher-forced forward per request) or
    ``decode`` (token by token over a KV cache, in the rollout engine's step shapes)."""
    align_rms_norm: str = "off"
    """``training.align.rms_norm``: ``vllm``: RMS norms and fused residual adds as vLLM's."""
    align_linear: str = "off"
    """``training.align.linear``: ``vllm``: linear layers through vLLM's GEMM and fused
    weights."""
    align_rotary: str = "off"
    """``training.align.rotary``: ``vllm``: vLLM's rotary embedding (its cos/sin cache)."""
    align_attention: str = "off"
    """``training.align.attention``: ``vllm``: vLLM's CPU attention over a paged KV cache."""
    align_activation: str = "off"
    """``training.align.activation``: ``vllm``: vLLM's SiluAndMul."""
    align_logits: str = "off"
    """``training.align.logits``: ``vllm``: vLLM's logits processor and raw logprobs."""
    align_all: str = "off"
    """``training.align.all``: ``vllm``: every kind above (the full arm)."""
    logits_dtype: str = "model"
    """``training.logits_dtype``: the lm_head projection's dtype: ``model`` (the compute
    dtype) or ``float32`` (hidden states and weight cast first, ``head.py``)."""
    temperature: float = 1.0
    """``training.temperature``: what the trainer divides its logits by before the
    log-softmax (``head.py``; 1.0: the model's logits as they are)."""


@dataclass(frozen=True)
class ReferenceSettings:
    """The reference scorer's rollout settings: every one but the dtype has the one value a
    teacher-forced unsharded pass has (``handlers.REFERENCE`` refuses any other)."""

    batch_size: int | None = None
    """``batch.size``: samples per scoring forward (the last forward may be shorter)."""
    tensor_parallel_size: int = 1
    """``rollout.tensor_parallel_size``: one unsharded module."""
    context_parallel_size: int = 1
    """``rollout.context_parallel_size``: no context parallelism."""
    dtype: str = "float32"
    """``rollout.dtype``: the reference scorer's compute dtype."""
    enable_prefix_caching: bool = False
    """``rollout.enable_prefix_caching``: no KV cache, so no prefix cache."""
    enforce_eager: bool = True
    """``rollout.enforce_eager``: eager forwards, no graph or compiled mode."""
    logp_backend: str | None = None
    """``logp.backend``: the selected-logprob backend id (the operator binding owns it)."""
    kv_cache_dtype: str = "auto"
    """``rollout.kv_cache_dtype``: no KV cache (``auto``)."""
    enable_chunked_prefill: bool = False
    """``rollout.enable_chunked_prefill``: each request is scored in one pass."""
    max_num_batched_tokens: int | None = None
    """``rollout.max_num_batched_tokens``: no scheduler budget."""
    batch_invariant: bool = False
    """``rollout.batch_invariant``: no batch-invariant mode."""
    scoring_mode: str = "prefill"
    """``rollout.scoring_mode``: the whole frozen sequence in one teacher-forced pass."""
    logits_dtype: str = "model"
    """``rollout.logits_dtype``: the reference's lm_head dtype (``model`` or ``float32``)."""
    logprobs_mode: str = "raw_logprobs"
    """``rollout.logprobs_mode``: no sampler, so the model's raw log-softmax."""
    temperature: float = 0.0
    """``rollout.temperature``: no sampler (nothing is divided)."""
    top_k: int = 0
    """``rollout.top_k``: no sampler (every token)."""
    top_p: float = 1.0
    """``rollout.top_p``: no sampler (every token)."""
