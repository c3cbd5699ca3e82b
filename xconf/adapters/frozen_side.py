"""What every side that scores an identity's frozen layout shares: the runner's tensors
checked against that layout, and the echo of what was scored (``FrozenSide``)."""

from __future__ import annotations

from typing import Any

from xconf.adapters.errors import IdentityViolationError
from xconf.adapters.frozen import FrozenBatch, VocabRows
from xconf.experiment import Identity
from xconf.runtime.protocol import FrozenInputs, ReadOnlyEvidence, SelectedLogprobOp, SideScore


def check_inputs(inputs: FrozenInputs, batch: FrozenBatch) -> None:
    """The tensors the runner hands over must be the identity's own frozen layout."""
    import torch

    layout = batch.layout()
    for name in (
        "token_ids",
        "selected_token_ids",
        "active_mask",
        "attention_mask",
        "position_ids",
    ):
        given = getattr(inputs, name)
        expected = torch.tensor(layout[name], dtype=given.dtype)
        if given.shape != expected.shape or not torch.equal(given, expected):
            raise IdentityViolationError(
                "identity.inputs_mismatch",
                f"frozen inputs disagree with the identity on {name}",
                f"identity.{name}",
            )


class FrozenSide:
    """Scores the identity's own frozen layout (the runner's tensors are checked against it
    first) and echoes back what it scored; a side supplies ``_score`` and its evidence.

    A side whose engine computes full-vocabulary logits rows sets ``keeps_vocab_rows``: its
    ``_score`` then keeps each active token's row in ``self.vocab_rows`` (a fresh
    :class:`VocabRows` per call), and the score carries them (``SideScore.vocab_rows``)."""

    keeps_vocab_rows = False
    vocab_rows: VocabRows | None = None

    def score(
        self,
        inputs: FrozenInputs,
        identity: Identity,
        batch_size: int,
        operator: SelectedLogprobOp | None,
    ) -> SideScore:
        batch = FrozenBatch.from_identity(identity)
        check_inputs(inputs, batch)
        self.vocab_rows = VocabRows(batch) if self.keeps_vocab_rows else None
        try:
            logprobs, evidence = self._score(batch, identity, batch_size, operator)
            kept = self.vocab_rows
            rows = None if kept is None else kept.active_rows()
        finally:
            self.vocab_rows = None  # rows never outlive the call that scored them
        return SideScore(
            logprobs=logprobs,
            scored_token_ids=inputs.token_ids.clone(),
            scored_selected_ids=inputs.selected_token_ids.clone(),
            scored_active_mask=inputs.active_mask.clone(),
            evidence=evidence,
            identity_digest=identity.digest(),
            vocab_rows=rows,
        )

    def _score(
        self,
        batch: FrozenBatch,
        identity: Identity,
        batch_size: int,
        operator: SelectedLogprobOp | None,
    ) -> tuple[Any, ReadOnlyEvidence]:
        raise NotImplementedError

    def embedded_tokens(self) -> None:
        """No record of what the engine's model embedded: the echo is checked (guards)."""
        return None
