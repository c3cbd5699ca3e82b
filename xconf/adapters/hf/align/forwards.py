"""The replacement forwards of the Llama-family layout (Llama, Mistral, Qwen2, Qwen3).

Each is bound to one module of the loaded transformers model (``apply.py``) and reads that
module's :class:`Aligned` record (``module._xconf_align``): which arms it computes as vLLM
does and the vLLM layers it calls. Everything an arm does not cover is the module's own
transformers computation, called as transformers calls it (the module's own ``q_proj``, the
modeling file's own ``apply_rotary_pos_emb``, the model's own attention function with the
mask the model built), so one arm changes one kind of computation.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

from xconf.adapters.hf.align.step import Carry, current

ALIGNED = "_xconf_align"


@dataclass
class Aligned:
    """One module's replaced forward: the arms it computes as vLLM (kind -> the modules of
    that kind it covers) and what it calls."""

    covers: dict[str, tuple[str, ...]]
    norm: Any = None  # vLLM RMSNorm sharing the module's weight
    qkv: Any = None  # kernels.Gemm over the fused q, k, v weights
    o: Any = None
    gate_up: Any = None  # kernels.Gemm over the fused gate, up weights
    down: Any = None
    rope: Any = None  # vLLM RotaryEmbedding
    act: Any = None  # vLLM SiluAndMul
    head: Any = None  # kernels.Gemm over the padded lm_head weight
    vocab_size: int = 0
    layer: int = 0
    qk_norm: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


def state(module: Any) -> Aligned:
    return module.__dict__[ALIGNED]  # type: ignore[no-any-return]


# -- rms_norm arm -----------------------------------------------------------------------------
def norm_forward(self: Any, hidden_states: Any) -> Any:
    """vLLM's RMSNorm; the final norm takes the last layer's pending residual add."""
    step = current("an aligned RMSNorm")
    carry = step.take_carry(hidden_states) if state(self).extra.get("final") else None
    if carry is None:
        return state(self).norm(hidden_states)
    out, _ = state(self).norm(carry.out, carry.residual)
    return out


def decoder_layer_forward(
    self: Any,
    hidden_states: Any,
    attention_mask: Any = None,
    position_ids: Any = None,
    past_key_values: Any = None,
    use_cache: bool | None = False,
    position_embeddings: Any = None,
    **kwargs: Any,
) -> Any:
    """vLLM's decoder-layer dataflow (the rms_norm arm replaces every norm with vLLM's): each
    residual add happens inside the next fused ``fused_add_rms_norm`` (the next layer's input
    norm, or the final norm)."""
    step = current("an aligned decoder layer")
    carry = step.take_carry(hidden_states)
    vllm_norm = state(self.input_layernorm).norm
    if carry is None:
        residual = hidden_states
        h = vllm_norm(hidden_states)
    else:
        h, residual = vllm_norm(carry.out, carry.residual)
    h, _ = self.self_attn(
        hidden_states=h,
        attention_mask=attention_mask,
        position_ids=position_ids,
        past_key_values=past_key_values,
        use_cache=use_cache,
        position_embeddings=position_embeddings,
        **kwargs,
    )
    h, residual = state(self.post_attention_layernorm).norm(h, residual)
    h = self.mlp(h)
    total = residual + h
    step.carry = Carry(h, residual, total)
    return total


# -- attention: the linear, rotary and attention arms, and the decode mode ------------------
def attention_forward(
    self: Any,
    hidden_states: Any,
    position_embeddings: Any = None,
    attention_mask: Any = None,
    past_key_values: Any = None,
    **kwargs: Any,
) -> tuple[Any, None]:
    step = current("an aligned attention")
    a = state(self)
    batch, width, _ = hidden_states.shape
    heads, kv_heads = a.extra["heads"], a.extra["kv_heads"]
    head_dim = self.head_dim
    if a.qkv is not None:
        q, k, v = a.qkv(hidden_states).split(
            [heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1
        )
    else:
        q, k, v = self.q_proj(hidden_states), self.k_proj(hidden_states), self.v_proj(hidden_states)
    q = q.reshape(batch, width, heads, head_dim)
    k = k.reshape(batch, width, kv_heads, head_dim)
    v = v.reshape(batch, width, kv_heads, head_dim)
    if a.qk_norm:  # Qwen3: per-head norms before the rotary embedding
        q, k = self.q_norm(q), self.k_norm(k)
    if a.rope is not None:
        q = q.reshape(batch * width, heads * head_dim).contiguous()
        k = k.reshape(batch * width, kv_heads * head_dim).contiguous()
        q, k = a.rope(step.positions.reshape(-1), q, k)  # in place, vLLM's cos/sin cache
        q = q.reshape(batch, width, heads, head_dim).transpose(1, 2)
        k = k.reshape(batch, width, kv_heads, head_dim).transpose(1, 2)
    else:
        cos, sin = position_embeddings
        rotary = sys.modules[type(self).__module__].apply_rotary_pos_emb
        q, k = rotary(q.transpose(1, 2), k.transpose(1, 2), cos, sin)
    v = v.transpose(1, 2)
    if "sliding_window" in a.extra:
        kwargs = {**kwargs, "sliding_window": a.extra["sliding_window"]}
    out = step.attention.attend(self, a.layer, q, k, v, attention_mask, step, **kwargs)
    out = out.reshape(batch, width, heads * head_dim).contiguous()
    return (a.o(out) if a.o is not None else self.o_proj(out)), None


# -- MLP: the linear and activation arms ------------------------------------------------------
def mlp_forward(self: Any, x: Any) -> Any:
    a = state(self)
    if a.gate_up is not None:
        both = a.gate_up(x)
    else:
        gate, up = self.gate_proj(x), self.up_proj(x)
        both = None
    if a.act is not None:
        if both is None:
            import torch

            both = torch.cat([gate, up], dim=-1)  # vLLM's gate_up layout
        y = a.act(both)
    else:
        if both is not None:
            gate, up = both.chunk(2, dim=-1)
        y = self.act_fn(gate) * up
    return a.down(y) if a.down is not None else self.down_proj(y)


# -- logits arm -------------------------------------------------------------------------------
def head_forward(self: Any, hidden_states: Any) -> Any:
    """vLLM's logits processor: the padded lm_head GEMM, cut back to the real vocabulary."""
    a = state(self)
    return a.head(hidden_states)[..., : a.vocab_size]
