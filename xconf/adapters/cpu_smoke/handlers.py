"""The synthetic sides' knob handlers: how each knob is materialized, and read back from the
synthetic engines' live state (``side.py`` declares the two sides with them)."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from xconf.adapters.cpu_smoke.state import RolloutState, TrainingState
from xconf.knobs import (
    BATCH_SIZE,
    ROLLOUT_CONTEXT_PARALLEL_SIZE,
    ROLLOUT_DTYPE,
    ROLLOUT_ENABLE_PREFIX_CACHING,
    ROLLOUT_ENFORCE_EAGER,
    ROLLOUT_TENSOR_PARALLEL_SIZE,
    TRAINING_ATTENTION_BACKEND,
    TRAINING_COMPUTE_DTYPE,
    TRAINING_SHARDING,
)
from xconf.runtime.protocol import (
    AT_CONSTRUCTION,
    CHUNKED_REQUESTS,
    KnobApplication,
    KnobHandler,
    KnobRequest,
)


def _single_rank(request: KnobRequest) -> KnobApplication:
    if request.value == 1:
        return request.applied_as(1, "single in-process rank")
    return request.unsupported(
        "cpu-smoke runs one in-process rank; use the torchrun launcher with a distributed runtime"
    )


def _sharding(request: KnobRequest) -> KnobApplication:
    if request.value == "unsharded":
        return request.applied("one unsharded module")
    return request.unsupported("cpu-smoke has no process group to shard over")


def _attention_backend(request: KnobRequest) -> KnobApplication:
    if request.value == "flash_attention_2":
        return request.unsupported("flash_attention_2 needs CUDA")
    chosen = "sdpa" if request.value == "native" else request.value
    return request.applied_as(chosen, f"attention computed with {chosen}")


def _ranks(live: RolloutState) -> int:
    return live.ranks


def _dtype(live: RolloutState | TrainingState) -> str:
    return live.dtype


def _prefix_caching(live: RolloutState) -> bool:
    return live.prefix_caching


def _eager(live: RolloutState) -> bool:
    return live.eager


def _attention(live: TrainingState) -> str:
    return live.attention


def _modules(live: TrainingState) -> str:
    return live.sharding


# What each synthetic side configures for each knob, and how each is read back from the
# synthetic engine's live state (``state.RolloutState``, ``state.TrainingState``). No extended
# knob has a handler: each is unsupported here.
ROLLOUT: Mapping[str, KnobHandler] = MappingProxyType(
    {
        BATCH_SIZE.path: CHUNKED_REQUESTS,
        ROLLOUT_TENSOR_PARALLEL_SIZE.path: KnobHandler(_single_rank, _ranks),
        ROLLOUT_CONTEXT_PARALLEL_SIZE.path: KnobHandler(_single_rank, _ranks),
        ROLLOUT_DTYPE.path: AT_CONSTRUCTION.reading(_dtype),
        ROLLOUT_ENABLE_PREFIX_CACHING.path: AT_CONSTRUCTION.reading(_prefix_caching),
        ROLLOUT_ENFORCE_EAGER.path: AT_CONSTRUCTION.reading(_eager),
    }
)
TRAINING: Mapping[str, KnobHandler] = MappingProxyType(
    {
        BATCH_SIZE.path: CHUNKED_REQUESTS,
        TRAINING_ATTENTION_BACKEND.path: KnobHandler(_attention_backend, _attention),
        TRAINING_COMPUTE_DTYPE.path: AT_CONSTRUCTION.reading(_dtype),
        TRAINING_SHARDING.path: KnobHandler(_sharding, _modules),
    }
)
