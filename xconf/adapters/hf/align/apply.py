"""Which modules each arm replaces in a loaded transformers model, and the live count.

``install(model, kinds, decode)`` binds the replacement forwards of ``forwards.py`` to the
model's own modules (no parameter, buffer or module name changes: the vLLM layers and their
weight layouts live beside the modules, outside the state dict); ``arm_counts(model)`` reads
back from the live model how many modules of each kind compute as vLLM, against how many the
model has. An arm that cannot apply raises a coded :class:`UnsupportedKnobError` naming its
knob, before anything is replaced.
"""

from __future__ import annotations

import types
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from xconf.adapters.errors import UnsupportedKnobError
from xconf.adapters.hf.align import forwards, kernels
from xconf.adapters.hf.align.forwards import ALIGNED, Aligned
from xconf.knobs import ALIGN_KINDS, TRAINING_ALIGN, TRAINING_SCORING_MODE

# The transformers classes whose decoder layout the forwards know; True: Qwen3's per-head
# q/k norms before the rotary embedding.
LAYOUTS = {
    "LlamaForCausalLM": False,
    "MistralForCausalLM": False,
    "Qwen2ForCausalLM": False,
    "Qwen3ForCausalLM": True,
}
# The arms whose computation lives in the attention module's forward.
ATTENTION_KINDS = frozenset({"linear", "rotary", "attention"})


def layout_reason(architecture: str) -> str | None:
    """Why the arms cannot apply to this architecture (None: they can)."""
    if architecture in LAYOUTS:
        return None
    known = ", ".join(sorted(LAYOUTS))
    return f"the arms know the decoder layout of {known}; {architecture} is not one of them"


@dataclass(frozen=True)
class ArmCount:
    kind: str
    replaced: int  # modules of the kind whose forward computes as vLLM
    total: int  # modules of the kind the arms can replace (0: a layout they do not know)

    def text(self) -> str:
        return f"{self.kind} {self.replaced}/{self.total}"


def _window(attention: Any, config: Any) -> Any:
    """The sliding window the module's own forward passes to its attention function."""
    if type(attention).__name__.startswith("Mistral"):
        return getattr(config, "sliding_window", None)
    return getattr(attention, "sliding_window", None)


def _refuse(kind: str | None, reason: str) -> UnsupportedKnobError:
    path = TRAINING_ALIGN[kind].path if kind else TRAINING_SCORING_MODE.path
    return UnsupportedKnobError("arm.unsupported", reason, path)


def check(model: Any, kinds: frozenset[str], decode: bool, device: str) -> None:
    """Refuse, naming the knob, an arm (or the decode mode) this model or machine cannot run."""
    first = next((k for k in ALIGN_KINDS if k in kinds), None)
    name = type(model).__name__
    if kinds or decode:
        reason = layout_reason(name)
        if reason is not None:
            raise _refuse(first, reason)
    if decode and device != "cpu":
        raise _refuse(None, f"the decode shape mirrors vLLM's CPU engine steps; this is {device}")
    if kinds:
        reason = kernels.unavailable(device)
        if reason is not None:
            raise _refuse(first, reason)
    config = model.config
    if "activation" in kinds and config.hidden_act != "silu":
        raise _refuse(
            "activation", f"vLLM's {name} runs SiluAndMul only; this is {config.hidden_act}"
        )
    if kinds & ATTENTION_KINDS or decode:
        windows = {_window(layer.self_attn, config) for layer in model.get_decoder().layers}
        if windows - {None}:
            raise _refuse(
                next((k for k in ALIGN_KINDS if k in kinds & ATTENTION_KINDS), None),
                f"sliding-window attention ({sorted(windows - {None})}) is not aligned",
            )


def _bind(module: Any, function: Any, aligned: Aligned) -> None:
    module.__dict__[ALIGNED] = aligned
    module.forward = types.MethodType(function, module)


def _norms(model: Any) -> list[tuple[str, Any]]:
    return [(n, m) for n, m in model.named_modules() if type(m).__name__.endswith("RMSNorm")]


def install(model: Any, kinds: Iterable[str], decode: bool, device: str = "cpu") -> None:
    """Replace the forwards the arms ``kinds`` (and the decode mode) need."""
    import torch

    kinds = frozenset(kinds)
    check(model, kinds, decode, device)
    decoder, config = model.get_decoder(), model.config
    dtype = next(model.parameters()).dtype
    names = {id(m): n for n, m in model.named_modules()}
    qk_norm = LAYOUTS[type(model).__name__]
    with torch.no_grad():
        if "rms_norm" in kinds:
            for name, norm in _norms(model):
                vllm_norm = kernels.rms_norm(norm.weight, float(norm.variance_epsilon))
                extra = {"final": norm is decoder.norm}
                aligned = Aligned({"rms_norm": (name,)}, norm=vllm_norm, extra=extra)
                _bind(norm, forwards.norm_forward, aligned)
            for layer in decoder.layers:
                aligned = Aligned({"rms_norm": (names[id(layer)],)})
                _bind(layer, forwards.decoder_layer_forward, aligned)
        for i, layer in enumerate(decoder.layers):
            if kinds & ATTENTION_KINDS or decode:
                _attention(
                    layer.self_attn, i, kinds, names[id(layer.self_attn)], dtype, config, qk_norm
                )
            if kinds & {"linear", "activation"}:
                _mlp(layer.mlp, kinds, names[id(layer.mlp)], dtype)
        if "logits" in kinds:
            head = model.get_output_embeddings()
            vocab = int(config.vocab_size)
            aligned = Aligned(
                {"logits": (names[id(head)],)},
                head=kernels.lm_head(head.weight, vocab),
                vocab_size=vocab,
            )
            _bind(head, forwards.head_forward, aligned)


def _attention(
    attn: Any, index: int, kinds: frozenset[str], name: str, dtype: Any, config: Any, qk_norm: bool
) -> None:
    """The attention forward: always installed for the decode mode; the linear, rotary and
    attention arms each swap in their vLLM computation."""
    covers: dict[str, tuple[str, ...]] = {}
    a = Aligned(covers, layer=index, qk_norm=qk_norm)
    a.extra["heads"] = int(config.num_attention_heads)
    a.extra["kv_heads"] = int(config.num_key_value_heads)
    if not type(attn).__name__.startswith("Llama"):  # these pass their window to attention
        a.extra["sliding_window"] = _window(attn, config)
    if "linear" in kinds:
        projections = (attn.q_proj, attn.k_proj, attn.v_proj)
        biases = [p.bias for p in projections]
        bias = None if biases[0] is None else kernels.fused(biases)
        a.qkv = kernels.Gemm(kernels.fused([p.weight for p in projections]), bias)
        a.o = kernels.Gemm(attn.o_proj.weight, attn.o_proj.bias)
        covers["linear"] = tuple(f"{name}.{p}" for p in ("q_proj", "k_proj", "v_proj", "o_proj"))
    if "rotary" in kinds:
        a.rope = kernels.rope(config, int(attn.head_dim), dtype)
        covers["rotary"] = (name,)
    if "attention" in kinds:
        covers["attention"] = (name,)
    _bind(attn, forwards.attention_forward, a)


def _mlp(mlp: Any, kinds: frozenset[str], name: str, dtype: Any) -> None:
    covers: dict[str, tuple[str, ...]] = {}
    a = Aligned(covers)
    if "linear" in kinds:
        a.gate_up = kernels.Gemm(
            kernels.fused([mlp.gate_proj.weight, mlp.up_proj.weight]), _bias(mlp)
        )
        a.down = kernels.Gemm(mlp.down_proj.weight, mlp.down_proj.bias)
        covers["linear"] = tuple(f"{name}.{p}" for p in ("gate_proj", "up_proj", "down_proj"))
    if "activation" in kinds:
        a.act = kernels.silu_and_mul(dtype)
        covers["activation"] = (name,)
    _bind(mlp, forwards.mlp_forward, a)


def _bias(mlp: Any) -> Any:
    if mlp.gate_proj.bias is None:
        return None
    return kernels.fused([mlp.gate_proj.bias, mlp.up_proj.bias])


def _expected(model: Any) -> dict[str, int]:
    """How many modules of each kind the model has (what a whole arm replaces)."""
    layers = len(model.get_decoder().layers)
    return {
        "rms_norm": len(_norms(model)) + layers,  # the norms and each layer's residual adds
        "linear": 7 * layers,  # q, k, v, o; gate, up, down
        "rotary": layers,
        "attention": layers,
        "activation": layers,
        "logits": 1,
    }


def arm_counts(model: Any) -> tuple[ArmCount, ...]:
    """Per kind, the modules whose live forward computes as vLLM, of those the arms can
    replace. A layout the arms do not know has none they can replace (``total`` 0, its
    layers never read), and the walk still counts any replaced forward it carries: a model
    with none reads back ``off``, as its own kernels compute every module."""
    found = dict.fromkeys(ALIGN_KINDS, 0)
    for module in model.modules():
        aligned = module.__dict__.get(ALIGNED)
        if aligned is not None and module.__dict__.get("forward") is not None:
            for kind, covered in aligned.covers.items():
                found[kind] += len(covered)
    known = layout_reason(type(model).__name__) is None
    expected = _expected(model) if known else dict.fromkeys(ALIGN_KINDS, 0)
    return tuple(ArmCount(k, found[k], expected[k]) for k in ALIGN_KINDS)


def decode_ready(model: Any) -> bool:
    """Every attention module runs the installed forward the decode mode needs."""
    if layout_reason(type(model).__name__) is not None:
        return False
    return all(
        ALIGNED in layer.self_attn.__dict__ and "forward" in layer.self_attn.__dict__
        for layer in model.get_decoder().layers
    )
