"""The Megatron training side (``training: megatron``), declared once as a
:class:`~xconf.runtime.side.SideSpec`: its settings (``settings.MegatronSettings``), its
handlers (``handlers.py``), its build (the engine, ``engine.MegatronTrainingSide``, on the
side's ranks ``0 .. tp - 1`` of the launched world; the other ranks receive rank 0's score
and readback), its readings and its distributed context (as many ranks as its TP size).

It scores the checkpoint the pairing shares (``adapters/checkpoint/shared.CheckpointModel``);
its handlers read Megatron's own TP rule from that checkpoint (``handlers.megatron_rule``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from xconf.adapters.checkpoint.shared import CheckpointModel
from xconf.adapters.megatron.handlers import HANDLERS
from xconf.adapters.megatron.model import MegatronConfig
from xconf.adapters.megatron.settings import MegatronSettings
from xconf.knobs import KnobValue, side_worlds
from xconf.operators.catalog import Side
from xconf.runtime.protocol import Engine
from xconf.runtime.ranks import process_group_context
from xconf.runtime.side import DistributedContext, SideBuild, SideSpec
from xconf.runtime.wrappers import OnSideRanks

if TYPE_CHECKING:
    from xconf.adapters.megatron.state import MegatronState

VERSION = "1"
DISTRIBUTIONS = ("megatron-core", "transformers")


def engine_for(
    settings: MegatronSettings,
    *,
    model_path: str,
    device: str = "cpu",
    trust_remote_code: bool = False,
) -> Engine:
    """The engine for bound settings, on launched ranks ``0 .. tensor_parallel_size - 1``."""
    from xconf.adapters.megatron.engine import MegatronTrainingSide

    cfg = MegatronConfig.from_settings(
        settings, model_path=model_path, device=device, trust_remote_code=trust_remote_code
    )
    return OnSideRanks.on(
        cfg.tensor_parallel_size,
        lambda group: MegatronTrainingSide(cfg, TRAINING.readback, group),
    )


def _build(settings: MegatronSettings, build: SideBuild[CheckpointModel]) -> Engine:
    shared = build.shared
    return engine_for(
        settings,
        model_path=shared.record.path,
        device=shared.device,
        trust_remote_code=shared.trust_remote_code,
    )


def _check(shared: CheckpointModel) -> None:
    """A checkpoint Megatron cannot build is refused before the run writes anything (coded
    ``model.megatron_unmappable`` naming ``config.json:FIELD``, exit 2)."""
    from xconf.adapters.megatron.arch import megatron_arch

    megatron_arch(shared.record.path, shared.trust_remote_code)


def _readings(live: MegatronState) -> Mapping[str, Any]:
    return live.readings()


def _context(knobs: Mapping[str, KnobValue]) -> DistributedContext:
    """The training group: as many ranks as the training knobs ask (its TP size), whatever
    the rollout side launched."""
    pg = dict(process_group_context())
    return (
        ("backend", pg["backend"]),
        ("rank", pg["rank"]),
        ("world_size", side_worlds(knobs).training),
        ("launcher_world_size", pg["world_size"]),
    )


TRAINING: SideSpec[MegatronSettings, CheckpointModel] = SideSpec(
    name="megatron",
    side="training",
    settings=MegatronSettings,
    handlers=HANDLERS,
    build=_build,
    readings=_readings,
    context=_context,
    scorer=lambda identity, knobs: f"megatron-teacher-forced/{VERSION}",
    shared=CheckpointModel,
    distributions=DISTRIBUTIONS,
    check=_check,
)
SIDES: Mapping[Side, SideSpec[Any, CheckpointModel]] = {"training": TRAINING}
