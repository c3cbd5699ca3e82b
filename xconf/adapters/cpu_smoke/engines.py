"""Rollout and training engines over the synthetic model; both score frozen tokens read-only."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from xconf.adapters.cpu_smoke.model import (
    AttentionKind,
    SyntheticCausalLM,
    SyntheticModelConfig,
    build_model,
)
from xconf.adapters.cpu_smoke.state import RolloutState, TrainingState
from xconf.errors import IdentityViolation, XconfError
from xconf.experiment import Identity
from xconf.knobs import DTYPES as KNOB_DTYPES
from xconf.ops.logprob.contract import ShardingSpec
from xconf.runtime.protocol import (
    FrozenInputs,
    ReadbackValue,
    ReadOnlyEvidence,
    SelectedLogprobOp,
    SideScore,
)

# What an engine reports from its live state: its side's readback (``side.py``'s spec).
ReadBackState = Callable[[Any], Mapping[str, ReadbackValue]]

DTYPES: dict[str, torch.dtype] = {name: getattr(torch, name) for name in KNOB_DTYPES}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}
PREFIX_BLOCK = 4  # tokens per cached prefix block


def _selected(
    logits: torch.Tensor, targets: torch.Tensor, active: torch.Tensor, op: SelectedLogprobOp | None
) -> torch.Tensor:
    """[b, T, V] logits -> [b, T] float32 selected logprobs, natively or through ``op``."""
    if op is None:  # the runtime's own path: log_softmax in its compute dtype
        native = torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        return native.float()
    b, t, v = logits.shape
    flat = op(logits.reshape(b * t, v), targets.reshape(b * t), active.reshape(b * t))
    return flat.reshape(b, t).float()


def check_limits(config: SyntheticModelConfig, inputs: FrozenInputs) -> None:
    """Token ids inside the vocabulary, positions and lengths inside the model's context."""
    limit = config.vocab_size
    for name, ids in (
        ("token_ids", inputs.token_ids),
        ("selected_token_ids", inputs.selected_token_ids),
    ):
        if ids.numel() and (int(ids.max()) >= limit or int(ids.min()) < 0):
            raise XconfError(
                "runtime.token_out_of_vocab",
                f"{name} outside the synthetic model's vocabulary [0, {limit})",
                f"identity.{name}",
            )
    positions = inputs.position_ids
    if inputs.token_ids.shape[1] > config.max_positions or (
        positions.numel() and int(positions.max()) >= config.max_positions
    ):
        raise XconfError(
            "runtime.sequence_too_long",
            f"sequences or positions beyond the model's context of {config.max_positions}",
            "identity.token_ids",
        )


class _SyntheticEngine:
    def __init__(self, config: SyntheticModelConfig, dtype: str, readback: ReadBackState) -> None:
        self.config = config
        self._readback = readback
        self.model: SyntheticCausalLM = build_model(config, DTYPES[dtype])
        self.request_size: int | None = None  # batch size of the last scoring call
        self.request_sizes: list[int] = []  # rows of every request the last call ran

    def vocab_layout(self) -> ShardingSpec:
        """The output head as built (its embedding rows): one shard, nothing padded."""
        rows = int(self.model.embed.shape[0])
        return ShardingSpec(self.config.vocab_size, rows, ((0, rows),))

    def _check_identity(self, inputs: FrozenInputs, identity: Identity) -> None:
        check_limits(self.config, inputs)
        for field in ("model_version", "tokenizer_id"):
            if getattr(identity, field) != getattr(self.config, field):
                raise IdentityViolation(
                    f"runtime.{field}_mismatch",
                    f"identity names {field} '{getattr(identity, field)}', the synthetic model "
                    f"is '{getattr(self.config, field)}'",
                    f"identity.{field}",
                )
        if identity.checkpoint_id != self.config.checkpoint_id:
            raise IdentityViolation(
                "runtime.checkpoint_mismatch",
                f"identity names checkpoint '{identity.checkpoint_id}', the synthetic model is "
                f"'{self.config.checkpoint_id}'",
                "identity.checkpoint_id",
            )

    def _score(
        self,
        inputs: FrozenInputs,
        identity: Identity,
        batch_size: int,
        op: SelectedLogprobOp | None,
    ) -> SideScore:
        self._check_identity(inputs, identity)
        self.request_size = batch_size
        self.request_sizes = []
        self.model.embedded.clear()
        was_training = self.model.training
        before = self.model.state_digest()
        self.model.eval()
        chunks = []
        try:
            with torch.no_grad():
                for start in range(0, inputs.token_ids.shape[0], batch_size):
                    rows = slice(start, start + batch_size)
                    logits = self._logits(inputs.token_ids[rows], inputs.position_ids[rows])
                    self.request_sizes.append(int(logits.shape[0]))
                    chunks.append(
                        _selected(
                            logits, inputs.selected_token_ids[rows], inputs.active_mask[rows], op
                        )
                    )
        finally:
            self.model.train(was_training)
        evidence = ReadOnlyEvidence(
            state_digest_before=before,
            state_digest_after=self.model.state_digest(),
            mode_restored=self.model.training == was_training,
            used_kv_cache=self._uses_kv_cache(),
            generated_tokens=False,
        )
        return SideScore(
            logprobs=torch.cat(chunks, 0),
            scored_token_ids=inputs.token_ids.clone(),
            scored_selected_ids=inputs.selected_token_ids.clone(),
            scored_active_mask=inputs.active_mask.clone(),
            evidence=evidence,
            identity_digest=identity.digest(),
        )

    def _logits(self, token_ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def embedded_tokens(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(token ids, position ids) the model embedded in the last scoring call."""
        return list(self.model.embedded)

    def _uses_kv_cache(self) -> bool:
        return False

    def live(self) -> Any:
        raise NotImplementedError

    def readback(self) -> Mapping[str, ReadbackValue]:
        return self._readback(self.live())

    def reset_state(self) -> None:
        """Nothing to forget: every scoring call starts its request record afresh."""

    def close(self) -> None:
        self.model = None  # type: ignore[assignment]


class TrainingEngine(_SyntheticEngine):
    """Teacher-forced full-sequence scoring; never a KV cache."""

    def __init__(
        self,
        config: SyntheticModelConfig,
        dtype: str,
        attention: AttentionKind,
        readback: ReadBackState,
    ) -> None:
        super().__init__(config, dtype, readback)
        self.attention: AttentionKind = attention

    def live(self) -> TrainingState:
        # request lifecycle: observed after a call, from the requests that ran
        return TrainingState(
            DTYPE_NAMES[self.model.embed.dtype],
            self.attention,
            "unsharded",
            tuple(self.request_sizes),
            self.request_size,
            self.vocab_layout(),
        )

    def score(
        self,
        inputs: FrozenInputs,
        identity: Identity,
        batch_size: int,
        op: SelectedLogprobOp | None,
    ) -> SideScore:
        return self._score(inputs, identity, batch_size, op)

    def _logits(self, token_ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        return self.model.forward_full(token_ids, position_ids, self.attention)


class RolloutEngine(_SyntheticEngine):
    """The engine's decode path: incremental KV-cache decoding of the frozen tokens.

    ``enforce_eager=False`` takes the optimized path (one fused full-sequence pass); prefix
    caching reuses KV blocks across requests that share a prefix.
    """

    def __init__(
        self,
        config: SyntheticModelConfig,
        dtype: str,
        *,
        prefix_caching: bool,
        eager: bool,
        mode: str,
        readback: ReadBackState,
    ) -> None:
        super().__init__(config, dtype, readback)
        self.prefix_caching = prefix_caching
        self.eager = eager
        self.mode = mode
        self._prefix_cache: dict[tuple[int, ...], tuple[torch.Tensor, torch.Tensor]] = {}
        self.prefix_hits = 0

    def reset_state(self) -> None:
        """Forget every cached KV block (the engine cache calls it before reusing the engine):
        a case's scores never depend on what the engine scored for the cases before it."""
        self._prefix_cache.clear()
        self.prefix_hits = 0

    def live(self) -> RolloutState:
        return RolloutState(
            DTYPE_NAMES[self.model.embed.dtype],
            self.prefix_caching,
            self.eager,
            1,
            tuple(self.request_sizes),
            self.request_size,
            self.vocab_layout(),
        )

    def score(
        self,
        inputs: FrozenInputs,
        identity: Identity,
        batch_size: int,
        op: SelectedLogprobOp | None,
    ) -> SideScore:
        return self._score(inputs, identity, batch_size, op)

    def _uses_kv_cache(self) -> bool:
        return self.mode == "decode" and self.eager

    def _logits(self, token_ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        if self.mode == "prefill" or not self.eager:
            return self.model.forward_full(token_ids, position_ids, "eager")
        if self.prefix_caching:
            return torch.cat(
                [
                    self._decode_cached(token_ids[i : i + 1], position_ids[i : i + 1])
                    for i in range(token_ids.shape[0])
                ]
            )
        return self._decode(token_ids, position_ids, 0, None)

    def _decode(
        self,
        token_ids: torch.Tensor,
        position_ids: torch.Tensor,
        start: int,
        cache: tuple[torch.Tensor, torch.Tensor] | None,
        store_prefix: bool = False,
    ) -> torch.Tensor:
        steps = []
        if start >= token_ids.shape[1]:  # nothing left to decode (a length-0 row)
            vocab = self.config.vocab_size
            return torch.zeros(token_ids.shape[0], 0, vocab, dtype=self.model.embed.dtype)
        for t in range(start, token_ids.shape[1]):
            logits, cache = self.model.forward_step(token_ids[:, t], position_ids[:, t], cache)
            steps.append(logits)
            if store_prefix and (t + 1) % PREFIX_BLOCK == 0:
                key = tuple(int(x) for x in token_ids[0, : t + 1])
                self._prefix_cache.setdefault(key, cache)
        return torch.stack(steps, dim=1)

    def _decode_cached(self, token_ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        """One row: resume from the longest cached block prefix, then decode the rest.

        Logits of cached positions are recomputed by a full pass over the prefix, as an engine
        would recompute prompt logprobs; the cached KV only changes how the suffix is decoded.
        """
        tokens = tuple(int(x) for x in token_ids[0])
        # At least the last token is always decoded, as engines do on a full prefix hit.
        length = (max(len(tokens) - 1, 0) // PREFIX_BLOCK) * PREFIX_BLOCK
        while length > 0 and tokens[:length] not in self._prefix_cache:  # bounded: it shrinks
            length -= PREFIX_BLOCK
        if not length:
            return self._decode(token_ids, position_ids, 0, None, store_prefix=True)
        self.prefix_hits += 1
        prefix = self.model.forward_full(token_ids[:, :length], position_ids[:, :length], "eager")
        suffix = self._decode(
            token_ids, position_ids, length, self._prefix_cache[tokens[:length]], store_prefix=True
        )
        return torch.cat([prefix, suffix], dim=1)
