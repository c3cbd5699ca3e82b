"""What the two sides of a checkpoint runtime share, as each side's ``build`` receives it
(``runtime/side.SideBuild.shared``): the frozen checkpoint, the device, whether its own code
may run, and the engines' process options from the runtime config."""

from __future__ import annotations

from dataclasses import dataclass

from xconf.adapters.models import ModelRecord


@dataclass(frozen=True)
class EngineOptions:
    """The runtime config's engine options (``conf/runtime/vllm_hf.yaml``)."""

    kv_cache_memory_bytes: int
    max_model_len: int
    seed: int
    in_process: bool  # a vLLM engine core in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0)


@dataclass(frozen=True)
class CheckpointModel:
    """The checkpoint both sides score (frozen and digested when the identity froze), where
    they run, and the options their engines are built with."""

    record: ModelRecord
    device: str
    trust_remote_code: bool
    engine: EngineOptions
    sync_source: str | None = None
    """A one-step identity's pre-update checkpoint W0 (``identity.recipe.update``): the
    weights a synced rollout engine (``rollout.weight_sync=reload``) is built from before it
    receives ``record``'s, as an RL loop's engine holds them. None: a perturbed copy of
    ``record`` (``adapters/vllm/weight_sync.py``)."""
