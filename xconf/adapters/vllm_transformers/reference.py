"""hf_pair's rollout engine: the unsharded transformers reference scorer (apart from
``hf_pair.py``, which planning imports without torch)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from xconf.adapters.vllm_transformers import reads
from xconf.adapters.vllm_transformers.engines import HfTrainingSide
from xconf.adapters.vllm_transformers.hf_pair_handlers import HANDLERS
from xconf.operators.catalog import Side
from xconf.runtime.protocol import Handlers
from xconf.runtime.readback import (
    ROLLOUT_ATTENTION_BACKEND,
    ROLLOUT_VOCAB_LAYOUT,
    ROLLOUT_WORLD_SIZE,
    TRAINING_VOCAB_LAYOUT,
    TRAINING_WORLD_SIZE,
)

if TYPE_CHECKING:
    from xconf.adapters.hf.scorer import ScorerState


class HfReferenceSide(HfTrainingSide):
    """Engine protocol: the unsharded reference scorer, its rollout knobs read from its live
    state by hf_pair's handlers, its readings under rollout names."""

    handlers: ClassVar[Handlers] = HANDLERS
    side: ClassVar[Side] = "rollout"

    def readings(self, live: ScorerState) -> dict[str, Any]:
        return {
            ROLLOUT_WORLD_SIZE.name: live.model.readings[TRAINING_WORLD_SIZE.name],
            ROLLOUT_ATTENTION_BACKEND.name: reads.attention(live),
            ROLLOUT_VOCAB_LAYOUT.name: live.model.readings[TRAINING_VOCAB_LAYOUT.name],
        }
