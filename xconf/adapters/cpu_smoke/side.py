"""The synthetic sides (S0): a decode-path rollout engine and a teacher-forced training engine
over one deterministic synthetic model, in-process, one rank. Both sides of the
``cpu_smoke`` runtime (``conf/runtime/cpu_smoke.yaml``: ``rollout: cpu_smoke``,
``training: cpu_smoke``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from xconf.adapters.cpu_smoke import handlers
from xconf.adapters.cpu_smoke.model import SyntheticModelConfig
from xconf.knobs import KnobValue
from xconf.operators.catalog import Side
from xconf.runtime.protocol import Engine
from xconf.runtime.readback import ROLLOUT_VOCAB_LAYOUT, TRAINING_VOCAB_LAYOUT
from xconf.runtime.side import DistributedContext, SideBuild, SideSpec

if TYPE_CHECKING:
    from xconf.adapters.cpu_smoke.state import RolloutState, TrainingState

SINGLE_PROCESS: DistributedContext = (("backend", "none"), ("rank", 0), ("world_size", 1))


@dataclass(frozen=True)
class SyntheticModel:
    """What the two synthetic sides share: the model's sizes and seed, and the scoring mode
    of the identity the runtime binds (the rollout engine decodes or prefills by it)."""

    config: SyntheticModelConfig
    scoring_mode: str = "decode"


@dataclass(frozen=True)
class SyntheticRolloutSettings:
    """The synthetic rollout engine's settings, one field per knob it honours."""

    batch_size: int | None = None
    """``batch.size``: samples per scoring request (the last request may be shorter)."""
    tensor_parallel_size: int = 1
    """``rollout.tensor_parallel_size``: ranks the model is split over (one, in-process)."""
    context_parallel_size: int = 1
    """``rollout.context_parallel_size``: ranks a prefill's context is split over (one)."""
    dtype: str = "float32"
    """``rollout.dtype``: the dtype every parameter is cast to."""
    enable_prefix_caching: bool = False
    """``rollout.enable_prefix_caching``: reuse cached KV blocks of a shared prompt prefix."""
    enforce_eager: bool = True
    """``rollout.enforce_eager``: incremental decoding (False: one fused full-sequence pass)."""
    logp_backend: str | None = None
    """``logp.backend``: the selected-logprob backend id (the operator binding owns it)."""


@dataclass(frozen=True)
class SyntheticTrainingSettings:
    """The synthetic training engine's settings, one field per knob it honours."""

    batch_size: int | None = None
    """``batch.size``: samples per scoring forward (the last forward may be shorter)."""
    attention_backend: str = "sdpa"
    """``training.attention_backend``: the attention the forwards compute (``eager``,
    ``sdpa``)."""
    compute_dtype: str = "float32"
    """``training.compute_dtype``: the dtype every parameter is cast to."""
    sharding: str = "unsharded"
    """``training.sharding``: one unsharded module (there is no process group)."""
    logp_backend: str | None = None
    """``logp.backend``: the selected-logprob backend id (the operator binding owns it)."""


def _build_rollout(settings: SyntheticRolloutSettings, build: SideBuild[SyntheticModel]) -> Engine:
    from xconf.adapters.cpu_smoke.engines import RolloutEngine

    return RolloutEngine(
        build.shared.config,
        settings.dtype,
        prefix_caching=settings.enable_prefix_caching,
        eager=settings.enforce_eager,
        mode=build.shared.scoring_mode,
        readback=ROLLOUT.readback,
    )


def _build_training(
    settings: SyntheticTrainingSettings, build: SideBuild[SyntheticModel]
) -> Engine:
    from xconf.adapters.cpu_smoke.engines import TrainingEngine

    return TrainingEngine(
        build.shared.config,
        settings.compute_dtype,
        settings.attention_backend,  # type: ignore[arg-type]
        readback=TRAINING.readback,
    )


def _single_process(knobs: Mapping[str, KnobValue]) -> DistributedContext:
    return SINGLE_PROCESS


def _rollout_readings(live: RolloutState) -> dict[str, Any]:
    return {ROLLOUT_VOCAB_LAYOUT.name: live.vocab_layout}


def _training_readings(live: TrainingState) -> dict[str, Any]:
    return {TRAINING_VOCAB_LAYOUT.name: live.vocab_layout}


ROLLOUT: SideSpec[SyntheticRolloutSettings, SyntheticModel] = SideSpec(
    name="cpu_smoke",
    side="rollout",
    settings=SyntheticRolloutSettings,
    handlers=handlers.ROLLOUT,
    build=_build_rollout,
    readings=_rollout_readings,
    context=_single_process,
    scorer=lambda identity: f"synthetic-decode/{identity.scoring_mode}",
    shared=SyntheticModel,
)
TRAINING: SideSpec[SyntheticTrainingSettings, SyntheticModel] = SideSpec(
    name="cpu_smoke",
    side="training",
    settings=SyntheticTrainingSettings,
    handlers=handlers.TRAINING,
    build=_build_training,
    readings=_training_readings,
    context=_single_process,
    scorer=lambda identity: "synthetic-teacher-forced",
    shared=SyntheticModel,
)
SIDES: Mapping[Side, SideSpec[Any, SyntheticModel]] = {"rollout": ROLLOUT, "training": TRAINING}
