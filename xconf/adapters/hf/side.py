"""The transformers sides: the training scorer (``training: hf``, unsharded or FSDP2 under a
launcher) and the unsharded reference scorer on the rollout side (``rollout: hf``, hf_pair's
S1 rollout). Both teacher-force the frozen tokens read-only (``scorer.py``), each knob read
back from the scorer's live state by its handler (``handlers.py``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from xconf.adapters.checkpoint.shared import CheckpointModel
from xconf.adapters.hf import handlers, reads
from xconf.adapters.hf.settings import HfSettings, ReferenceSettings
from xconf.knobs import KnobValue, side_worlds
from xconf.operators.catalog import Side
from xconf.runtime.protocol import Engine
from xconf.runtime.ranks import process_group_context, rank
from xconf.runtime.readback import (
    ROLLOUT_ATTENTION_BACKEND,
    ROLLOUT_VOCAB_LAYOUT,
    ROLLOUT_WORLD_SIZE,
    TRAINING_VOCAB_LAYOUT,
    TRAINING_WORLD_SIZE,
)
from xconf.runtime.side import DistributedContext, SideBuild, SideSpec
from xconf.runtime.wrappers import OnSideRanks

if TYPE_CHECKING:
    from xconf.adapters.hf.scorer import ScorerState

VERSION = "1"
DISTRIBUTIONS = ("transformers", "tokenizers")


def _scorer_on(ranks: int, cfg: Any, spec: SideSpec[Any, CheckpointModel]) -> Engine:
    """A transformers scorer on launched ranks ``0 .. ranks - 1``; the other launched ranks
    receive rank 0's score."""
    from xconf.adapters.hf.side_engine import HfScorerSide

    return OnSideRanks.on(ranks, lambda group: HfScorerSide(cfg, spec.readback, group))


def _build_training(settings: HfSettings, build: SideBuild[CheckpointModel]) -> Engine:
    from xconf.adapters.hf.model import TrainingScorerConfig

    shared = build.shared
    cfg = TrainingScorerConfig.from_settings(
        settings,
        model_path=shared.record.path,
        device=shared.device,
        trust_remote_code=shared.trust_remote_code,
    )
    return _scorer_on(build.ranks, cfg, TRAINING)


def _training_context(knobs: Mapping[str, KnobValue]) -> DistributedContext:
    # The training group is fixed by the training knobs alone: a rollout TP case launches
    # more ranks, never a wider FSDP group.
    pg = dict(process_group_context())
    return (
        ("backend", pg["backend"]),
        ("rank", pg["rank"]),
        ("world_size", side_worlds(knobs).training),
        ("launcher_world_size", pg["world_size"]),
    )


def _training_readings(live: ScorerState) -> dict[str, Any]:
    return live.readings()


TRAINING: SideSpec[HfSettings, CheckpointModel] = SideSpec(
    name="hf",
    side="training",
    settings=HfSettings,
    handlers=handlers.TRAINING,
    build=_build_training,
    readings=_training_readings,
    context=_training_context,
    scorer=lambda identity: f"transformers-teacher-forced/{VERSION}",
    shared=CheckpointModel,
    distributions=DISTRIBUTIONS,
)


def _build_reference(settings: ReferenceSettings, build: SideBuild[CheckpointModel]) -> Engine:
    from xconf.adapters.hf.model import TrainingScorerConfig

    shared = build.shared
    cfg = TrainingScorerConfig(
        model_path=shared.record.path,
        compute_dtype=settings.dtype,
        attention_backend="sdpa",
        sharding="unsharded",
        device=shared.device,
        trust_remote_code=shared.trust_remote_code,
    )
    return _scorer_on(1, cfg, REFERENCE)  # one unsharded reference on rank 0


def _reference_context(knobs: Mapping[str, KnobValue]) -> DistributedContext:
    return (("backend", "none"), ("rank", rank()), ("world_size", 1))


def _reference_readings(live: ScorerState) -> dict[str, Any]:
    """The scorer's readings under rollout names."""
    return {
        ROLLOUT_WORLD_SIZE.name: live.model.readings[TRAINING_WORLD_SIZE.name],
        ROLLOUT_ATTENTION_BACKEND.name: reads.attention(live),
        ROLLOUT_VOCAB_LAYOUT.name: live.model.readings[TRAINING_VOCAB_LAYOUT.name],
    }


REFERENCE: SideSpec[ReferenceSettings, CheckpointModel] = SideSpec(
    name="hf",
    side="rollout",
    settings=ReferenceSettings,
    handlers=handlers.REFERENCE,
    build=_build_reference,
    readings=_reference_readings,
    context=_reference_context,
    scorer=lambda identity: f"transformers-reference/{VERSION}",
    shared=CheckpointModel,
    max_cached=2,
    distributions=DISTRIBUTIONS,
)
SIDES: Mapping[Side, SideSpec[Any, CheckpointModel]] = {"rollout": REFERENCE, "training": TRAINING}
