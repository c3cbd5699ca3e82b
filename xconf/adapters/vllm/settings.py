"""The vLLM rollout side's settings: the one record each rollout knob's materialized value
lands in (``runtime/materialization.settings_for``), each field's default the engine's own.
``engine.RolloutEngineConfig`` takes its knob fields' defaults from here and is built from
it field by field (``RolloutEngineConfig.from_settings``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class VllmSettings:
    """The vLLM engine's construction, process and request settings."""

    batch_size: int | None = None
    """``batch.size``: samples per scoring request (the last request may be shorter)."""
    tensor_parallel_size: int = 1
    """``rollout.tensor_parallel_size``: ranks the rollout model is tensor-parallel over."""
    context_parallel_size: int = 1
    """``rollout.context_parallel_size``: ranks a prefill's context is split over (only 1 is
    materialized here: no field of the engine)."""
    dtype: str = "float32"
    """``rollout.dtype``: compute dtype of the rollout model (``float32``, ``bfloat16``,
    ``float16``)."""
    enable_prefix_caching: bool = False
    """``rollout.enable_prefix_caching``: reuse cached KV blocks of a shared prompt prefix."""
    enforce_eager: bool = True
    """``rollout.enforce_eager``: eager PyTorch, no compiled or CUDA-graph path."""
    logp_backend: str | None = None
    """``logp.backend``: the selected-logprob backend id (the operator binding owns it)."""
    kv_cache_dtype: str = "auto"
    """``rollout.kv_cache_dtype``: element dtype of the paged KV cache (``auto``: the model's
    dtype)."""
    enable_chunked_prefill: bool | None = None
    """``rollout.enable_chunked_prefill``: split long prefills into token-budget chunks
    (None: the engine's default)."""
    max_num_batched_tokens: int | None = None
    """``rollout.max_num_batched_tokens``: tokens the scheduler batches per step (None: the
    engine's default)."""
    batch_invariant: bool = False
    """``rollout.batch_invariant``: vLLM's batch-invariant kernels (VLLM_BATCH_INVARIANT)."""
    scoring_mode: str | None = None
    """``rollout.scoring_mode``: ``decode`` (forced decoding) or ``prefill`` (prompt logprobs
    in one pass); None: the identity's ``scoring_mode``."""
    logits_dtype: str = "model"
    """``rollout.logits_dtype``: the lm_head projection's dtype: ``model`` (the compute dtype)
    or ``float32`` (vLLM's ``head_dtype`` override: hidden states and weight cast first)."""
    logprobs_mode: str = "raw_logprobs"
    """``rollout.logprobs_mode``: what vLLM reports for a scored token: ``raw_logprobs`` (the
    log-softmax of the model's logits) or ``processed_logprobs`` (after the temperature and
    top-k/top-p; xconf then forces each frozen token after sampling: ``sampling.py``)."""
    temperature: float = 0.0
    """``rollout.temperature``: the temperature the scoring requests sample at (0: greedy)."""
    top_k: int = 0
    """``rollout.top_k``: the scoring requests' top-k (0: every token)."""
    top_p: float = 1.0
    """``rollout.top_p``: the scoring requests' top-p (1.0: every token)."""
    weight_sync: str = "load"
    """``rollout.weight_sync``: ``load`` (the engine loads the scored checkpoint) or ``reload``
    (built from a source checkpoint, then sent the scored weights through vLLM's
    ``reload_weights``: ``weight_sync.py``; the source is a one-step identity's pre-update
    weights, else a perturbed copy of the scored ones)."""
    weight_sync_dtype: str = "float32"
    """``rollout.weight_sync_dtype``: the dtype the synced weights travel in (``float32`` or
    ``bfloat16``; only under ``reload``)."""
