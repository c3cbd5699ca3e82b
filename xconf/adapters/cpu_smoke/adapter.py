"""The CPU smoke runtime: honours every knob it can, reports the rest truthfully."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING

from xconf.adapters.cpu_smoke.engines import RolloutEngine, TrainingEngine, check_limits
from xconf.adapters.cpu_smoke.model import SyntheticModelConfig
from xconf.experiment import Identity
from xconf.knobs import (
    BATCH_SIZE,
    ROLLOUT_CONTEXT_PARALLEL_SIZE,
    ROLLOUT_DTYPE,
    ROLLOUT_ENABLE_PREFIX_CACHING,
    ROLLOUT_ENFORCE_EAGER,
    ROLLOUT_TENSOR_PARALLEL_SIZE,
    TRAINING_ATTENTION_BACKEND,
    TRAINING_COMPUTE_DTYPE,
    TRAINING_SHARDING,
)
from xconf.runtime.materialization import default_bind, settings_for
from xconf.runtime.protocol import (
    AT_CONSTRUCTION,
    CHUNKED_REQUESTS,
    Engine,
    KnobApplication,
    KnobHandler,
    KnobRequest,
    RuntimeBinding,
    RuntimeView,
    SideBinding,
)
from xconf.runtime.settings import RolloutSettings, TrainingSettings

if TYPE_CHECKING:
    from xconf.execution_plan import ExecutionCase

ADAPTER_VERSION = "1"
SINGLE_PROCESS = (("backend", "none"), ("rank", 0), ("world_size", 1))


def _single_rank(request: KnobRequest) -> KnobApplication:
    if request.value == 1:
        return request.applied_as(1, "single in-process rank")
    return request.unsupported(
        "cpu-smoke runs one in-process rank; use the torchrun launcher with a distributed runtime"
    )


def _sharding(request: KnobRequest) -> KnobApplication:
    if request.value == "unsharded":
        return request.applied("one unsharded module")
    return request.unsupported("cpu-smoke has no process group to shard over")


def _attention_backend(request: KnobRequest) -> KnobApplication:
    if request.value == "flash_attention_2":
        return request.unsupported("flash_attention_2 needs CUDA")
    chosen = "sdpa" if request.value == "native" else request.value
    return request.applied_as(chosen, f"attention computed with {chosen}")


# What this runtime configures for each knob; the synthetic engines read each back from
# their own state. No extended knob has a handler: each is unsupported here.
HANDLERS: Mapping[str, KnobHandler] = MappingProxyType(
    {
        BATCH_SIZE.path: CHUNKED_REQUESTS,
        ROLLOUT_TENSOR_PARALLEL_SIZE.path: KnobHandler(_single_rank),
        ROLLOUT_CONTEXT_PARALLEL_SIZE.path: KnobHandler(_single_rank),
        ROLLOUT_DTYPE.path: AT_CONSTRUCTION,
        ROLLOUT_ENABLE_PREFIX_CACHING.path: AT_CONSTRUCTION,
        ROLLOUT_ENFORCE_EAGER.path: AT_CONSTRUCTION,
        TRAINING_ATTENTION_BACKEND.path: KnobHandler(_attention_backend),
        TRAINING_COMPUTE_DTYPE.path: AT_CONSTRUCTION,
        TRAINING_SHARDING.path: KnobHandler(_sharding),
    }
)


class CpuSmokeRuntime:
    """Deterministic synthetic model on both sides, in-process, read-only scoring."""

    runtime_kind = "cpu-smoke"
    device = "cpu"
    version = ADAPTER_VERSION
    max_cached_engines = 4

    def __init__(self, seed: int = 0, vocab_size: int = 97, hidden_size: int = 32) -> None:
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
