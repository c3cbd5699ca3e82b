"""What a Hugging Face checkpoint is, as Megatron's local GPT spec can build it.

``megatron_arch(dir)`` reads ``config.json`` through transformers' own ``AutoConfig`` (the
library's defaults apply, nothing is built, no checkpoint code runs) and returns a frozen
:class:`MegatronArch`, or refuses with a coded error naming the config field: a checkpoint this
side cannot map tensor for tensor is never approximated. What it maps: decoder-only Llama,
Mistral, Qwen2 and Qwen3 (RMSNorm, SwiGLU, RoPE, grouped-query attention; Qwen2's QKV bias,
Qwen3's per-head q/k RMSNorm, tied or untied embeddings). What it refuses: every other model
type, another activation, scaled or partial RoPE, sliding-window layers, biases the spec has no
place for (an attention output or MLP bias), mixtures of experts.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from xconf.adapters.errors import ModelFactoryError

# model_type -> (QKV bias, per-head q/k norm): what each family's decoder layer holds.
FAMILIES: dict[str, tuple[bool, bool]] = {
    "llama": (False, False),
    "mistral": (False, False),
    "qwen2": (True, False),
    "qwen3": (False, True),
}
# Config fields that name experts: a mixture of experts maps to a different spec.
EXPERT_FIELDS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_intermediate_size")
UNMAPPABLE = "model.megatron_unmappable"


@dataclass(frozen=True)
class MegatronArch:
    """A decoder-only checkpoint as Megatron's ``GPTModel`` is built for it."""

    config_path: str
    model_type: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    ffn_hidden_size: int
    vocab_size: int
    max_positions: int
    norm_eps: float
    rope_theta: float
    tied_embeddings: bool
    qkv_bias: bool
    qk_layernorm: bool

    def tp_reason(self, tp: int) -> str | None:
        """Why Megatron cannot split this model over ``tp`` ranks (None: it can).

        Megatron never replicates a KV head: heads, KV heads (query groups), the MLP and the
        vocabulary (no padding is added) each divide by TP."""
        if tp < 1:
            return f"TP={tp} is not a positive size"
        for count, what in (
            (self.num_heads, "attention heads"),
            (self.num_kv_heads, "KV heads (Megatron replicates none)"),
            (self.ffn_hidden_size, "MLP columns"),
            (self.vocab_size, "vocabulary rows"),
        ):
            if count % tp:
                return f"{count} {what} do not split over TP={tp}"
        return None

    @property
    def tp_sizes(self) -> tuple[int, ...]:
        return tuple(t for t in range(1, self.num_heads + 1) if self.tp_reason(t) is None)


def _refuse(cfg_path: Path, field: str, message: str) -> ModelFactoryError:
    return ModelFactoryError(UNMAPPABLE, message, f"{cfg_path}:{field}")


def _rope_theta(cfg: Any, cfg_path: Path) -> float:
    """The RoPE base of plain (unscaled, full-width) rotary embeddings; anything else refused."""
    params = getattr(cfg, "rope_parameters", None) or {}
    scaling = getattr(cfg, "rope_scaling", None) or {}
    kind = params.get("rope_type") or scaling.get("rope_type") or scaling.get("type") or "default"
    if kind != "default":
        field = "rope_parameters" if params else "rope_scaling"
        raise _refuse(cfg_path, field, f"RoPE type '{kind}' is not mapped (only 'default')")
    partial = params.get("partial_rotary_factor", getattr(cfg, "partial_rotary_factor", 1.0))
    if partial not in (None, 1, 1.0):
        raise _refuse(
            cfg_path, "partial_rotary_factor", f"partial rotary factor {partial} is not mapped"
        )
    theta = params.get("rope_theta", getattr(cfg, "rope_theta", None))
    if not isinstance(theta, (int, float)) or isinstance(theta, bool) or theta <= 0:
        raise _refuse(cfg_path, "rope_theta", f"no positive RoPE base, got {theta!r}")
    return float(theta)


def _refuse_unmapped_features(cfg: Any, cfg_path: Path) -> None:
    if getattr(cfg, "hidden_act", None) != "silu":
        raise _refuse(
            cfg_path,
            "hidden_act",
            f"activation '{getattr(cfg, 'hidden_act', None)}' is not mapped (SwiGLU needs silu)",
        )
    for field in EXPERT_FIELDS:
        if getattr(cfg, field, None):
            raise _refuse(cfg_path, field, f"a mixture of experts ({field}) is not mapped")
    if getattr(cfg, "mlp_bias", False):
        raise _refuse(cfg_path, "mlp_bias", "MLP biases are not mapped")
    if getattr(cfg, "attention_bias", False):
        raise _refuse(
            cfg_path, "attention_bias", "attention biases on every projection are not mapped"
        )
    # Qwen's configs switch sliding windows with use_sliding_window; Mistral's by the window.
    for field in ("use_sliding_window", "sliding_window"):
        if getattr(cfg, field, None):
            raise _refuse(cfg_path, field, "sliding-window attention is not mapped")
    kinds = set(getattr(cfg, "layer_types", None) or ("full_attention",))
    if kinds != {"full_attention"}:
        raise _refuse(cfg_path, "layer_types", f"layer types {sorted(kinds)} are not mapped")


def _int(cfg: Any, field: str, cfg_path: Path, default: int | None = None) -> int:
    value = getattr(cfg, field, None)
    value = default if value is None else value
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ModelFactoryError(
            "model.bad_config",
            f"config.json: '{field}' must be a positive integer, got {value!r}",
            f"{cfg_path}:{field}",
        )
    return value


def megatron_arch(root: Path | str, trust_remote_code: bool = False) -> MegatronArch:
    """The checkpoint's Megatron build, or a coded refusal naming ``config.json:field``."""
    from xconf.adapters.models.facts import read_config

    root = Path(root)
    cfg_path = root / "config.json"
    cfg = read_config(root, trust_remote_code)
    model_type = str(cfg.model_type)
    if model_type not in FAMILIES:
        raise _refuse(
            cfg_path,
            "model_type",
            f"model_type '{model_type}' is not mapped to Megatron (mapped: {sorted(FAMILIES)})",
        )
    _refuse_unmapped_features(cfg, cfg_path)
    heads = _int(cfg, "num_attention_heads", cfg_path)
    hidden = _int(cfg, "hidden_size", cfg_path)
    kv = _int(cfg, "num_key_value_heads", cfg_path, default=heads)
    if heads % kv:
        raise _refuse(
            cfg_path, "num_key_value_heads", f"{heads} heads are not a multiple of {kv} KV heads"
        )
    eps = getattr(cfg, "rms_norm_eps", None)
    if not isinstance(eps, float) or eps <= 0:
        raise _refuse(cfg_path, "rms_norm_eps", f"no positive RMSNorm epsilon, got {eps!r}")
    qkv_bias, qk_norm = FAMILIES[model_type]
    return MegatronArch(
        config_path=str(cfg_path),
        model_type=model_type,
        num_layers=_int(cfg, "num_hidden_layers", cfg_path),
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=kv,
        head_dim=_int(
            cfg, "head_dim", cfg_path, default=hidden // heads if hidden % heads == 0 else None
        ),
        ffn_hidden_size=_int(cfg, "intermediate_size", cfg_path),
        vocab_size=_int(cfg, "vocab_size", cfg_path),
        max_positions=_int(cfg, "max_position_embeddings", cfg_path),
        norm_eps=float(eps),
        rope_theta=_rope_theta(cfg, cfg_path),
        tied_embeddings=bool(getattr(cfg, "tie_word_embeddings", False)),
        qkv_bias=qkv_bias,
        qk_layernorm=qk_norm,
    )
