"""The transformers sides' knob handlers: how each knob is materialized on this machine, and
read back from the scorer that runs it (``reads.py``: the model's attention, dtypes and FSDP2
state, the forwards it ran).

``TRAINING``: the training scorer's knobs, contract and extended ones (beyond the drift
contract's allowlist). ``REFERENCE``: the rollout knobs of the unsharded reference scorer
(``side.REFERENCE``, hf_pair's rollout side): ``rollout.dtype`` is its compute dtype; prefix
caching, graph mode, tensor and context parallelism do not exist in a teacher-forced
reference pass, so any value but the one it has is ``unsupported``.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from xconf.adapters.hf import reads
from xconf.adapters.hf.align.handlers import HANDLERS as ALIGN_HANDLERS
from xconf.knobs import (
    ALIGN_VLLM,
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
    ROLLOUT_LOGPROBS_MODE,
    ROLLOUT_MAX_NUM_BATCHED_TOKENS,
    ROLLOUT_SCORING_MODE,
    ROLLOUT_TEMPERATURE,
    ROLLOUT_TENSOR_PARALLEL_SIZE,
    ROLLOUT_TOP_K,
    ROLLOUT_TOP_P,
    TRAINING_ALIGN,
    TRAINING_ALIGN_ALL,
    TRAINING_ATTENTION_BACKEND,
    TRAINING_COMPUTE_DTYPE,
    TRAINING_LOGITS_DTYPE,
    TRAINING_PARAM_DTYPE,
    TRAINING_REDUCE_DTYPE,
    TRAINING_REMOVE_PADDING,
    TRAINING_SHARDING,
    TRAINING_TEMPERATURE,
    KnobValue,
    side_worlds,
)
from xconf.runtime.protocol import (
    AT_CONSTRUCTION,
    CHUNKED_REQUESTS,
    KnobApplication,
    KnobHandler,
    KnobRequest,
    ReadBack,
)
from xconf.runtime.ranks import world_size


# -- training: the transformers scorer -----------------------------------------------------
def _attention_backend(request: KnobRequest) -> KnobApplication:
    if request.value == "flash_attention_2" and request.runtime.device == "cpu":
        return request.unsupported("flash_attention_2 needs CUDA")
    chosen = "sdpa" if request.value == "native" else request.value
    return request.applied_as(chosen, f"transformers attn_implementation={chosen}")


def _sharding(request: KnobRequest) -> KnobApplication:
    if request.value == "unsharded":
        return request.applied("one unsharded module")
    world = world_size()
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


def _remove_padding(request: KnobRequest) -> KnobApplication:
    return request.applied(
        "each request scored as one packed row (per-sample positions, no padding)"
        if request.value
        else "each request scored as a right-padded batch with an attention mask"
    )


def _logits_dtype(request: KnobRequest) -> KnobApplication:
    """The lm_head's dtype on a transformers scorer (the training side's, and the reference's
    on hf_pair's rollout side: each reads its own compute dtype)."""
    if request.value == LOGITS_MODEL:
        return request.applied("the lm_head in the compute dtype; the log-softmax in float32")
    dtype = ROLLOUT_DTYPE if request.side == "rollout" else TRAINING_COMPUTE_DTYPE
    if request.knobs.get(dtype.path) == LOGITS_FLOAT32:
        return request.applied_as(
            LOGITS_MODEL, "the model computes in float32: its lm_head already does"
        )
    if request.side == "training":
        if request.knobs.get(TRAINING_SHARDING.path, "unsharded") != "unsharded":
            return request.unsupported("a float32 lm_head is built here on an unsharded model")
        arms = (
            request.knobs.get(TRAINING_ALIGN["logits"].path),
            request.knobs.get(TRAINING_ALIGN_ALL.path),
        )
        if ALIGN_VLLM in arms:
            return request.unsupported(
                "the logits arm computes the lm_head as the rollout's vLLM does: set "
                f"{ROLLOUT_LOGITS_DTYPE.path} for a float32 head on both sides"
            )
    return request.applied(
        "the lm_head's forward casts hidden states and weight to float32 (F.linear), as vLLM's "
        "LogitsProcessor does under head_dtype=float32; the log-softmax in float32"
    )


LOGITS_DTYPE = KnobHandler(_logits_dtype, reads.logits_dtype)


def _temperature(request: KnobRequest) -> KnobApplication:
    if request.value == 1.0:
        return request.applied("the logits as the model computes them (no temperature)")
    if request.knobs.get(TRAINING_SHARDING.path, "unsharded") != "unsharded":
        return request.unsupported("the logits are divided by a temperature on an unsharded model")
    return request.applied(
        f"the lm_head's logits divided by {request.value} before the log-softmax, as verl's "
        "actor does (logits.div_(temperature)); a rollout's raw logprobs are never divided, "
        f"its processed ones by {ROLLOUT_TEMPERATURE.path}"
    )


TRAINING: Mapping[str, KnobHandler] = MappingProxyType(
    {
        BATCH_SIZE.path: CHUNKED_REQUESTS,
        TRAINING_ATTENTION_BACKEND.path: KnobHandler(_attention_backend, reads.attention),
        TRAINING_COMPUTE_DTYPE.path: AT_CONSTRUCTION.reading(reads.compute_dtype),
        TRAINING_SHARDING.path: KnobHandler(_sharding, reads.sharding),
        # extended knobs
        TRAINING_PARAM_DTYPE.path: KnobHandler(_mixed_precision, reads.param_dtype),
        TRAINING_REDUCE_DTYPE.path: KnobHandler(_mixed_precision, reads.reduce_dtype),
        TRAINING_REMOVE_PADDING.path: KnobHandler(_remove_padding, reads.remove_padding),
        TRAINING_LOGITS_DTYPE.path: LOGITS_DTYPE,
        TRAINING_TEMPERATURE.path: KnobHandler(_temperature, reads.temperature),
        # the replacement arms and the scoring shape (align/handlers.py, docs/arms.md)
        **ALIGN_HANDLERS,
    }
)


# -- rollout: the unsharded reference scorer ------------------------------------------------
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
NO_SAMPLER = "the reference scorer has no sampler: its logprobs are the model's raw log-softmax"
# The rollout side is the reference scorer, never vLLM: only these rollout settings exist,
# each read back from the reference's own state (``reads``: its parameters' dtype, one
# unsharded module, the requests it answered) or fixed by how it scores (use_cache=False on
# every forward, eager forwards).
REFERENCE: Mapping[str, KnobHandler] = MappingProxyType(
    {
        ROLLOUT_DTYPE.path: KnobHandler(
            lambda request: request.applied("reference scorer compute dtype"),
            reads.compute_dtype,
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
        ROLLOUT_SCORING_MODE.path: _fixed(
            "prefill",
            "the reference scorer scores the whole frozen sequence in one teacher-forced pass",
            _constant("prefill"),
        ),
        ROLLOUT_LOGITS_DTYPE.path: LOGITS_DTYPE,
        ROLLOUT_LOGPROBS_MODE.path: _fixed("raw_logprobs", NO_SAMPLER, _constant("raw_logprobs")),
        ROLLOUT_TEMPERATURE.path: _fixed(0.0, NO_SAMPLER, _constant(0.0)),
        ROLLOUT_TOP_K.path: _fixed(0, NO_SAMPLER, _constant(0)),
        ROLLOUT_TOP_P.path: _fixed(1.0, NO_SAMPLER, _constant(1.0)),
        BATCH_SIZE.path: CHUNKED_REQUESTS,
    }
)
