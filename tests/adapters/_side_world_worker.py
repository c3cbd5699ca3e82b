"""Rank worker of tests/adapters/test_side_worlds.py, in a module of its own: spawned ranks
import only this (not the test module, whose conftest imports vLLM)."""

from __future__ import annotations

import datetime
import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

WORLD = 4
CONF = Path(__file__).resolve().parents[2] / "conf"


def _execution(model_cache: str) -> Any:
    """The S2 baseline with FSDP training and an S0 frozen identity; one rollout TP=4 case."""
    from hydra import compose, initialize_config_dir

    from xconf.config.hydra_document import experiment_document
    from xconf.config.strict import parse_experiment
    from xconf.execution_plan import build_execution_plan
    from xconf.experiment import Intervention
    from xconf.operators.catalog import ResolutionPolicy, SemanticOperatorCatalog
    from xconf.planner import plan_experiment

    overrides = ["+experiment=s2_cpu", "identity=synthetic_s0", "training.sharding=fsdp"]
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=overrides)
    spec = parse_experiment(experiment_document(cfg), require_schema_version=False)
    spec = replace(spec, interventions=(Intervention("rollout.tensor_parallel_size", (4,)),))
    plan = plan_experiment(spec)
    return build_execution_plan(
        plan, SemanticOperatorCatalog.from_entry_points(), ResolutionPolicy()
    )


def _rank_main(rank: int, port: int, model_cache: str, out_dir: str) -> None:
    import torch
    import torch.distributed as dist

    from xconf.runtime.ranks import close_world

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", rank=rank, world_size=WORLD, timeout=datetime.timedelta(seconds=240)
    )
    try:
        # In a function of its own: the engines (and the sub-group their FSDP mesh holds)
        # are released when it returns, before the world is closed.
        result = _score_on_rank(rank, model_cache)
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))
        dist.barrier()
    finally:
        close_world()


def _score_on_rank(rank: int, model_cache: str) -> dict[str, Any]:
    import torch

    from xconf.adapters.checkpoint.runtime import CheckpointRuntime
    from xconf.adapters.frozen import FrozenBatch
    from xconf.adapters.hf.model import TrainingScorerConfig
    from xconf.adapters.hf.scorer import HFTrainingScorer
    from xconf.adapters.models import ensure_model
    from xconf.side_scoring import frozen_inputs

    execution = _execution(model_cache)
    identity = execution.plan.spec.identity
    runtime = CheckpointRuntime("vllm", "hf", model_cache=model_cache)
    runtime._record = ensure_model(cache_dir=model_cache)
    base, tp4 = execution.cases
    assert dict(tp4.case.changed) == {"rollout.tensor_parallel_size": 4}
    contexts = {
        label: dict(runtime.bind(case, identity).training.distributed_context)
        for label, case in (("baseline", base), ("tp4", tp4))
    }
    binding = runtime.bind(tp4, identity)
    engine = runtime.build_engine(binding.training, tp4)
    score = engine.score(frozen_inputs(identity), identity, 2, None)
    back = dict(engine.readback())
    # The timing wrapper's engine underneath (OnSideRanks): ``.engine`` is None off the side.
    inner: Any = getattr(engine, "wrapped", engine)
    result: dict[str, Any] = {
        "contexts": contexts,
        "built_model": inner.engine is not None,
        "readback": {k: back.get(k) for k in ("training.world_size", "training.sharding")},
    }
    if rank == 0:  # the FSDP sub-group's scores equal one unsharded model's, bitwise
        plain = HFTrainingScorer(TrainingScorerConfig(model_path=runtime.record.path))
        ref = plain.score(FrozenBatch.from_identity(identity), 2)
        result["bitwise"] = bool(torch.equal(ref.logprobs, score.logprobs))
    engine.close()
    return result
