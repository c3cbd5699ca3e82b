"""Every knob goes through one mechanism on every runtime: the runtime's handler table and the
one default bind (``runtime/materialization.default_bind``). A knob with no handler is
unsupported by construction, contract and extended knobs alike."""

from __future__ import annotations

from typing import Any

import pytest

from xconf.adapters.cpu_smoke import engines
from xconf.adapters.cpu_smoke.adapter import HANDLERS as CPU_SMOKE
from xconf.adapters.cpu_smoke.adapter import CpuSmokeRuntime
from xconf.adapters.megatron.handlers import HANDLERS as MEGATRON_HANDLERS
from xconf.adapters.vllm_transformers.handlers import HANDLERS as VLLM_HF
from xconf.adapters.vllm_transformers.hf_pair import HANDLERS as HF_PAIR
from xconf.config.strict import parse_experiment
from xconf.execution_plan import build_execution_plan
from xconf.experiment import EXPERIMENT_SCHEMA_V2
from xconf.knobs import (
    CONTRACT_KNOBS,
    KNOBS,
    LOGP_BACKEND,
    ROLLOUT_KV_CACHE_DTYPE,
    ROLLOUT_MAX_NUM_BATCHED_TOKENS,
    TRAINING_APPLY_ROPE_FUSION,
    TRAINING_BIAS_ACTIVATION_FUSION,
    TRAINING_BIAS_DROPOUT_FUSION,
    TRAINING_CROSS_ENTROPY_LOSS_FUSION,
    TRAINING_MASKED_SOFTMAX_FUSION,
    TRAINING_SEQUENCE_PARALLEL,
    TRAINING_TENSOR_PARALLEL_SIZE,
)
from xconf.operators.catalog import ResolutionPolicy, SemanticOperatorCatalog, Side
from xconf.planner import plan_experiment
from xconf.runner import frozen_inputs
from xconf.runtime.protocol import knob_readback
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


@pytest.mark.parametrize(
    ("handlers", "honoured"),
    [
        (VLLM_HF, BOUND - MEGATRON),
        (HF_PAIR, BOUND - MEGATRON),
        (CPU_SMOKE, CONTRACT_KNOBS & BOUND),
        (MEGATRON_HANDLERS, {p for p in BOUND if KNOBS[p].side != "rollout"}),
    ],
    ids=["vllm_hf", "hf_pair", "cpu_smoke", "megatron"],
)
def test_each_runtime_declares_one_handler_per_knob_it_honours(handlers, honoured) -> None:
    assert set(handlers) == honoured


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
    ("handlers", "unread"),
    [(VLLM_HF, set()), (HF_PAIR, {ROLLOUT_MAX_NUM_BATCHED_TOKENS.path}), (CPU_SMOKE, set())],
    ids=["vllm_hf", "hf_pair", "cpu_smoke"],
)
def test_each_handler_reads_its_knob_back(handlers, unread) -> None:
    """Every knob a runtime honours is read back by its own handler; the one without a
    reading (hf_pair's reference has no scheduler budget) is unobservable, by its table."""
    assert {path for path, h in handlers.items() if h.readback is None} == unread


def test_an_engine_reports_knob_values_only_through_the_handlers(s0_doc) -> None:
    """The synthetic engines name no knob: every knob value they report is what the knob's
    handler read from their live state (a knob the engine wrote itself would differ)."""
    identity = parse_experiment(s0_doc).identity
    runtime = CpuSmokeRuntime()
    rollout = engines.RolloutEngine(
        runtime.model_config, "bfloat16", prefix_caching=True, eager=False, mode="decode"
    )
    training = engines.TrainingEngine(runtime.model_config, "float32", "eager")
    sides: tuple[tuple[Side, Any], ...] = (("rollout", rollout), ("training", training))
    for side, engine in sides:
        engine.score(frozen_inputs(identity), identity, 2, None)
        reported = {k: v for k, v in engine.readback().items() if k in KNOBS}
        assert reported == knob_readback(CPU_SMOKE, side, engine.live())
        assert set(reported) == {p for p in CPU_SMOKE if KNOBS[p].side in (side, "both")}
    assert rollout.readback()["rollout.dtype"] == "bfloat16"
    assert (rollout.readback()["rollout.enforce_eager"], rollout.readback()["batch.size"]) == (
        False,
        2,
    )
    assert training.readback()["training.attention_backend"] == "eager"
