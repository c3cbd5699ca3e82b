"""A runtime's two sides: one rollout and one training :class:`~xconf.runtime.side.SideSpec`
that score one shared model, bound and built through the specs alone.

A runtime (``adapters/cpu_smoke/adapter.py``, ``adapters/checkpoint/runtime.py``) owns what
its sides share (the synthetic model, or the frozen checkpoint and its options) and hands
the rest to a :class:`SidePair`: each side's knobs go through that side's handlers (the one
``materialization.default_bind``), each engine is built from that side's typed settings
(``materialization.settings_for``). No runtime subclasses another to change a side.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Generic

from xconf.errors import ConfigError
from xconf.experiment import Identity
from xconf.operators.catalog import SIDES, Side
from xconf.runtime.materialization import default_bind, settings_for
from xconf.runtime.protocol import Engine, Handlers, RuntimeBinding, RuntimeView, SideBinding
from xconf.runtime.side import M, SideBuild, SideSpec, resolve_side

if TYPE_CHECKING:
    from xconf.execution_plan import ExecutionCase


class SidePair(Generic[M]):
    """The rollout and the training side of one runtime, which both score a ``M``."""

    def __init__(self, rollout: SideSpec[Any, M], training: SideSpec[Any, M]) -> None:
        for slot, spec in (("rollout", rollout), ("training", training)):
            if spec.side != slot:
                raise ConfigError(
                    "runtime.side_slot",
                    f"side '{spec.name}' is a {spec.side} side, not a {slot} one",
                    f"runtime.{slot}",
                )
        if rollout.shared is not training.shared:
            raise ConfigError(
                "runtime.sides_unpaired",
                f"the rollout side '{rollout.name}' scores a {rollout.shared.__name__}, the "
                f"training side '{training.name}' a {training.shared.__name__}: they cannot "
                "score one model",
                "runtime.training",
            )
        self._specs: dict[Side, SideSpec[Any, M]] = {"rollout": rollout, "training": training}

    @classmethod
    def named(cls, rollout: str, training: str) -> SidePair[Any]:
        """The sides a runtime config names (``rollout: vllm``, ``training: hf``)."""
        return cls(resolve_side(rollout, "rollout"), resolve_side(training, "training"))

    def spec(self, side: Side) -> SideSpec[Any, M]:
        return self._specs[side]

    @property
    def names(self) -> tuple[str, str]:
        """(rollout, training) side names."""
        return self._specs["rollout"].name, self._specs["training"].name

    def handlers(self) -> Mapping[Side, Handlers]:
        """Each side's knob handlers (a knob of both sides, ``batch.size``, has one on each)."""
        return {side: spec.handlers for side, spec in self._specs.items()}

    @property
    def max_cached_engines(self) -> dict[str, int]:
        return {side: spec.max_cached for side, spec in self._specs.items()}

    def bind(self, runtime: RuntimeView, case: ExecutionCase, identity: Identity) -> RuntimeBinding:
        """Requested -> materialized for every knob of the case, each through its side's
        handler; each side's distributed context and scorer as its spec says."""
        knobs = case.case.knob_dict()
        return default_bind(
            runtime,
            self.handlers(),
            case,
            {side: self._specs[side].context(knobs) for side in SIDES},
            tuple((side, self._specs[side].scorer(identity)) for side in SIDES),
        )

    def build(self, binding: SideBinding, case: ExecutionCase, shared: M) -> Engine:
        """The side's engine, built from its typed settings (the bound knobs' materialized
        values, the settings' defaults for the rest)."""
        spec = self._specs[binding.side]
        settings = settings_for(binding, spec.settings)
        return spec.build(settings, SideBuild(binding, case.operator(binding.side), shared))
