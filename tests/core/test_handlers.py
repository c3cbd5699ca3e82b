"""Every knob goes through one mechanism on every runtime: the runtime's handler table and the
one default bind (``runtime/materialization.default_bind``). A knob with no handler is
unsupported by construction, contract and extended knobs alike."""

from __future__ import annotations

from typing import Any

import pytest

from xconf.adapters.cpu_smoke import engines
from xconf.adapters.cpu_smoke import side as cpu_smoke
from xconf.adapters.cpu_smoke.adapter import CpuSmokeRuntime
from xconf.adapters.hf import side as hf
from xconf.adapters.megatron import side as megatron
from xconf.adapters.vllm import side as vllm
from xconf.config.strict import parse_experiment
from xconf.execution_plan import build_execution_plan
from xconf.experiment import EXPERIMENT_SCHEMA_V2
from xconf.knobs import (
    CONTRACT_KNOBS,
    KNOBS,
    LOGP_BACKEND,
    ROLLOUT_KV_CACHE_DTYPE,
    ROLLOUT_MAX_NUM_BATCHED_TOKENS,
    ROLLOUT_WEIGHT_SYNC,
    ROLLOUT_WEIGHT_SYNC_DTYPE,
    TRAINING_ALIGN,
    TRAINING_ALIGN_ALL,
    TRAINING_APPLY_ROPE_FUSION,
    TRAINING_BIAS_ACTIVATION_FUSION,
    TRAINING_BIAS_DROPOUT_FUSION,
    TRAINING_CROSS_ENTROPY_LOSS_FUSION,
    TRAINING_LOGITS_DTYPE,
    TRAINING_MASKED_SOFTMAX_FUSION,
    TRAINING_SCORING_MODE,
    TRAINING_SEQUENCE_PARALLEL,
    TRAINING_TEMPERATURE,
    TRAINING_TENSOR_PARALLEL_SIZE,
)
from xconf.operators.catalog import ResolutionPolicy, SemanticOperatorCatalog, Side
from xconf.planner import plan_experiment
from xconf.runner import frozen_inputs
from xconf.runtime.protocol import knob_readback
from xconf.runtime.side import SideSpec
from xconf.testing.smoke_ops import register_smoke_operators

# logp.backend is the operator binding's (materialization.backend_application), no handler's.
BOUND = frozenset(KNOBS) - {LOGP_BACKEND.path}
# Megatron's training side's own knobs: the transformers side has no handler for them.
MEGATRON = frozenset(
    spec.path
    for spec in (
        TRAINING_TENSOR_PARALLEL_SIZE,
        TRAINING_SEQUENCE_PARALLEL,
        TRAINING_BIAS_ACTIVATION_FUSION,
        TRAINING_BIAS_DROPOUT_FUSION,
        TRAINING_MASKED_SOFTMAX_FUSION,
        TRAINING_APPLY_ROPE_FUSION,
        TRAINING_CROSS_ENTROPY_LOSS_FUSION,
    )
)
# The transformers training side's own knobs (the replacement arms, the scoring shape, the
# head's dtype, the temperature): Megatron's side has no handler for them.
HF_TRAINING = frozenset(
    {*(spec.path for spec in TRAINING_ALIGN.values()), TRAINING_ALIGN_ALL.path}
    | {TRAINING_SCORING_MODE.path, TRAINING_LOGITS_DTYPE.path, TRAINING_TEMPERATURE.path}
)
# vLLM's own rollout knobs (its weight-update path): the transformers reference scorer has none.
VLLM_ROLLOUT = frozenset({ROLLOUT_WEIGHT_SYNC.path, ROLLOUT_WEIGHT_SYNC_DTYPE.path})
# Each runtime's two sides, as conf/runtime/*.yaml pairs them.
PAIRS: dict[str, tuple[SideSpec[Any, Any], SideSpec[Any, Any]]] = {
    "vllm_hf": (vllm.VLLM, hf.TRAINING),
    "hf_pair": (hf.REFERENCE, hf.TRAINING),
    "vllm_megatron": (vllm.VLLM, megatron.TRAINING),
    "cpu_smoke": (cpu_smoke.ROLLOUT, cpu_smoke.TRAINING),
}


def _side_knobs(spec: SideSpec[Any, Any]) -> set[str]:
    return {p for p in BOUND if KNOBS[p].side in (spec.side, "both")}


@pytest.mark.parametrize(
    ("pair", "honoured"),
    [
        ("vllm_hf", BOUND - MEGATRON),
        ("hf_pair", BOUND - MEGATRON - VLLM_ROLLOUT),
        ("vllm_megatron", BOUND - HF_TRAINING),
        ("cpu_smoke", CONTRACT_KNOBS & BOUND),
    ],
)
def test_each_runtime_declares_one_handler_per_knob_it_honours(pair, honoured) -> None:
    """Each side's table holds its own side's knobs (and ``batch.size``), no other."""
    for spec in PAIRS[pair]:
        assert set(spec.handlers) == honoured & _side_knobs(spec), spec


def test_the_default_bind_reports_a_knob_without_a_handler_unsupported(s0_doc) -> None:
    s0_doc["schema_version"] = EXPERIMENT_SCHEMA_V2
    s0_doc["baseline"]["rollout"]["kv_cache_dtype"] = "auto"
    plan = plan_experiment(parse_experiment(s0_doc))
    catalog = SemanticOperatorCatalog.from_entry_points()
    register_smoke_operators(catalog)
    policy = ResolutionPolicy(allow_smoke_operators=True)
    case = build_execution_plan(plan, catalog, policy).cases[0]
    binding = CpuSmokeRuntime().bind(case, plan.spec.identity)
    kv = next(k for k in binding.rollout.knobs if k.path == ROLLOUT_KV_CACHE_DTYPE.path)
    assert (kv.status, kv.materialized) == ("unsupported", None)
    assert kv.evidence == f"the cpu-smoke runtime has no {ROLLOUT_KV_CACHE_DTYPE.path}"
    assert {k.path for k in binding.rollout.knobs} | {
        k.path for k in binding.training.knobs
    } == set(case.case.knob_dict()) - {LOGP_BACKEND.path}


@pytest.mark.parametrize(
    ("pair", "unread"),
    [
        ("vllm_hf", set()),
        ("hf_pair", {ROLLOUT_MAX_NUM_BATCHED_TOKENS.path}),
        ("vllm_megatron", set()),
        ("cpu_smoke", set()),
    ],
)
def test_each_handler_reads_its_knob_back(pair, unread) -> None:
    """Every knob a runtime honours is read back by its own handler; the one without a
    reading (hf_pair's reference has no scheduler budget) is unobservable, by its table."""
    unread_by_sides = {
        path for spec in PAIRS[pair] for path, h in spec.handlers.items() if h.readback is None
    }
    assert unread_by_sides == unread


def test_an_engine_reports_knob_values_only_through_the_handlers(s0_doc) -> None:
    """The synthetic engines name no knob: every knob value they report is what the knob's
    handler read from their live state (a knob the engine wrote itself would differ)."""
    identity = parse_experiment(s0_doc).identity
    runtime = CpuSmokeRuntime()
    rollout = engines.RolloutEngine(
        runtime.model_config,
        "bfloat16",
        prefix_caching=True,
        eager=False,
        mode="decode",
        readback=cpu_smoke.ROLLOUT.readback,
    )
    training = engines.TrainingEngine(
        runtime.model_config, "float32", "eager", readback=cpu_smoke.TRAINING.readback
    )
    sides: tuple[tuple[Side, Any, SideSpec[Any, Any]], ...] = (
        ("rollout", rollout, cpu_smoke.ROLLOUT),
        ("training", training, cpu_smoke.TRAINING),
    )
    for side, engine, spec in sides:
        engine.score(frozen_inputs(identity), identity, 2, None)
        reported = {k: v for k, v in engine.readback().items() if k in KNOBS}
        assert reported == knob_readback(spec.handlers, side, engine.live())
        assert set(reported) == set(spec.handlers)
    assert rollout.readback()["rollout.dtype"] == "bfloat16"
    assert (rollout.readback()["rollout.enforce_eager"], rollout.readback()["batch.size"]) == (
        False,
        2,
    )
    assert training.readback()["training.attention_backend"] == "eager"
