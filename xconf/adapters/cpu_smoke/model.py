"""A deterministic synthetic causal language model: one attention block, random weights."""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from xconf.adapters.cpu_smoke.limits import MAX_POSITIONS, VOCAB_SIZE

AttentionKind = Literal["eager", "sdpa"]


@dataclass(frozen=True)
class SyntheticModelConfig:
    """Sizes are small on purpose; the vocabulary is odd so tiles never divide it evenly."""

    vocab_size: int = VOCAB_SIZE
    hidden_size: int = 32
    max_positions: int = MAX_POSITIONS
    seed: int = 0
    head_scale: float = 4.0  # sharpens logits so drift is visible, not lost in a flat softmax

    # What an S0 identity must name: the synthetic model family and its id-only tokenizer.
    model_version: str = "synthetic-causal-v1"
    tokenizer_id: str = "synthetic-ids-v1"

    @property
    def checkpoint_id(self) -> str:
        return (
            f"synthetic-causal-v1:seed={self.seed}:vocab={self.vocab_size}"
            f":hidden={self.hidden_size}:pos={self.max_positions}"
        )


class SyntheticCausalLM(nn.Module):
    def __init__(self, config: SyntheticModelConfig) -> None:
        super().__init__()
        self.config = config
        g = torch.Generator().manual_seed(config.seed)
        v, d = config.vocab_size, config.hidden_size

        def init(*shape: int, scale: float) -> nn.Parameter:
            return nn.Parameter(torch.randn(*shape, generator=g, dtype=torch.float64) * scale)

        self.embed = init(v, d, scale=1.0)
        self.pos = init(config.max_positions, d, scale=0.1)
        self.wq = init(d, d, scale=1 / math.sqrt(d))
        self.wk = init(d, d, scale=1 / math.sqrt(d))
        self.wv = init(d, d, scale=1 / math.sqrt(d))
        self.wo = init(d, d, scale=1 / math.sqrt(d))
        self.w1 = init(d, 2 * d, scale=1 / math.sqrt(d))
        self.w2 = init(2 * d, d, scale=1 / math.sqrt(2 * d))
        self.head = init(d, v, scale=config.head_scale / math.sqrt(d))
        self.norm_eps: torch.Tensor
        self.register_buffer("norm_eps", torch.tensor(1e-6, dtype=torch.float64))
        self.embedded: list[tuple[torch.Tensor, torch.Tensor]] = []

    def state_digest(self) -> str:
        digest = hashlib.sha256()
        for name, tensor in sorted(self.state_dict().items()):
            digest.update(name.encode())
            digest.update(
                tensor.detach().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes()
            )
        return digest.hexdigest()

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.norm_eps.to(x.dtype))

    def embed_tokens(self, token_ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        # The model's own record of what it embedded (the runner checks it against the frozen
        # tokens): independent of what a scorer says it scored.
        self.embedded.append((token_ids.detach().clone(), position_ids.detach().clone()))
        return self.embed[token_ids] + self.pos[position_ids]

    def project_qkv(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x = self._norm(h)
        return x @ self.wq, x @ self.wk, x @ self.wv

    def finish(self, h: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        h = h + attended @ self.wo
        h = h + F.gelu(self._norm(h) @ self.w1) @ self.w2
        return self._norm(h) @ self.head

    def forward_full(
        self, token_ids: torch.Tensor, position_ids: torch.Tensor, attention: AttentionKind
    ) -> torch.Tensor:
        """Teacher-forced logits [B, T, V] for every position, no cache."""
        h = self.embed_tokens(token_ids, position_ids)
        q, k, v = self.project_qkv(h)
        if attention == "sdpa":
            attended = F.scaled_dot_product_attention(
                q.unsqueeze(1), k.unsqueeze(1), v.unsqueeze(1), is_causal=True
            ).squeeze(1)
        else:
            t = token_ids.shape[1]
            scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
            causal = torch.ones(t, t, dtype=torch.bool).tril()
            scores = scores.masked_fill(~causal, float("-inf"))
            attended = torch.softmax(scores, dim=-1) @ v
        return self.finish(h, attended)

    def forward_step(
        self,
        token_ids: torch.Tensor,
        position_ids: torch.Tensor,
        cache: tuple[torch.Tensor, torch.Tensor] | None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """One decode step [B] -> logits [B, V], appending to the KV cache."""
        h = self.embed_tokens(token_ids, position_ids)
        q, k, v = self.project_qkv(h)
        keys = k.unsqueeze(1) if cache is None else torch.cat([cache[0], k.unsqueeze(1)], 1)
        values = v.unsqueeze(1) if cache is None else torch.cat([cache[1], v.unsqueeze(1)], 1)
        scores = (keys @ q.unsqueeze(-1)).squeeze(-1) / math.sqrt(q.shape[-1])
        weights = torch.softmax(scores, dim=-1)
        attended = (weights.unsqueeze(-1) * values).sum(1)
        return self.finish(h, attended), (keys, values)


def build_model(config: SyntheticModelConfig, dtype: torch.dtype) -> SyntheticCausalLM:
    model = SyntheticCausalLM(config)
    return model.to(dtype)
