"""The Megatron training side, declared once: its view, settings, handlers and build.

What a runtime that pairs a rollout side with this one needs of it:

* :func:`view`: what its handlers read of the checkpoint (Megatron's own TP rule,
  :class:`~xconf.adapters.megatron.arch.MegatronArch`; checked, and refused with a coded error
  naming the config field, before anything is built);
* ``HANDLERS`` (``handlers.py``): how each knob it honours is built and read back;
* :func:`megatron_config`: the side's typed construction record from its bound settings
  (``runtime/settings.TrainingSettings``, each field the knob's materialized value);
* :func:`build`: the engine on the side's ranks ``0 .. tp - 1`` of the launched world (the other
  ranks receive rank 0's score and readback), with ``score``, ``readback``, ``reset_state`` and
  ``close``; its live state is ``engine.MegatronTrainingSide.live()``.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from xconf.adapters.megatron.model import MegatronConfig
from xconf.runtime.protocol import RuntimeView
from xconf.runtime.settings import TrainingSettings

RUNTIME_KIND = "megatron"
SCORER = "megatron-teacher-forced/1"


def view(model_path: str, device: str = "cpu", trust_remote_code: bool = False) -> RuntimeView:
    """The side's view of the checkpoint for its handlers (its TP rule is Megatron's)."""
    from xconf.adapters.megatron.arch import megatron_arch

    return RuntimeView(RUNTIME_KIND, device, megatron_arch(model_path, trust_remote_code))


def megatron_config(
    settings: TrainingSettings,
    *,
    model_path: str,
    dtype: str,
    device: str = "cpu",
    trust_remote_code: bool = False,
) -> MegatronConfig:
    """The construction record for bound settings: each setting the handler materialized, and
    the record's own default where a knob was not declared (or not materialized)."""
    own = {f.name for f in fields(MegatronConfig)}
    chosen: dict[str, Any] = {
        f.name: getattr(settings, f.name)
        for f in fields(TrainingSettings)
        if f.name in own and getattr(settings, f.name) is not None
    }
    if settings.attention_backend is not None:
        chosen["attention"] = settings.attention_backend
    chosen.pop("compute_dtype", None)
    return MegatronConfig(
        model_path=model_path,
        compute_dtype=dtype,
        device=device,
        trust_remote_code=trust_remote_code,
        **chosen,
    )


def build(cfg: MegatronConfig) -> Any:
    """The engine on launched ranks ``0 .. tensor_parallel_size - 1``."""
    from xconf.adapters.megatron.engine import MegatronTrainingSide
    from xconf.adapters.vllm_transformers.engines import OnSideRanks

    return OnSideRanks.on(cfg.tensor_parallel_size, lambda group: MegatronTrainingSide(cfg, group))
