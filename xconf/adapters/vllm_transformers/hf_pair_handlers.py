"""The hf_pair runtime's knob handlers: its reference scorer's rollout settings, read back
from that scorer's live state, and vllm_hf's training handlers (apart from ``hf_pair.py``,
so that the reference engine, which needs torch, imports them without the runtime)."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from xconf.adapters.vllm_transformers import reads
from xconf.adapters.vllm_transformers.handlers import HANDLERS as VLLM_HF_HANDLERS
from xconf.knobs import (
    ALIGN_OFF,
    BATCH_SIZE,
    KNOBS,
    ROLLOUT_BATCH_INVARIANT,
    ROLLOUT_CONTEXT_PARALLEL_SIZE,
    ROLLOUT_DTYPE,
    ROLLOUT_ENABLE_CHUNKED_PREFILL,
    ROLLOUT_ENABLE_PREFIX_CACHING,
    ROLLOUT_ENFORCE_EAGER,
    ROLLOUT_KV_CACHE_DTYPE,
    ROLLOUT_MAX_NUM_BATCHED_TOKENS,
    ROLLOUT_SCORING_MODE,
    ROLLOUT_TENSOR_PARALLEL_SIZE,
    TRAINING_ALIGN,
    TRAINING_ALIGN_ALL,
    KnobValue,
)
from xconf.runtime.protocol import (
    CHUNKED_REQUESTS,
    KnobApplication,
    KnobHandler,
    KnobRequest,
    ReadBack,
)


def _fixed(allowed: KnobValue | None, why: str, reading: ReadBack | None) -> KnobHandler:
    """A rollout setting the reference scorer has exactly one value of (``allowed``; None:
    none at all): that value is applied, any other is unsupported with ``why``."""

    def materialize(request: KnobRequest) -> KnobApplication:
        if request.value == allowed:
            return request.applied(f"fixed by the reference scorer: {why}")
        return request.unsupported(why)

    return KnobHandler(materialize, reading)


def _constant(value: KnobValue) -> ReadBack:
    """A setting the reference scorer has by construction, whatever it is asked."""
    return lambda live: value


NO_KV_CACHE = "a teacher-forced reference pass has no KV cache"
# The rollout side is the reference scorer, never vLLM: only these rollout settings exist,
# each read back from the reference's own state (``reads``: its parameters' dtype, one
# unsharded module, the requests it answered) or fixed by how it scores (use_cache=False on
# every forward, eager forwards).
REFERENCE: Mapping[str, KnobHandler] = {
    ROLLOUT_DTYPE.path: KnobHandler(
        lambda request: request.applied("reference scorer compute dtype"), reads.compute_dtype
    ),
    ROLLOUT_ENABLE_PREFIX_CACHING.path: _fixed(False, NO_KV_CACHE, _constant(False)),
    ROLLOUT_ENFORCE_EAGER.path: _fixed(
        True, "the reference scorer has no graph/compiled mode", _constant(True)
    ),
    ROLLOUT_TENSOR_PARALLEL_SIZE.path: _fixed(
        1, "vocab-parallel TP needs the vocab-parallel operator", reads.unsharded_ranks
    ),
    ROLLOUT_CONTEXT_PARALLEL_SIZE.path: _fixed(
        1, "no context parallelism in the reference scorer", _constant(1)
    ),
    ROLLOUT_KV_CACHE_DTYPE.path: _fixed("auto", NO_KV_CACHE, _constant("auto")),
    ROLLOUT_ENABLE_CHUNKED_PREFILL.path: _fixed(
        False, "the reference scores each request in one pass", _constant(False)
    ),
    ROLLOUT_MAX_NUM_BATCHED_TOKENS.path: _fixed(
        None, "the reference scorer has no scheduler budget", None
    ),
    ROLLOUT_BATCH_INVARIANT.path: _fixed(
        False, "the reference scorer has no batch-invariant mode", _constant(False)
    ),
    BATCH_SIZE.path: CHUNKED_REQUESTS,
    ROLLOUT_SCORING_MODE.path: _fixed(
        "prefill",
        "the reference scorer scores the whole frozen sequence in one teacher-forced pass",
        _constant("prefill"),
    ),
}
NO_VLLM = (
    "hf_pair's rollout side is the transformers reference scorer, not vLLM: there are no "
    "rollout kernels to align the training side with"
)
# The arms align the training side with vLLM, which hf_pair does not run: only ``off``.
ARMS: Mapping[str, KnobHandler] = {
    spec.path: _fixed(ALIGN_OFF, NO_VLLM, VLLM_HF_HANDLERS[spec.path].readback)
    for spec in (*TRAINING_ALIGN.values(), TRAINING_ALIGN_ALL)
}
# The training side is vllm_hf's own transformers scorer: its handlers, no rollout one.
HANDLERS: Mapping[str, KnobHandler] = MappingProxyType(
    {
        **{p: h for p, h in VLLM_HF_HANDLERS.items() if KNOBS[p].side != "rollout"},
        **ARMS,
        **REFERENCE,
    }
)
