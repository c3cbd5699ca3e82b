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

Sides are ``hf`` (a transformers ``*ForCausalLM``) and ``vllm`` (the model inside an
in-process vLLM engine).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from xconf.localize.errors import LocalizeError

Flavour = Literal["hf", "vllm"]
Read = Literal["tensor", "first", "sum_pair", "logits"]
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
        return dict(dict(self.sides)[flavour])

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


# Qwen3 and Llama share the decoder layout on both sides (transformers and vLLM); each is
# listed on its own so that a new architecture is added only after checking its modules.
_HF: tuple[tuple[str, SideName], ...] = (
    ("embedding", SideName("model.embed_tokens", "tensor")),
    ("attention", SideName("model.layers.{i}.self_attn", "first")),
    ("mlp", SideName("model.layers.{i}.mlp", "tensor")),
    ("residual", SideName("model.layers.{i}", "first")),
    ("final_norm", SideName("model.norm", "tensor")),
    ("logits", SideName("lm_head", "tensor")),
)
_VLLM: tuple[tuple[str, SideName], ...] = (
    ("embedding", SideName("model.embed_tokens", "tensor")),
    ("attention", SideName("model.layers.{i}.self_attn", "tensor")),
    ("mlp", SideName("model.layers.{i}.mlp", "tensor")),
    ("residual", SideName("model.layers.{i}", "sum_pair")),
    ("final_norm", SideName("model.norm", "first")),
    ("logits", SideName("model.norm", "logits")),
)
NAME_MAPS: dict[str, NameMap] = {
    arch: NameMap(arch, (("hf", _HF), ("vllm", _VLLM)))
    for arch in ("Qwen3ForCausalLM", "LlamaForCausalLM")
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
