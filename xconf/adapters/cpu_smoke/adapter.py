"""The CPU smoke runtime: honours every knob it can, reports the rest truthfully."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from xconf.adapters.cpu_smoke.engines import RolloutEngine, TrainingEngine, check_limits
from xconf.adapters.cpu_smoke.limits import VOCAB_SIZE
from xconf.adapters.cpu_smoke.model import SyntheticModelConfig
from xconf.experiment import Identity
from xconf.knobs import KNOBS, KnobValue
from xconf.operators.catalog import Side
from xconf.runtime.protocol import (
    Engine,
    KnobApplication,
    RuntimeBinding,
    SideBinding,
    planned_application,
    unsupported_application,
)

if TYPE_CHECKING:
    from xconf.execution_plan import ExecutionCase

ADAPTER_VERSION = "1"
SINGLE_PROCESS = (("backend", "none"), ("rank", 0), ("world_size", 1))


def _materialize(path: str, side: Side, value: KnobValue) -> KnobApplication:
    """What this runtime will configure for one requested knob value."""
    if path in ("rollout.tensor_parallel_size", "rollout.context_parallel_size"):
        if value == 1:
            return planned_application(path, side, value, 1, "applied", "single in-process rank")
        return unsupported_application(
            path,
            side,
            value,
            "cpu-smoke runs one in-process rank; use the torchrun launcher "
            "with a distributed runtime",
        )
    if path == "training.sharding":
        if value == "unsharded":
            return planned_application(path, side, value, value, "applied", "one unsharded module")
        return unsupported_application(
            path, side, value, "cpu-smoke has no process group to shard over"
        )
    if path == "training.attention_backend":
        if value == "flash_attention_2":
            return unsupported_application(path, side, value, "flash_attention_2 needs CUDA")
        chosen = "sdpa" if value == "native" else value
        return planned_application(
            path, side, value, chosen, "applied", f"attention computed with {chosen}"
        )
    if path == "batch.size":
        return planned_application(
            path, side, value, value, "applied", "frozen samples chunked into requests of this size"
        )
    if path in _CONSTRUCTION_KNOBS:
        return planned_application(
            path, side, value, value, "applied", "set at engine construction"
        )
    # A knob this runtime has no code for is never reported as applied.
    return unsupported_application(path, side, value, f"the cpu-smoke runtime has no {path}")


# Knobs the synthetic engines take at construction (see build_engine).
_CONSTRUCTION_KNOBS = frozenset(
    {
        "rollout.dtype",
        "rollout.enable_prefix_caching",
        "rollout.enforce_eager",
        "training.compute_dtype",
    }
)


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
        from xconf.runner import frozen_inputs

        check_limits(self.model_config, frozen_inputs(identity))

    def bind(self, case: ExecutionCase, identity: Identity) -> RuntimeBinding:
        knobs = case.case.knob_dict()
        self._scoring_mode = identity.scoring_mode
        sides: dict[Side, SideBinding] = {}
        for side in ("rollout", "training"):
            applications = tuple(
                _materialize(path, side, value)
                for path, value in sorted(knobs.items())
                if path != "logp.backend" and KNOBS[path].side in (side, "both")
            )
            dtype = knobs["rollout.dtype" if side == "rollout" else "training.compute_dtype"]
            sides[side] = SideBinding(side, applications, str(dtype), SINGLE_PROCESS)
        return RuntimeBinding(
            runtime_kind=self.runtime_kind,
            case_id=case.case.case_id,
            rollout=sides["rollout"],
            training=sides["training"],
            scorers=(
                ("rollout", f"synthetic-decode/{identity.scoring_mode}"),
                ("training", "synthetic-teacher-forced"),
            ),
        )

    def build_engine(self, binding: SideBinding, case: ExecutionCase) -> Engine:
        values = {k.path: k.materialized for k in binding.knobs}
        if binding.side == "rollout":
            return RolloutEngine(
                self.model_config,
                binding.dtype,
                prefix_caching=bool(values["rollout.enable_prefix_caching"]),
                eager=bool(values["rollout.enforce_eager"]),
                mode=self._scoring_mode,
            )
        return TrainingEngine(
            self.model_config,
            binding.dtype,
            values["training.attention_backend"],  # type: ignore[arg-type]
        )

    def environment(self) -> Mapping[str, str]:
        return {
            "runtime": f"{self.runtime_kind}/{self.version}",
            "model": self.model_config.checkpoint_id,
        }

    def close(self) -> None:
        return None
