"""The transformers sides' engine: the Engine protocol over
:class:`~xconf.adapters.hf.scorer.HFTrainingScorer`, on the training side and as the
reference scorer on the rollout side (``side.py``); each side gives it its own readback."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from xconf.adapters.frozen import FrozenBatch
from xconf.adapters.frozen_side import FrozenSide
from xconf.experiment import Identity
from xconf.runtime.protocol import ReadbackValue, ReadOnlyEvidence, SelectedLogprobOp

if TYPE_CHECKING:
    from xconf.adapters.hf.model import TrainingScorerConfig
    from xconf.adapters.hf.scorer import ScorerState


class HfScorerSide(FrozenSide):
    """Engine protocol over :class:`~xconf.adapters.hf.scorer.HFTrainingScorer`; ``readback``
    is the side's (its readings and each knob read by the side's handler). It keeps the
    logits rows of the active tokens of a plain teacher-forced pass (not of a shaped one)."""

    keeps_vocab_rows = True

    def __init__(
        self,
        cfg: TrainingScorerConfig,
        readback: Callable[[ScorerState], Mapping[str, ReadbackValue]],
        group: Any = None,
    ) -> None:
        from xconf.adapters.hf.scorer import HFTrainingScorer

        self.scorer = HFTrainingScorer(cfg, group)
        self._readback = readback

    def _score(
        self,
        batch: FrozenBatch,
        identity: Identity,
        batch_size: int,
        operator: SelectedLogprobOp | None,
    ) -> tuple[Any, ReadOnlyEvidence]:
        result = self.scorer.score(batch, batch_size, operator, vocab_rows=self.vocab_rows)
        evidence = ReadOnlyEvidence(
            state_digest_before=f"{result.digest_before.parameters}:{result.digest_before.buffers}",
            state_digest_after=f"{result.digest_after.parameters}:{result.digest_after.buffers}",
            mode_restored=result.mode_restored,
            # a full pass runs use_cache=False; the decode mode attends over KV caches
            used_kv_cache=self.scorer.uses_kv_cache,
            generated_tokens=False,
        )
        return result.logprobs, evidence

    def readback(self) -> Mapping[str, ReadbackValue]:
        return self._readback(self.scorer.live())

    def reset_state(self) -> None:
        """Nothing to forget: every scoring pass records its own forwards afresh."""

    def close(self) -> None:
        self.scorer.model = None
