"""The CPU smoke runtime: the two synthetic sides (``side.py``) over one synthetic model,
honouring every knob they can and reporting the rest truthfully."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from xconf.adapters.cpu_smoke.engines import check_limits
from xconf.adapters.cpu_smoke.limits import VOCAB_SIZE
from xconf.adapters.cpu_smoke.model import SyntheticModelConfig
from xconf.adapters.cpu_smoke.side import SyntheticModel
from xconf.experiment import Identity
from xconf.runtime.pairing import SidePair
from xconf.runtime.protocol import Engine, RuntimeBinding, RuntimeView, SideBinding

if TYPE_CHECKING:
    from xconf.execution_plan import ExecutionCase

ADAPTER_VERSION = "1"


class CpuSmokeRuntime:
    """Deterministic synthetic model on both sides, in-process, read-only scoring.

    ``rollout`` and ``training`` name the side packages (``conf/runtime/cpu_smoke.yaml``);
    both must score the synthetic model, which only the ``cpu_smoke`` sides do."""

    runtime_kind = "cpu-smoke"
    device = "cpu"
    version = ADAPTER_VERSION
    # The vocabulary and context a plan checks without building the model (no torch).
    input_limits = "xconf.adapters.cpu_smoke.limits:input_limits"

    def __init__(
        self,
        seed: int = 0,
        vocab_size: int = VOCAB_SIZE,
        hidden_size: int = 32,
        rollout: str = "cpu_smoke",
        training: str = "cpu_smoke",
    ) -> None:
        self.model_config = SyntheticModelConfig(
            vocab_size=vocab_size, hidden_size=hidden_size, seed=seed
        )
        self.sides: SidePair[SyntheticModel] = SidePair.named(rollout, training)
        self.max_cached_engines = self.sides.max_cached_engines
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
        return self.sides.bind(self.view(), case, identity)

    def build_engine(self, binding: SideBinding, case: ExecutionCase) -> Engine:
        shared = SyntheticModel(self.model_config, self._scoring_mode)
        return self.sides.build(binding, case, shared)

    def environment(self) -> Mapping[str, str]:
        return {
            "runtime": f"{self.runtime_kind}/{self.version}",
            "model": self.model_config.checkpoint_id,
        }

    def close(self) -> None:
        return None
