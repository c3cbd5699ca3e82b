"""Frozen samples for real runtimes, converted to and from the core's :class:`Identity`.

A baseline rollout generates the response tokens once (fixed prompts, fixed seed); from
then on the prompts, response ids, masks and positions are frozen and every case scores
exactly those tokens. Core layout ([B, T], right-padded): position ``t`` of row ``b``
scores ``selected_token_ids[b, t] == token_ids[b, t + 1]`` given ``token_ids[b, : t + 1]``;
``active_mask[b, t]`` is 1 exactly when that selected token is a response token.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from xconf.adapters.errors import IdentityViolationError, ScoringError
from xconf.canonical import canonical_digest, canonical_json
from xconf.experiment import Identity, ScoringMode
from xconf.knobs import BATCH_SIZE

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
class FrozenBatch:
    """The frozen samples (prompt/response split) every case scores."""

    samples: tuple[FrozenSample, ...]
    pad_token_id: int

    def __post_init__(self) -> None:
        if not self.samples:
            raise IdentityViolationError(
                "identity.empty", "no frozen samples", "identity.token_ids"
            )
        for i, s in enumerate(self.samples):
            if not s.prompt_ids or not s.response_ids:
                raise IdentityViolationError(
                    "identity.empty_sample",
                    "prompt and response must be non-empty",
                    f"identity.token_ids[{i}]",
                )

    @property
    def width(self) -> int:
        return max(s.length for s in self.samples)

    def chunks(self, batch_size: int) -> list[list[int]]:
        """Sample indices grouped into requests of ``batch_size`` (the last may be short)."""
        if batch_size < 1:
            raise ScoringError(
                "runtime.invalid_batch_size", "batch.size must be >= 1", BATCH_SIZE.path
            )
        idx = list(range(len(self.samples)))
        return [idx[i : i + batch_size] for i in range(0, len(idx), batch_size)]

    def layout(self) -> dict[str, list[list[int]]]:
        """The core identity's token-level rows for these samples."""
        width = self.width
        rows: dict[str, list[list[int]]] = {
            k: []
            for k in (
                "token_ids",
                "selected_token_ids",
                "active_mask",
                "attention_mask",
                "position_ids",
            )
        }
        for s in self.samples:
            pad = width - s.length
            ids = list(s.token_ids) + [self.pad_token_id] * pad
            rows["token_ids"].append(ids)
            rows["selected_token_ids"].append([*ids[1:], self.pad_token_id])
            first = len(s.prompt_ids) - 1
            rows["active_mask"].append(
                [1 if first <= t < s.length - 1 else 0 for t in range(width)]
            )
            rows["attention_mask"].append([1] * s.length + [0] * pad)
            rows["position_ids"].append(list(range(s.length)) + [0] * pad)
        return rows

    def cache_bytes(self, key: str) -> bytes:
        """The cached form of these samples under ``key`` (the digest of the recipe and the
        checkpoint that produced them), sealed with the digest of its own content."""
        content = self._content()
        doc = {"key": key, "sha256": canonical_digest(content), **content}
        return json.dumps(doc).encode()

    def _content(self) -> dict[str, Any]:
        return {
            "prompt_ids": [list(s.prompt_ids) for s in self.samples],
            "response_ids": [list(s.response_ids) for s in self.samples],
            "pad_token_id": self.pad_token_id,
        }

    @classmethod
    def from_cache(cls, data: bytes, key: str, vocab_size: int) -> FrozenBatch | None:
        """Samples cached by :meth:`cache_bytes` under exactly ``key``, every id inside the
        checkpoint's vocabulary and the content the digest it records; None (sample again)
        for anything else: a file of another recipe or checkpoint, or one rewritten."""
        from xconf.artifacts.layout import parse_json
        from xconf.errors import ArtifactError

        try:
            doc = parse_json(data, "frozen tokens")
            batch = cls(
                tuple(
                    FrozenSample(tuple(int(t) for t in p), tuple(int(t) for t in r))
                    for p, r in zip(doc["prompt_ids"], doc["response_ids"], strict=True)
                ),
                int(doc["pad_token_id"]),
            )
        except (ArtifactError, IdentityViolationError, KeyError, TypeError, ValueError):
            return None
        ids = [t for s in batch.samples for t in s.token_ids]
        if doc.get("key") != key or doc.get("sha256") != canonical_digest(batch._content()):
            return None
        if not all(0 <= t < vocab_size for t in ids) or not 0 <= batch.pad_token_id < vocab_size:
            return None
        return batch

    @classmethod
    def from_identity(cls, identity: Identity) -> FrozenBatch:
        """Recover the prompt/response split; refuse layouts the real scorers cannot honour."""
        pad = int(json.loads(identity.packing_metadata).get("pad_token_id", 0))
        samples = []
        for b, ids in enumerate(identity.token_ids):
            attn = identity.attention_mask[b]
            length = sum(attn)
            where = f"identity.token_ids[{b}]"
            if list(attn) != [1] * length + [0] * (len(attn) - length):
                raise IdentityViolationError(
                    "identity.unsupported_padding", "only right padding is supported", where
                )
            active = [t for t, a in enumerate(identity.active_mask[b]) if a]
            if not active:
                raise IdentityViolationError("identity.no_response", "no active token", where)
            first = active[0]
            if active != list(range(first, length - 1)):
                raise IdentityViolationError(
                    "identity.unsupported_mask",
                    "active tokens must be the contiguous response after the prompt",
                    f"identity.active_mask[{b}]",
                )
            if list(identity.position_ids[b][:length]) != list(range(length)):
                raise IdentityViolationError(
                    "identity.unsupported_positions", "positions must be 0..len-1", where
                )
            selected = identity.selected_token_ids[b]
            if any(selected[t] != ids[t + 1] for t in active):
                raise IdentityViolationError(
                    "identity.selected_not_next_token",
                    "selected tokens must be the next frozen tokens (teacher forcing)",
                    f"identity.selected_token_ids[{b}]",
                )
            samples.append(FrozenSample(tuple(ids[: first + 1]), tuple(ids[first + 1 : length])))
        return cls(tuple(samples), pad)


def build_identity(
    batch: FrozenBatch,
    *,
    checkpoint_id: str,
    model_version: str,
    tokenizer_id: str,
    pre_update_state: str,
    scoring_mode: ScoringMode,
    recipe: Mapping[str, Any],
    cache_metadata: Mapping[str, Any] | None = None,
) -> Identity:
    rows = batch.layout()

    def t(name: str) -> tuple[tuple[int, ...], ...]:
        return tuple(tuple(r) for r in rows[name])

    def canon(doc: Mapping[str, Any]) -> str:
        return canonical_json(dict(doc), allow_nan=False)

    return Identity(
        checkpoint_id=checkpoint_id,
        model_version=model_version,
        tokenizer_id=tokenizer_id,
        tokenizer_policy=TOKENIZER_POLICY,
        token_ids=t("token_ids"),
        selected_token_ids=t("selected_token_ids"),
        active_mask=t("active_mask"),
        attention_mask=t("attention_mask"),
        position_ids=t("position_ids"),
        pre_update_state=pre_update_state,
        cache_metadata=canon(cache_metadata or {"training_kv_cache": "forbidden"}),
        packing_metadata=canon(
            {"packed": False, "padding_side": "right", "pad_token_id": batch.pad_token_id}
        ),
        scoring_mode=scoring_mode,
        recipe=canon(recipe),
    )


def assemble_scores(
    batch: FrozenBatch, per_sample: Sequence[Mapping[int, float]], side: str
) -> Any:
    """``{position: logprob}`` maps -> float32 [B, T] (0.0 where a side scored nothing)."""
    import torch

    if len(per_sample) != len(batch.samples):
        raise ScoringError(
            "runtime.score_shape",
            f"{len(per_sample)} samples scored, expected {len(batch.samples)}",
            side,
        )
    out = torch.zeros((len(batch.samples), batch.width), dtype=torch.float32)
    for b, positions in enumerate(per_sample):
        limit = batch.samples[b].length - 1
        for t, value in positions.items():
            if not 0 <= t < limit:
                raise ScoringError("runtime.score_shape", f"position {t} outside sample {b}", side)
            out[b, t] = float(value)
    return out


class VocabRows:
    """The full-vocabulary logits rows a side computed for its active tokens, kept as it
    scores (sample, position -> one [vocab] row) and handed over row-major over the active
    mask (:meth:`active_rows`), the order ``SideScore.vocab_rows`` is in."""

    def __init__(self, batch: FrozenBatch) -> None:
        self.batch = batch
        self._rows: list[dict[int, Any]] = [{} for _ in batch.samples]

    def keep(self, sample: int, positions: Sequence[int], rows: Any) -> None:
        """Keep ``rows[k]`` ([n, vocab]) for ``positions[k]`` of ``sample``, active ones only."""
        first = len(self.batch.samples[sample].prompt_ids) - 1
        for k, position in enumerate(positions):
            if position >= first:
                self._rows[sample][int(position)] = rows[k]

    def active_rows(self) -> Any:
        """[active tokens, vocab] float32, or None when a row is missing or widths differ."""
        import torch

        picked = []
        for b, sample in enumerate(self.batch.samples):
            first = len(sample.prompt_ids) - 1
            for t in range(first, sample.length - 1):
                row = self._rows[b].get(t)
                if row is None:
                    return None
                picked.append(row)
        if not picked or len({int(r.shape[-1]) for r in picked}) != 1:
            return None
        return torch.stack(picked).to(torch.float32)
