"""The vllm_hf runtime's knob handlers: how each knob is materialized on this machine, and
read back from the engine that runs it.

Contract knobs are here, extended ones in ``extended.py``; ``HANDLERS`` is both, and the
one default bind (``runtime/materialization.default_bind``) runs every case's knobs through
it. Each handler reads its knob's live value from the state the engine exposes
(``reads.py``: ``rollout.*`` from vLLM's resolved config and workers, ``training.*`` from
the FSDP2 state and the scorer's forwards).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from types import MappingProxyType

from xconf.adapters.vllm_transformers import reads
from xconf.adapters.vllm_transformers.extended import EXTENDED
from xconf.adapters.vllm_transformers.placement import launched_world_size, rollout_executor
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
    side_worlds,
)
from xconf.runtime.protocol import (
    AT_CONSTRUCTION,
    CHUNKED_REQUESTS,
    KnobApplication,
    KnobHandler,
    KnobRequest,
)


def _tensor_parallel(request: KnobRequest) -> KnobApplication:
    runtime, value = request.runtime, int(request.value)
    facts = runtime.model
    if facts is None:  # bind refuses before this: a case binds only on a frozen checkpoint
        return request.unsupported("no frozen checkpoint to split over TP ranks")
    reason = facts.tp_reason(value)
    if reason is not None:
        allowed = ", ".join(map(str, facts.tp_sizes))
        return request.unsupported(f"{reason} (this model allows TP {allowed})")
    world = launched_world_size()
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


def _attention_backend(request: KnobRequest) -> KnobApplication:
    if request.value == "flash_attention_2" and request.runtime.device == "cpu":
        return request.unsupported("flash_attention_2 needs CUDA")
    chosen = "sdpa" if request.value == "native" else request.value
    return request.applied_as(chosen, f"transformers attn_implementation={chosen}")


def _sharding(request: KnobRequest) -> KnobApplication:
    if request.value == "unsharded":
        return request.applied("one unsharded module")
    world = launched_world_size()
    degree = side_worlds({request.path: request.value}).training
    if world < degree:
        return request.unsupported(
            f"FSDP needs a process group of {degree} ranks, the launched world has "
            f"{world} (run under the torchrun launcher)"
        )
    return request.applied(
        f"FSDP2 fully_shard per decoder layer over ranks 0..{degree - 1} "
        f"of the {world}-rank launched world"
    )


CONTRACT: Mapping[str, KnobHandler] = {
    BATCH_SIZE.path: CHUNKED_REQUESTS,
    ROLLOUT_TENSOR_PARALLEL_SIZE.path: KnobHandler(_tensor_parallel, reads.WORKER_TP),
    ROLLOUT_CONTEXT_PARALLEL_SIZE.path: KnobHandler(_context_parallel, reads.context_parallel),
    ROLLOUT_DTYPE.path: AT_CONSTRUCTION.reading(reads.WORKER_DTYPE),
    ROLLOUT_ENABLE_PREFIX_CACHING.path: AT_CONSTRUCTION.reading(reads.prefix_caching),
    ROLLOUT_ENFORCE_EAGER.path: AT_CONSTRUCTION.reading(reads.enforce_eager),
    TRAINING_ATTENTION_BACKEND.path: KnobHandler(_attention_backend, reads.attention),
    TRAINING_COMPUTE_DTYPE.path: AT_CONSTRUCTION.reading(reads.compute_dtype),
    TRAINING_SHARDING.path: KnobHandler(_sharding, reads.sharding),
}

HANDLERS: Mapping[str, KnobHandler] = MappingProxyType({**CONTRACT, **EXTENDED})
