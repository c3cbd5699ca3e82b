"""The frozen scoring identity for real runtimes, and the aligned score layout both sides use.

A baseline rollout generates the response tokens once (fixed prompts, fixed seed); from
then on the prompts, response ids, masks and positions are frozen and every case scores
exactly those tokens. Layout: sample ``b`` is ``prompt_ids + response_ids`` (length
``T_b``), right-padded to ``T = max T_b``. The score at ``[b, t]`` is the logprob of
``token_ids[b, t]`` given ``token_ids[b, :t]``; the active mask selects response tokens.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from xconf.adapters.errors import IdentityViolationError, ScoringError

IDENTITY_SCHEMA = "xconf.frozen_identity.v1"
TOKENIZER_POLICY = "prompt_ids+response_ids; no special tokens added; right padding"

DEFAULT_PROMPTS: tuple[str, ...] = (
    "The rollout engine samples tokens and",
    "Question: what is two plus three? Answer:",
    "def score(model, tokens):",
    "Once upon a time a small model",
)


@dataclass(frozen=True)
class FrozenSample:
    prompt_ids: tuple[int, ...]
    response_ids: tuple[int, ...]

    @property
    def token_ids(self) -> tuple[int, ...]:
        return self.prompt_ids + self.response_ids

    @property
    def length(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)


@dataclass(frozen=True)
class FrozenIdentity:
    """Frozen samples plus everything that pins what they mean."""

    samples: tuple[FrozenSample, ...]
    checkpoint_id: str
    model_version: str
    tokenizer_id: str
    pad_token_id: int
    prompts: tuple[str, ...] = ()
    generation: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)

    def __post_init__(self) -> None:
        if not self.samples:
            raise IdentityViolationError("empty_identity", "no frozen samples", "identity")
        for i, s in enumerate(self.samples):
            if not s.prompt_ids or not s.response_ids:
                raise IdentityViolationError(
                    "empty_sample", "prompt and response must be non-empty",
                    f"identity.samples[{i}]",
                )

    @property
    def width(self) -> int:
        return max(s.length for s in self.samples)

    def padded(self) -> dict[str, list[list[int]]]:
        """token_ids, attention_mask, active_mask, position_ids as [B][T] int lists."""
        width = self.width
        token_ids, attn, active, pos = [], [], [], []
        for s in self.samples:
            pad = width - s.length
            token_ids.append(list(s.token_ids) + [self.pad_token_id] * pad)
            attn.append([1] * s.length + [0] * pad)
            active.append([0] * len(s.prompt_ids) + [1] * len(s.response_ids) + [0] * pad)
            pos.append(list(range(s.length)) + [0] * pad)
        return {
            "token_ids": token_ids,
            "attention_mask": attn,
            "active_mask": active,
            "position_ids": pos,
        }

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able record in the v1 identity vocabulary, with its digest."""
        padded = self.padded()
        body: dict[str, Any] = {
            "schema": IDENTITY_SCHEMA,
            "checkpoint_id": self.checkpoint_id,
            "model_version": self.model_version,
            "tokenizer_id": self.tokenizer_id,
            "tokenizer_policy": TOKENIZER_POLICY,
            "prompts": list(self.prompts),
            "prompt_token_ids": [list(s.prompt_ids) for s in self.samples],
            "response_token_ids": [list(s.response_ids) for s in self.samples],
            "token_ids": padded["token_ids"],
            "selected_token_ids": padded["token_ids"],
            "active_mask": padded["active_mask"],
            "attention_mask": padded["attention_mask"],
            "position_ids": padded["position_ids"],
            "pre_update_state": {"checkpoint_sha256": self.checkpoint_id},
            "cache_metadata": {"training_kv_cache": "forbidden"},
            "packing_metadata": {
                "packing": "none",
                "padding_side": "right",
                "pad_token_id": self.pad_token_id,
            },
            "generation": dict(self.generation),
        }
        body["sha256"] = digest(body)
        return body

    @property
    def sha256(self) -> str:
        return str(self.to_dict()["sha256"])

    def chunks(self, batch_size: int) -> list[list[int]]:
        """Sample indices grouped into requests of ``batch_size`` (the last may be short)."""
        if batch_size < 1:
            raise ScoringError("invalid_batch_size", "batch.size must be >= 1", "batch.size")
        idx = list(range(len(self.samples)))
        return [idx[i : i + batch_size] for i in range(0, len(idx), batch_size)]

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FrozenIdentity:
        expected = data.get("sha256")
        prompts = data["prompt_token_ids"]
        responses = data["response_token_ids"]
        pad = int(data["packing_metadata"]["pad_token_id"])
        ident = cls(
            samples=tuple(
                FrozenSample(tuple(int(t) for t in p), tuple(int(t) for t in r))
                for p, r in zip(prompts, responses, strict=True)
            ),
            checkpoint_id=str(data["checkpoint_id"]),
            model_version=str(data["model_version"]),
            tokenizer_id=str(data["tokenizer_id"]),
            pad_token_id=pad,
            prompts=tuple(data.get("prompts", ())),
            generation=dict(data.get("generation", {})),
        )
        if expected is not None and ident.sha256 != expected:
            raise IdentityViolationError(
                "identity_digest_mismatch", "identity record does not match its sha256",
                "identity.sha256",
            )
        return ident


def digest(body: dict[str, Any]) -> str:
    payload = {k: v for k, v in body.items() if k != "sha256"}
    canonical = json.dumps(payload, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


@dataclass(frozen=True)
class ScoreBatch:
    """One side's selected logprobs in the frozen layout (torch tensors, CPU).

    ``logprobs`` [B, T] float32 (0.0 where not scored), ``scored`` [B, T] bool,
    ``token_ids`` [B, T] int64 (the tokens the side actually scored).
    """

    logprobs: Any
    scored: Any
    token_ids: Any
    side: str
    mode: str


def assemble_scores(
    identity: FrozenIdentity,
    per_sample: Sequence[dict[int, float]],
    side: str,
    mode: str,
) -> ScoreBatch:
    """Place ``{position: logprob}`` maps into the padded [B, T] layout."""
    import torch

    padded = identity.padded()
    bsz, width = len(identity.samples), identity.width
    if len(per_sample) != bsz:
        raise ScoringError("score_shape", f"{len(per_sample)} samples scored, expected {bsz}", side)
    logprobs = torch.zeros((bsz, width), dtype=torch.float32)
    scored = torch.zeros((bsz, width), dtype=torch.bool)
    for b, positions in enumerate(per_sample):
        for t, value in positions.items():
            if not 0 < t < identity.samples[b].length:
                raise ScoringError("score_shape", f"position {t} outside sample {b}", side)
            logprobs[b, t] = float(value)
            scored[b, t] = True
    token_ids = torch.tensor(padded["token_ids"], dtype=torch.int64)
    return ScoreBatch(logprobs=logprobs, scored=scored, token_ids=token_ids, side=side, mode=mode)


def active_mask_tensor(identity: FrozenIdentity) -> Any:
    import torch

    return torch.tensor(identity.padded()["active_mask"], dtype=torch.bool)
