"""The CPU smoke runtime: honours every knob it can, reports the rest truthfully."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from xconf.adapters.cpu_smoke.engines import RolloutEngine, TrainingEngine, check_limits
from xconf.adapters.cpu_smoke.handlers import HANDLERS
from xconf.adapters.cpu_smoke.limits import VOCAB_SIZE
from xconf.adapters.cpu_smoke.model import SyntheticModelConfig
from xconf.experiment import Identity
from xconf.runtime.materialization import default_bind, settings_for
from xconf.runtime.protocol import (
    Engine,
    RuntimeBinding,
    RuntimeView,
    SideBinding,
)
from xconf.runtime.settings import RolloutSettings, TrainingSettings

if TYPE_CHECKING:
    from xconf.execution_plan import ExecutionCase

ADAPTER_VERSION = "1"
SINGLE_PROCESS = (("backend", "none"), ("rank", 0), ("world_size", 1))


class CpuSmokeRuntime:
    """Deterministic synthetic model on both sides, in-process, read-only scoring."""

    runtime_kind = "cpu-smoke"
    device = "cpu"
    version = ADAPTER_VERSION
    max_cached_engines = 4
    # The vocabulary and context a plan checks without building the model (no torch).
    input_limits = "xconf.adapters.cpu_smoke.limits:input_limits"

    def __init__(self, seed: int = 0, vocab_size: int = VOCAB_SIZE, hidden_size: int = 32) -> None:
        self.model_config = SyntheticModelConfig(
            vocab_size=vocab_size, hidden_size=hidden_size, seed=seed
        )
        self._scoring_mode = "decode"

    def freeze_identity(self, identity: Identity) -> Identity:
        return identity  # S0 identities are declared frozen in the experiment

    def check_inputs(self, identity: Identity) -> None:
        """Before anything is written: the identity fits the synthetic model (vocabulary,
        context); what no plan can know without the model."""
        from xconf.side_scoring import frozen_inputs

        check_limits(self.model_config, frozen_inputs(identity))

    def view(self) -> RuntimeView:
        """What this runtime's handlers read of it."""
        return RuntimeView(self.runtime_kind, self.device)

    def bind(self, case: ExecutionCase, identity: Identity) -> RuntimeBinding:
        self._scoring_mode = identity.scoring_mode
        return default_bind(
            self.view(),
            HANDLERS,
            case,
            {"rollout": SINGLE_PROCESS, "training": SINGLE_PROCESS},
            (
                ("rollout", f"synthetic-decode/{identity.scoring_mode}"),
                ("training", "synthetic-teacher-forced"),
            ),
        )

    def build_engine(self, binding: SideBinding, case: ExecutionCase) -> Engine:
        if binding.side == "rollout":
            rollout = settings_for(binding, RolloutSettings)
            return RolloutEngine(
                self.model_config,
                binding.dtype,
                prefix_caching=bool(rollout.enable_prefix_caching),
                eager=bool(rollout.enforce_eager),
                mode=self._scoring_mode,
            )
        training = settings_for(binding, TrainingSettings)
        return TrainingEngine(
            self.model_config,
            binding.dtype,
            training.attention_backend,  # type: ignore[arg-type]
        )

    def environment(self) -> Mapping[str, str]:
        return {
            "runtime": f"{self.runtime_kind}/{self.version}",
            "model": self.model_config.checkpoint_id,
        }

    def close(self) -> None:
        return None
