"""The Megatron side's knob handlers: how each knob is built on this machine, and read back
from the live model (``state.MegatronState``), never from the request.

A knob this side does not list is ``unsupported`` by construction (the one default bind,
``runtime/materialization.default_bind``), and a switch this platform cannot run (a CUDA,
apex or Transformer Engine kernel) is ``unsupported`` with the reason, never silently off.
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from xconf.adapters.errors import ModelFactoryError
from xconf.knobs import (
    BATCH_SIZE,
    LOGP_BACKEND,
    TRAINING_APPLY_ROPE_FUSION,
    TRAINING_ATTENTION_BACKEND,
    TRAINING_BIAS_ACTIVATION_FUSION,
    TRAINING_BIAS_DROPOUT_FUSION,
    TRAINING_COMPUTE_DTYPE,
    TRAINING_CROSS_ENTROPY_LOSS_FUSION,
    TRAINING_MASKED_SOFTMAX_FUSION,
    TRAINING_PARAM_DTYPE,
    TRAINING_REDUCE_DTYPE,
    TRAINING_REMOVE_PADDING,
    TRAINING_SEQUENCE_PARALLEL,
    TRAINING_SHARDING,
    TRAINING_TENSOR_PARALLEL_SIZE,
)
from xconf.runtime.protocol import (
    AT_CONSTRUCTION,
    CHUNKED_REQUESTS,
    KnobApplication,
    KnobHandler,
    KnobRequest,
    ReadBack,
    RuntimeView,
)
from xconf.runtime.ranks import world_size

if TYPE_CHECKING:
    from xconf.adapters.megatron.arch import MegatronArch

ATTENTION = {"native": "eager", "eager": "eager", "sdpa": "sdpa"}


@functools.lru_cache(maxsize=8)
def _arch_of(config_path: str) -> MegatronArch:
    from xconf.adapters.megatron.arch import megatron_arch

    return megatron_arch(Path(config_path).parent)


def megatron_rule(view: RuntimeView) -> MegatronArch | str:
    """Megatron's TP rule for the runtime's frozen checkpoint (or why there is none): the
    view's own when it is Megatron's, else read from the checkpoint the view's facts name
    (a runtime's facts are its rollout engine's, whose TP rule differs: vLLM replicates KV
    heads, Megatron never does)."""
    from xconf.adapters.megatron.arch import MegatronArch
    from xconf.adapters.models.facts import ModelFacts

    rule = view.model
    if rule is None:
        return "no frozen checkpoint to split over TP ranks"
    if isinstance(rule, MegatronArch):
        return rule
    if not isinstance(rule, ModelFacts):
        return f"the runtime's checkpoint facts ({type(rule).__name__}) name no config.json"
    try:
        return _arch_of(rule.config_path)
    except ModelFactoryError as exc:
        return f"Megatron cannot map the checkpoint: {exc.message} ({exc.path})"


def _tensor_parallel(request: KnobRequest) -> KnobApplication:
    tp = int(request.value)
    rule = megatron_rule(request.runtime)
    if isinstance(rule, str):
        return request.unsupported(rule)
    reason = rule.tp_reason(tp)
    if reason is not None:
        allowed = ", ".join(map(str, rule.tp_sizes))
        return request.unsupported(f"{reason} (Megatron allows TP {allowed} for this model)")
    world = world_size()
    if tp > world:
        return request.unsupported(
            f"Megatron TP={tp} needs a launched world of {tp} ranks, this one has {world} "
            "(run under the torchrun launcher)"
        )
    if tp == 1:
        return request.applied("one rank: the whole model, on a private one-rank group")
    return request.applied(
        f"Megatron tensor parallelism over ranks 0..{tp - 1} of the {world}-rank launched world"
    )


def _sequence_parallel(request: KnobRequest) -> KnobApplication:
    if not request.value:
        return request.applied("activations whole on every TP rank")
    tp = int(request.knobs.get(TRAINING_TENSOR_PARALLEL_SIZE.path, 1))
    if tp < 2:
        return request.unsupported("sequence parallelism splits over TP ranks: TP is 1")
    return request.applied(f"norms and residuals split along the sequence over TP={tp}")


def _attention(request: KnobRequest) -> KnobApplication:
    chosen = ATTENTION.get(str(request.value))
    if chosen is None:
        return request.unsupported(
            f"Megatron's local spec has no {request.value} attention here "
            "(eager: its DotProductAttention; sdpa: PyTorch SDPA in the core-attention slot)"
        )
    what = "Megatron's DotProductAttention" if chosen == "eager" else "SDPA core attention"
    return request.applied_as(chosen, what)


def _only(value: object, why: str) -> Callable[[KnobRequest], KnobApplication]:
    """Applied for ``value`` alone (what this side always runs); otherwise ``why``."""

    def materialize(request: KnobRequest) -> KnobApplication:
        if request.value == value:
            return request.applied(f"{value}: no FSDP on the Megatron side")
        return request.unsupported(why)

    return materialize


def _off_or(
    reason: Callable[[KnobRequest], str | None] | None = None,
) -> Callable[[KnobRequest], KnobApplication]:
    """A switch that is always buildable off, and on unless ``reason`` says why not (None:
    always; Megatron's ``jit_fuser`` kernels are torch.compile'd, on CPU as on CUDA)."""

    def materialize(request: KnobRequest) -> KnobApplication:
        if not request.value:
            return request.applied("off: Megatron's unfused path")
        why = reason(request) if reason is not None else None
        return request.unsupported(why) if why else request.applied("on: Megatron's fused path")

    return materialize


def _masked_softmax(request: KnobRequest) -> str | None:
    if ATTENTION.get(str(request.knobs.get(TRAINING_ATTENTION_BACKEND.path, "native"))) == "sdpa":
        return "SDPA attention has no masked-softmax module to fuse"
    if request.runtime.device != "cuda":
        return (
            f"the fused masked softmax is a CUDA kernel; this side runs on {request.runtime.device}"
        )
    if importlib.util.find_spec("scaled_masked_softmax_cuda") is None:
        return "Megatron's fused softmax kernels (scaled_masked_softmax_cuda) are not installed"
    if request.knobs.get(TRAINING_COMPUTE_DTYPE.path, "float32") == "float32":
        # FusedScaleMaskSoftmax runs its kernel on fp16/bf16 scores only: the flag would be
        # set while torch's softmax ran.
        return "the fused masked softmax takes float16/bfloat16 scores; this side runs float32"
    return None


def _rope_fusion(request: KnobRequest) -> str | None:
    if importlib.util.find_spec("transformer_engine") is None:
        return "the fused RoPE kernel comes from Transformer Engine, which is not installed"
    if request.runtime.device != "cuda":
        return f"the fused RoPE kernel is a CUDA kernel; this side runs on {request.runtime.device}"
    return None


def _fused_cross_entropy(request: KnobRequest) -> str | None:
    backend = request.knobs.get(LOGP_BACKEND.path, "native")
    if backend != "native":
        return f"logp.backend={backend} computes the selected logprob, not Megatron's CE"
    return None


# -- readbacks: each from the live state (state.MegatronState) -----------------------------
def _read(field: str) -> ReadBack:
    return lambda live: getattr(live.model, field)


def _dtype(live: Any) -> str | None:
    dtypes = live.model.param_dtypes
    return dtypes[0] if len(dtypes) == 1 else None


def _no_fsdp(value: str) -> ReadBack:
    return lambda live: None if live.model.fsdp_wrapped else value


def _remove_padding(live: Any) -> bool | None:
    kinds = set(live.layouts)
    return (kinds.pop() == "packed") if len(kinds) == 1 else None


def _cross_entropy(live: Any) -> bool | None:
    """Whether the fused CE ran (an operator's call ran no CE: not fused; None: no call)."""
    return {"fused": True, "unfused": False, "operator": False}.get(str(live.cross_entropy))


NO_FSDP = "the Megatron side shards by tensor parallelism (training.tensor_parallel_size)"

HANDLERS: Mapping[str, KnobHandler] = MappingProxyType(
    {
        BATCH_SIZE.path: CHUNKED_REQUESTS,
        TRAINING_COMPUTE_DTYPE.path: AT_CONSTRUCTION.reading(_dtype),
        TRAINING_ATTENTION_BACKEND.path: KnobHandler(_attention, _read("attention")),
        TRAINING_TENSOR_PARALLEL_SIZE.path: KnobHandler(
            _tensor_parallel, _read("tensor_parallel_size")
        ),
        TRAINING_SEQUENCE_PARALLEL.path: KnobHandler(
            _sequence_parallel, _read("sequence_parallel")
        ),
        TRAINING_SHARDING.path: KnobHandler(_only("unsharded", NO_FSDP), _no_fsdp("unsharded")),
        TRAINING_PARAM_DTYPE.path: KnobHandler(_only("none", NO_FSDP), _no_fsdp("none")),
        TRAINING_REDUCE_DTYPE.path: KnobHandler(_only("none", NO_FSDP), _no_fsdp("none")),
        TRAINING_REMOVE_PADDING.path: AT_CONSTRUCTION.reading(_remove_padding),
        TRAINING_BIAS_ACTIVATION_FUSION.path: KnobHandler(
            _off_or(), _read("bias_activation_fusion")
        ),
        TRAINING_BIAS_DROPOUT_FUSION.path: KnobHandler(_off_or(), _read("bias_dropout_fusion")),
        TRAINING_MASKED_SOFTMAX_FUSION.path: KnobHandler(
            _off_or(_masked_softmax), _read("masked_softmax_fusion")
        ),
        TRAINING_APPLY_ROPE_FUSION.path: KnobHandler(
            _off_or(_rope_fusion), _read("apply_rope_fusion")
        ),
        TRAINING_CROSS_ENTROPY_LOSS_FUSION.path: KnobHandler(
            _off_or(_fused_cross_entropy), _cross_entropy
        ),
    }
)
