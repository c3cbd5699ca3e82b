"""The Megatron training side, declared once: what a runtime pairing it with a rollout side
needs of it (the members of a side spec, ``runtime/side.SideSpec`` on the branch that
introduces it).

* ``SETTINGS`` (``settings.MegatronSettings``): the one record each knob's materialized
  value lands in, each default what the side builds without the knob;
* ``HANDLERS`` (``handlers.py``): how each knob it honours is built and read back;
* :func:`build`: the engine (``engine.MegatronTrainingSide``) on the side's ranks
  ``0 .. tp - 1`` of the launched world (the other ranks receive rank 0's score and readback),
  with ``score``, ``readback``, ``reset_state`` and ``close``;
* :func:`readings`: what its live state reports beside the knobs;
* :func:`context`: the distributed context it runs in for a case's knobs;
* :func:`view`: what its handlers read of the checkpoint (Megatron's own TP rule; an
  unmappable checkpoint is a coded error naming the config field, before anything is built).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from xconf.adapters.megatron.handlers import HANDLERS
from xconf.adapters.megatron.model import MegatronConfig
from xconf.adapters.megatron.settings import MegatronSettings
from xconf.knobs import KnobValue, side_worlds
from xconf.runtime.protocol import Engine, RuntimeView

if TYPE_CHECKING:
    from xconf.adapters.megatron.state import MegatronState

NAME = "megatron"
SETTINGS = MegatronSettings
SCORER = "megatron-teacher-forced/1"
DISTRIBUTIONS = ("megatron-core", "transformers")
__all__ = ["HANDLERS", "SETTINGS", "build", "context", "readings", "view"]


def view(model_path: str, device: str = "cpu", trust_remote_code: bool = False) -> RuntimeView:
    """The side's view of the checkpoint for its handlers (its TP rule is Megatron's)."""
    from xconf.adapters.megatron.arch import megatron_arch

    return RuntimeView(NAME, device, megatron_arch(model_path, trust_remote_code))


def build(
    settings: MegatronSettings,
    *,
    model_path: str,
    device: str = "cpu",
    trust_remote_code: bool = False,
) -> Engine:
    """The engine for bound settings, on launched ranks ``0 .. tensor_parallel_size - 1``."""
    from xconf.adapters.megatron.engine import MegatronTrainingSide
    from xconf.adapters.vllm_transformers.engines import OnSideRanks

    cfg = MegatronConfig.from_settings(
        settings, model_path=model_path, device=device, trust_remote_code=trust_remote_code
    )
    return OnSideRanks.on(cfg.tensor_parallel_size, lambda group: MegatronTrainingSide(cfg, group))


def readings(live: MegatronState) -> Mapping[str, Any]:
    return live.readings()


def context(knobs: Mapping[str, KnobValue]) -> tuple[tuple[str, Any], ...]:
    """The training group: as many ranks as the training knobs ask (its TP size), whatever
    the rollout side launched."""
    from xconf.adapters.vllm_transformers.placement import process_group_context

    pg = dict(process_group_context())
    return (
        ("backend", pg["backend"]),
        ("rank", pg["rank"]),
        ("world_size", side_worlds(knobs).training),
        ("launcher_world_size", pg["world_size"]),
    )
