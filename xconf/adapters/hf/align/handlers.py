"""The arms' knobs and ``training.scoring_mode`` on the transformers training side.

Each arm knob materializes ``vllm`` only where the training model can compute its kind as
this case's rollout engine does: the rollout side is vLLM (hf_pair's reference scorer has no
kernels to align with), vLLM's CPU kernels importable, the rollout eager, one rank,
the training dtype, an architecture whose layout the forwards know. Anything else is
``unsupported`` with the reason. ``training.align.all=vllm`` aligns every kind: each kind's
own knob then materializes ``vllm`` too, saying why. Every value is read back from the live
model (``apply.arm_counts``: a kind reads ``vllm`` only when every module of it computes as
vLLM, ``off`` when none does, nothing in between).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from xconf.adapters.hf.align import kernels
from xconf.adapters.hf.align.apply import layout_reason
from xconf.knobs import (
    ALIGN_KINDS,
    ALIGN_OFF,
    ALIGN_VLLM,
    LOGITS_FLOAT32,
    LOGITS_MODEL,
    ROLLOUT_BATCH_INVARIANT,
    ROLLOUT_DTYPE,
    ROLLOUT_ENFORCE_EAGER,
    ROLLOUT_KV_CACHE_DTYPE,
    ROLLOUT_LOGITS_DTYPE,
    ROLLOUT_SCORING_MODE,
    ROLLOUT_TENSOR_PARALLEL_SIZE,
    TRAINING_ALIGN,
    TRAINING_ALIGN_ALL,
    TRAINING_COMPUTE_DTYPE,
    TRAINING_SCORING_MODE,
    TRAINING_SHARDING,
    KnobValue,
)
from xconf.runtime.protocol import KnobApplication, KnobHandler, KnobRequest, ReadbackValue

if TYPE_CHECKING:
    from xconf.adapters.hf.scorer import ScorerState

# The rollout side whose kernels the arms call (``runtime/protocol.RuntimeView.rollout_side``).
VLLM_SIDE = "vllm"

HOW = {
    "rms_norm": "vLLM's RMSNorm (its IR rms_norm/fused_add_rms_norm), the residual adds fused "
    "into the next norm as vLLM's decoder layers do",
    "linear": "vLLM's unquantized GEMM dispatch over its fused qkv/gate_up weights",
    "rotary": "vLLM's RotaryEmbedding (its cos/sin cache, forward_cpu)",
    "attention": "vLLM's cpu_attention_with_kv_cache over its paged KV cache",
    "activation": "vLLM's SiluAndMul",
    "logits": "vLLM's logits processor (padded lm_head GEMM) and Sampler.compute_logprobs",
}


def _architecture(request: KnobRequest) -> str | None:
    from xconf.adapters.models.facts import ModelFacts

    model = request.runtime.model
    return model.architecture if isinstance(model, ModelFacts) else None


def support(request: KnobRequest, kind: str | None) -> str | None:
    """Why this case's training side cannot compute ``kind`` (None: the decode mode) as its
    rollout engine does (None: it can)."""
    knobs = request.knobs
    if knobs.get(TRAINING_SHARDING.path, "unsharded") != "unsharded":
        return "the arms replace forwards of an unsharded model; FSDP2 wraps them"
    architecture = _architecture(request)
    reason = None if architecture is None else layout_reason(architecture)
    if reason is not None or kind is None:
        return reason
    rollout_side = request.runtime.rollout_side
    if rollout_side != VLLM_SIDE:
        return (
            f"this runtime's rollout side is {rollout_side!r}, not vLLM: there are no rollout "
            "kernels to align the training side with (hf_pair's rollout is the transformers "
            "reference scorer)"
        )
    reason = kernels.unavailable(request.runtime.device)
    if reason is not None:
        return reason
    if knobs.get(ROLLOUT_ENFORCE_EAGER.path, True) is not True:
        return (
            "the arms build vLLM's layers as an eager engine dispatches them; this case "
            f"compiles the rollout ({ROLLOUT_ENFORCE_EAGER.path}=false)"
        )
    tp = knobs.get(ROLLOUT_TENSOR_PARALLEL_SIZE.path, 1)
    if tp != 1:
        return (
            f"the arms mirror a one-rank rollout; this case's rollout is tensor-parallel over "
            f"{tp} ranks (sharded GEMMs and heads, an all-reduce)"
        )
    rollout, training = knobs.get(ROLLOUT_DTYPE.path), knobs.get(TRAINING_COMPUTE_DTYPE.path)
    if rollout != training:
        return (
            f"the arms run vLLM's kernels in the training dtype ({training}); this case's "
            f"rollout runs {rollout}"
        )
    if knobs.get(ROLLOUT_BATCH_INVARIANT.path) is True:
        return "the rollout runs vLLM's batch-invariant kernels, which the arms do not call"
    head = knobs.get(ROLLOUT_LOGITS_DTYPE.path, LOGITS_MODEL)
    if kind == "logits" and head != LOGITS_MODEL and rollout != LOGITS_FLOAT32:
        return (
            "the logits arm mirrors vLLM's lm_head in the model dtype; this case's rollout "
            f"casts it to float32 ({ROLLOUT_LOGITS_DTYPE.path}=float32)"
        )
    if kind == "attention" and knobs.get(ROLLOUT_SCORING_MODE.path) == "prefill":
        return (
            "the attention arm computes each response token's attention in the decode steps "
            "the rollout ran (vLLM's CPU scheduler splits a query's keys by its step); this "
            f"case's rollout scores the whole sequence as one prefill "
            f"({ROLLOUT_SCORING_MODE.path}=prefill)"
        )
    if kind == "attention" and knobs.get(ROLLOUT_KV_CACHE_DTYPE.path, "auto") != "auto":
        cache = knobs.get(ROLLOUT_KV_CACHE_DTYPE.path)
        return (
            f"the attention arm keeps the KV cache in the model's dtype; the rollout's is {cache}"
        )
    return None


def _kind(kind: str) -> KnobHandler:
    def materialize(request: KnobRequest) -> KnobApplication:
        full = request.knobs.get(TRAINING_ALIGN_ALL.path) == ALIGN_VLLM
        if request.value != ALIGN_VLLM and not full:
            return request.applied(f"the trainer's own {kind} (transformers)")
        why = support(request, kind)
        if why is not None:
            if request.value != ALIGN_VLLM:
                why = f"{TRAINING_ALIGN_ALL.path}=vllm aligns {kind}, which cannot apply: {why}"
            return request.unsupported(why)
        if request.value != ALIGN_VLLM:
            return request.applied_as(ALIGN_VLLM, f"{HOW[kind]} ({TRAINING_ALIGN_ALL.path}=vllm)")
        return request.applied(HOW[kind])

    def read(live: ScorerState) -> ReadbackValue:
        found = [a for a in live.arms if a.kind == kind]
        if len(found) != 1:  # a scorer state that does not count its arms
            return None
        (count,) = found
        if count.replaced == 0:
            return ALIGN_OFF
        return ALIGN_VLLM if count.replaced == count.total else None

    return KnobHandler(materialize, read)


def _all(request: KnobRequest) -> KnobApplication:
    if request.value != ALIGN_VLLM:
        return request.applied("no full arm: each kind follows its own knob")
    for kind in ALIGN_KINDS:
        why = support(request, kind)
        if why is not None:
            return request.unsupported(f"{kind}: {why}")
    return request.applied("every kind computed as vLLM: " + "; ".join(HOW.values()))


def _read_all(live: ScorerState) -> ReadbackValue:
    whole = all(a.replaced == a.total > 0 for a in live.arms)
    return ALIGN_VLLM if whole and live.arms else ALIGN_OFF


def _scoring_mode(request: KnobRequest) -> KnobApplication:
    if request.value == "full":
        return request.applied("one teacher-forced forward per request")
    why = support(request, None)
    if why is not None:
        return request.unsupported(why)
    return request.applied(
        "the rollout engine's steps: the request's prompts in one forward, then one frozen "
        "token per sample per forward, each attending over its sample's KV cache"
    )


def _read_scoring_mode(live: ScorerState) -> ReadbackValue:
    modes = set(live.scoring_modes)
    if len(modes) != 1:
        return None
    mode = modes.pop()
    return mode if mode == "full" or live.decode_ready else None


def training_scorer(knobs: Mapping[str, KnobValue]) -> str:
    """The training scorer's name for a case (part of its execution key)."""
    decode = knobs.get(TRAINING_SCORING_MODE.path) == "decode"
    return "decode" if decode else "teacher-forced"


HANDLERS: Mapping[str, KnobHandler] = {
    **{TRAINING_ALIGN[kind].path: _kind(kind) for kind in ALIGN_KINDS},
    TRAINING_ALIGN_ALL.path: KnobHandler(_all, _read_all),
    TRAINING_SCORING_MODE.path: KnobHandler(_scoring_mode, _read_scoring_mode),
}
