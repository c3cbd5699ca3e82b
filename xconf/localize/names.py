"""Per-architecture tap name maps: which module's output is which tap on each side.

Taps on the two sides are matched by these maps, never by guessing from module names. A
tap is one logical activation (the embeddings, a decoder layer's attention output, MLP
output or residual stream, the final norm, the logits); each side names the module whose
forward output carries it and how to read that output:

- ``tensor``: the output is the activation.
- ``first``: the activation is the first element of a tuple output (transformers'
  attention returns ``(output, weights)``; vLLM's fused final norm ``(normed, residual)``).
- ``sum_pair``: vLLM decoder layers return ``(mlp_output, residual)`` and add them in the
  next layer's fused norm, so the residual stream after the layer is their sum.
- ``logits``: vLLM computes logits only at sampled positions; the tap is the engine's own
  ``compute_logits`` over the captured final-norm rows (same module, every position).
- ``model_logits``: the ``logits`` field of the model's own output (the root module).
- ``scaled_embedding``: the output times sqrt(its width), in its own dtype (Gemma2's
  embedding scale, which vLLM applies after the embedding module).

Sides are ``hf`` (a transformers ``*ForCausalLM``), ``vllm`` (the model inside an
in-process vLLM engine) and ``megatron`` (a Megatron-core ``GPTModel`` at TP 1, whose
activations are sequence-first ``[s, b, h]``: the recorder transposes them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from xconf.localize.errors import LocalizeError

Flavour = Literal["hf", "vllm", "megatron"]
Read = Literal["tensor", "first", "sum_pair", "logits", "model_logits", "scaled_embedding"]
KINDS = ("embedding", "attention", "mlp", "residual", "final_norm", "logits")
_LABEL = {
    "embedding": "embeddings",
    "attention": "attention output",
    "mlp": "MLP output",
    "residual": "residual stream",
    "final_norm": "final norm",
    "logits": "logits",
}


@dataclass(frozen=True)
class Tap:
    """One logical activation; ``layer`` is None outside the decoder stack."""

    kind: str
    layer: int | None

    @property
    def key(self) -> str:
        return self.kind if self.layer is None else f"layers.{self.layer}.{self.kind}"

    @property
    def label(self) -> str:
        text = _LABEL[self.kind]
        return text if self.layer is None else f"layer {self.layer} {text}"


@dataclass(frozen=True)
class SideName:
    """Where one side's module for a tap lives (``{i}`` is the layer) and how to read it."""

    module: str
    read: Read


@dataclass(frozen=True)
class NameMap:
    """One architecture's module names per side and tap kind."""

    architecture: str
    sides: tuple[tuple[Flavour, tuple[tuple[str, SideName], ...]], ...]

    def side(self, flavour: Flavour) -> dict[str, SideName]:
        sides = dict(self.sides)
        if flavour not in sides:
            raise LocalizeError(
                "localize.no_name_map",
                f"no {flavour} tap names for {self.architecture} "
                f"(it has: {', '.join(sorted(sides))})",
                f"localize.names.{flavour}",
            )
        return dict(sides[flavour])

    def module(self, flavour: Flavour, tap: Tap) -> SideName:
        name = self.side(flavour)[tap.kind]
        layer = "" if tap.layer is None else str(tap.layer)
        return SideName(name.module.replace("{i}", layer), name.read)


def taps(num_layers: int) -> tuple[Tap, ...]:
    """Every tap in execution order: the order in which a first divergence is searched."""
    out = [Tap("embedding", None)]
    for i in range(num_layers):
        out += [Tap("attention", i), Tap("mlp", i), Tap("residual", i)]
    return (*out, Tap("final_norm", None), Tap("logits", None))


# Two decoder layouts cover the listed architectures; each architecture is listed on its own
# so that a new one is added only after its modules were checked on both sides (the matrix
# test, tests/localize/test_localize_matrix.py, localizes every one of them).
#
# transformers' logits tap is the model's own output ``.logits`` (the root module), not
# ``lm_head``: Gemma2 soft-caps the logits after ``lm_head``, as vLLM's ``compute_logits``
# does, and the root output is what the training scorer scores.
_DECODER_HF: tuple[tuple[str, SideName], ...] = (
    ("embedding", SideName("model.embed_tokens", "tensor")),
    ("attention", SideName("model.layers.{i}.self_attn", "first")),
    ("mlp", SideName("model.layers.{i}.mlp", "tensor")),
    ("residual", SideName("model.layers.{i}", "first")),
    ("final_norm", SideName("model.norm", "tensor")),
    ("logits", SideName("", "model_logits")),
)
_DECODER_VLLM: tuple[tuple[str, SideName], ...] = (
    ("embedding", SideName("model.embed_tokens", "tensor")),
    ("attention", SideName("model.layers.{i}.self_attn", "tensor")),
    ("mlp", SideName("model.layers.{i}.mlp", "tensor")),
    ("residual", SideName("model.layers.{i}", "sum_pair")),
    ("final_norm", SideName("model.norm", "first")),
    ("logits", SideName("model.norm", "logits")),
)
# Megatron-core's GPTModel (local spec): its attention and MLP return ``(output, bias)``, its
# layers ``(hidden_states, context)``, its output layer ``(logits, bias)``; the embedding is
# the word embedding (RoPE adds no position embedding), the final norm the decoder's.
_DECODER_MEGATRON: tuple[tuple[str, SideName], ...] = (
    ("embedding", SideName("embedding", "tensor")),
    ("attention", SideName("decoder.layers.{i}.self_attention", "first")),
    ("mlp", SideName("decoder.layers.{i}.mlp", "first")),
    ("residual", SideName("decoder.layers.{i}", "first")),
    ("final_norm", SideName("decoder.final_layernorm", "tensor")),
    ("logits", SideName("output_layer", "first")),
)
# GPT-2: token embeddings ``wte`` (the learned positions ``wpe`` are added after the tap on
# both sides), blocks ``transformer.h.i`` that return the residual stream itself (vLLM adds
# no fused residual pair), LayerNorm ``ln_f``.
_GPT2_HF: tuple[tuple[str, SideName], ...] = (
    ("embedding", SideName("transformer.wte", "tensor")),
    ("attention", SideName("transformer.h.{i}.attn", "first")),
    ("mlp", SideName("transformer.h.{i}.mlp", "tensor")),
    ("residual", SideName("transformer.h.{i}", "first")),
    ("final_norm", SideName("transformer.ln_f", "tensor")),
    ("logits", SideName("", "model_logits")),
)
_GPT2_VLLM: tuple[tuple[str, SideName], ...] = (
    ("embedding", SideName("transformer.wte", "tensor")),
    ("attention", SideName("transformer.h.{i}.attn", "tensor")),
    ("mlp", SideName("transformer.h.{i}.mlp", "tensor")),
    ("residual", SideName("transformer.h.{i}", "tensor")),
    ("final_norm", SideName("transformer.ln_f", "tensor")),
    ("logits", SideName("transformer.ln_f", "logits")),
)
# Gemma2 scales its embeddings by sqrt(hidden): transformers inside ``embed_tokens``
# (a scaled embedding module), vLLM after it (``embed_input_ids``); the vLLM tap applies the
# same scale, in the activation's dtype as both engines do.
_GEMMA2_VLLM = tuple(
    (kind, SideName("model.embed_tokens", "scaled_embedding") if kind == "embedding" else name)
    for kind, name in _DECODER_VLLM
)
_Sides = tuple[tuple[Flavour, tuple[tuple[str, SideName], ...]], ...]
_LAYOUTS: dict[str, _Sides] = {
    "decoder": (("hf", _DECODER_HF), ("vllm", _DECODER_VLLM)),
    # the decoders Megatron's side maps (adapters/megatron/arch.FAMILIES)
    "megatron_decoder": (
        ("hf", _DECODER_HF),
        ("vllm", _DECODER_VLLM),
        ("megatron", _DECODER_MEGATRON),
    ),
    "gemma2": (("hf", _DECODER_HF), ("vllm", _GEMMA2_VLLM)),
    "gpt2": (("hf", _GPT2_HF), ("vllm", _GPT2_VLLM)),
}
ARCHITECTURES: dict[str, str] = {
    "LlamaForCausalLM": "megatron_decoder",
    "MistralForCausalLM": "megatron_decoder",
    "Qwen2ForCausalLM": "megatron_decoder",
    "Qwen3ForCausalLM": "megatron_decoder",
    "Phi3ForCausalLM": "decoder",  # vLLM builds Phi-3 as a Llama (fused qkv_proj inside)
    "Gemma2ForCausalLM": "gemma2",
    "GPT2LMHeadModel": "gpt2",
}
NAME_MAPS: dict[str, NameMap] = {
    arch: NameMap(arch, _LAYOUTS[layout]) for arch, layout in ARCHITECTURES.items()
}


def name_map(architecture: str | None, where: str) -> NameMap:
    """The map for ``architecture``; ``localize.no_name_map`` when there is none."""
    if architecture is None or architecture not in NAME_MAPS:
        raise LocalizeError(
            "localize.no_name_map",
            f"no tap name map for architecture {architecture!r}; "
            f"known: {', '.join(sorted(NAME_MAPS))}",
            where,
        )
    return NAME_MAPS[architecture]


def _architecture_of(model: Any) -> str | None:
    if isinstance(model, str):
        return model
    config = getattr(model, "config", model)
    names = getattr(config, "architectures", None)
    if names is None and isinstance(config, dict):
        names = config.get("architectures")
    if isinstance(names, list | tuple) and names and isinstance(names[0], str):
        return names[0]
    return None


def can_tap(model: Any) -> str | None:
    """Why localize cannot tap ``model``, or None when it can.

    ``model``: an architecture name, a transformers config (or ``config.json`` as a dict),
    or a model (``torch.nn.Module`` with a ``config``). A module is also checked against its
    module tree: every module the map names for its ``hf`` side must exist, for every layer.
    """
    architecture = _architecture_of(model)
    if architecture is None:
        return "the config names no architecture (config.json 'architectures')"
    if architecture not in NAME_MAPS:
        return (
            f"no tap name map for architecture {architecture!r} "
            f"(known: {', '.join(sorted(NAME_MAPS))})"
        )
    get = getattr(model, "get_submodule", None)
    if get is None:
        return None
    config = getattr(model, "config", None)
    layers = getattr(config, "num_hidden_layers", None)
    if not isinstance(layers, int):
        return "the model's config gives no num_hidden_layers"
    names = NAME_MAPS[architecture]
    for tap in taps(layers):
        name = names.module("hf", tap).module
        try:
            get(name)
        except AttributeError:
            return f"{type(model).__name__} has no module {name!r} ({tap.label})"
    return None
