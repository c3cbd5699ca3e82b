"""xconf's modules for the slots of Megatron's layer spec: SDPA attention, a sequence-parallel
RMSNorm.

**SdpaAttention.**

Megatron's local spec computes attention with its own ``DotProductAttention`` (``baddbmm``, a
masked softmax, ``bmm``: the explicit path transformers calls ``eager``). The layer spec is
Megatron's extension point for the core attention, so ``training.attention_backend=sdpa``
builds the same ``GPTModel`` with this module in that slot: the same query, key and value
(Megatron's own projections, RoPE and q/k norms), the same explicit mask, combined by
``torch.nn.functional.scaled_dot_product_attention``, as transformers' ``sdpa`` does (KV
heads repeated to the query heads first, as its ``repeat_kv``).

**SequenceParallelRMSNorm.** Without apex or Transformer Engine the local spec's norm is
``WrappedTorchNorm``, which refuses sequence parallelism: it cannot mark its weight for the
gradient all-reduce a sequence-parallel norm needs in training. This is the same
``torch.nn.RMSNorm`` (the same forward, bit for bit) with its weight marked as apex's
``FusedLayerNorm`` marks it; scoring computes no gradient, so the mark is the whole difference.
"""

from __future__ import annotations

import math
from typing import Any

from xconf.adapters.megatron.shims import import_megatron

import_megatron()

import torch  # noqa: E402
from megatron.core.transformer.module import MegatronModule  # noqa: E402


class SdpaAttention(MegatronModule):  # type: ignore[misc]
    """``DotProductAttention``'s interface (``[s, b, heads, head_dim]`` in, ``[s, b, hidden]``
    out), computed with SDPA; no parameters, no dropout (scoring runs in eval mode)."""

    def __init__(
        self,
        config: Any,
        layer_number: int,
        attn_mask_type: Any,
        attention_type: str,
        attention_dropout: float | None = None,
        softmax_scale: float | None = None,
        cp_comm_type: str | None = None,
        pg_collection: Any = None,
    ) -> None:
        super().__init__(config=config)
        if pg_collection is None or not hasattr(pg_collection, "tp"):
            raise ValueError("SdpaAttention needs the model's process groups (pg_collection.tp)")
        tp = pg_collection.tp.size()
        self.heads = config.num_attention_heads // tp
        self.groups = config.num_query_groups // tp
        self.softmax_scale = (
            1.0 / math.sqrt(config.kv_channels) if softmax_scale is None else softmax_scale
        )

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        attn_mask_type: Any = None,
        attention_bias: Any = None,
        packed_seq_params: Any = None,
    ) -> torch.Tensor:
        if packed_seq_params is not None or attention_bias is not None:
            raise ValueError("SdpaAttention takes an explicit mask, no packing or bias")
        if self.heads != self.groups:
            repeat = self.heads // self.groups
            key = key.repeat_interleave(repeat, dim=2)
            value = value.repeat_interleave(repeat, dim=2)
        # [s, b, n, d] -> [b, n, s, d]
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))
        # Megatron's mask is True where a key is hidden; SDPA's boolean mask where it is seen.
        allowed = None if attention_mask is None else ~attention_mask
        out = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=allowed, dropout_p=0.0, scale=self.softmax_scale
        )
        s, b = query.shape[0], query.shape[1]
        return out.permute(2, 0, 1, 3).reshape(s, b, self.heads * query.shape[-1])


class SequenceParallelRMSNorm(torch.nn.RMSNorm):
    """``torch.nn.RMSNorm`` built as a Megatron norm, its weight marked ``sequence_parallel``."""

    def __init__(
        self,
        config: Any,
        hidden_size: int,
        eps: float = 1e-5,
        persist_layer_norm: bool = False,
        zero_centered_gamma: bool = False,
        normalization: str = "RMSNorm",
    ) -> None:
        if (
            normalization != "RMSNorm"
            or zero_centered_gamma
            or config.layernorm_zero_centered_gamma
        ):
            raise ValueError("SequenceParallelRMSNorm is a plain RMSNorm")
        super().__init__(normalized_shape=hidden_size, eps=eps)
        self.weight.sequence_parallel = bool(config.sequence_parallel)  # type: ignore[attr-defined]
