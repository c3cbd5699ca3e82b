"""Runtime materialization: requested -> materialized -> actual, fingerprints, strict checks."""

from __future__ import annotations

from dataclasses import replace

import pytest

from xconf.adapters.cpu_smoke.adapter import CpuSmokeRuntime
from xconf.config.strict import parse_experiment
from xconf.errors import RuntimeMaterializationError
from xconf.execution_plan import build_execution_plan
from xconf.operators.catalog import ResolutionPolicy, SemanticOperatorCatalog
from xconf.planner import plan_experiment
from xconf.runtime.materialization import (
    apply_readback,
    check_pre_build,
    strict_violations,
    with_fingerprints,
)
from xconf.runtime.protocol import KnobApplication, RuntimeAdapter, SideBinding
from xconf.testing.smoke_ops import register_smoke_operators


def app(path="rollout.dtype", status="applied", materialized="float32", lifecycle=None):
    from xconf.knobs import KNOBS

    return KnobApplication(
        path=path,
        side="rollout",
        lifecycle=lifecycle or KNOBS[path].lifecycle,
        requested="float32",
        materialized=materialized,
        actual=None,
        status=status,
        evidence="set at engine construction",
    )


def side(*apps: KnobApplication) -> SideBinding:
    return SideBinding("rollout", apps, "float32", (("world_size", 1),))


# -- the actual stage ------------------------------------------------------------------------


def test_readback_equal_is_applied_with_the_actual_value() -> None:
    (a,) = apply_readback(side(app()), {"rollout.dtype": "float32"})
    assert (a.requested, a.materialized, a.actual, a.status) == (
        "float32",
        "float32",
        "float32",
        "applied",
    )


def test_readback_differing_is_a_fallback() -> None:
    (a,) = apply_readback(side(app()), {"rollout.dtype": "bfloat16"})
    assert a.status == "fallback"
    assert a.actual == "bfloat16"
    assert "bfloat16" in a.evidence and "float32" in a.evidence


def test_a_fallback_names_the_engine_readings_its_readback_rests_on() -> None:
    # Prefix caching set but no cache hit in the scored pass (a prompt under one KV block):
    # the reason carries the hits, not just "False was read back".
    cached = replace(app("rollout.enable_prefix_caching", materialized=True), requested=True)
    readback = {"rollout.enable_prefix_caching": False, "rollout.prefix_cache_hits": 0}
    (a,) = apply_readback(side(cached), readback)
    assert a.status == "fallback"
    assert a.evidence == "engine runs False, True was set; rollout.prefix_cache_hits=0"
    (plain,) = apply_readback(side(app()), {"rollout.dtype": "bfloat16"})
    assert "prefix_cache_hits" not in plain.evidence


@pytest.mark.parametrize("readback", [{}, {"rollout.dtype": None}])
def test_readback_missing_is_unobservable(readback) -> None:
    (a,) = apply_readback(side(app()), readback)
    assert a.status == "unobservable"
    assert a.actual is None


@pytest.mark.parametrize("status", ["unsupported", "error"])
def test_rejected_statuses_survive_readback(status) -> None:
    (a,) = apply_readback(side(app(status=status, materialized=None)), {"rollout.dtype": "x"})
    assert a.status == status


# -- strict execution ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "strict", "refused"),
    [
        ("applied", True, False),
        ("fallback", True, True),
        ("fallback", False, False),
        ("unobservable", True, True),
        ("unobservable", False, False),
        ("unsupported", True, True),
        ("unsupported", False, True),
        ("error", False, True),
    ],
)
def test_strict_violations(status, strict, refused) -> None:
    reasons = strict_violations((app(status=status),), strict_fallback=strict)
    assert bool(reasons) is refused
    if refused:
        assert reasons[0].startswith("rollout:rollout.dtype")


def test_pre_build_check_refuses_ignored_settings_before_building() -> None:
    binding = _bindings({"rollout.tensor_parallel_size": [2]})[1]
    with pytest.raises(RuntimeMaterializationError) as info:
        check_pre_build(binding, strict_fallback=True)
    assert info.value.code == "runtime.strict_refused"
    assert info.value.path == "rollout:rollout.tensor_parallel_size"


def test_pre_build_check_leaves_unobservable_to_readback() -> None:
    """Under strict execution an unobservable setting is judged on what the built engine
    reads back: the pre-build check lets it through, while it still refuses, on the same
    side, a setting it already knows is replaced."""
    binding = _bindings({})[0]
    unobservable = app(status="unobservable")
    # Judged now, it would be refused: the pre-build check defers it on purpose.
    assert strict_violations((unobservable,), strict_fallback=True)
    deferred = replace(binding.rollout, knobs=(unobservable,))
    check_pre_build(replace(binding, rollout=deferred), strict_fallback=True)
    replaced = app(path="rollout.tensor_parallel_size", status="fallback")
    both = replace(binding.rollout, knobs=(unobservable, replaced))
    with pytest.raises(RuntimeMaterializationError) as info:
        check_pre_build(replace(binding, rollout=both), strict_fallback=True)
    assert info.value.path == "rollout:rollout.tensor_parallel_size"
    assert "rollout.dtype" not in info.value.message
    # Readback is where it is judged: an engine that exposes nothing leaves it refused.
    (after,) = apply_readback(deferred, {})
    assert after.status == "unobservable"
    assert strict_violations((after,), strict_fallback=True)


# -- fingerprints ----------------------------------------------------------------------------


def _bindings(interventions: dict, s0: dict | None = None):
    from tests.conftest import S0_JSON, load_json

    doc = s0 or load_json(S0_JSON)
    doc["interventions"] = [{"path": p, "values": v} for p, v in interventions.items()]
    catalog = SemanticOperatorCatalog.from_entry_points()
    register_smoke_operators(catalog)
    plan = plan_experiment(parse_experiment(doc))
    execution = build_execution_plan(plan, catalog, ResolutionPolicy(allow_smoke_operators=True))
    adapter = CpuSmokeRuntime()
    assert isinstance(adapter, RuntimeAdapter)
    out = []
    for case in execution.cases:
        raw = adapter.bind(case, plan.spec.identity)
        out.append(
            replace(
                raw,
                rollout=with_fingerprints(raw.rollout, case.operator("rollout"), "cpu-smoke"),
                training=with_fingerprints(raw.training, case.operator("training"), "cpu-smoke"),
            )
        )
    return out


def _keys(binding):
    return binding.rollout.reuse_key(), binding.training.reuse_key()


def test_batch_size_does_not_change_any_fingerprint() -> None:
    base, small, large = _bindings({"batch.size": [1, 4]})
    assert _keys(base) == _keys(small) == _keys(large)


@pytest.mark.parametrize(
    ("path", "value", "changed_side"),
    [
        ("rollout.dtype", "bfloat16", "rollout"),
        ("rollout.enable_prefix_caching", True, "rollout"),
        ("rollout.enforce_eager", False, "rollout"),
        ("training.attention_backend", "eager", "training"),
        ("training.compute_dtype", "bfloat16", "training"),
    ],
)
def test_engine_construction_knobs_change_the_construction_fingerprint(
    path, value, changed_side
) -> None:
    base, case = _bindings({path: [value]})
    other = "training" if changed_side == "rollout" else "rollout"
    assert (
        base.side(changed_side).construction_fingerprint
        != case.side(changed_side).construction_fingerprint
    )
    assert (
        base.side(changed_side).process_fingerprint == case.side(changed_side).process_fingerprint
    )
    assert base.side(other).reuse_key() == case.side(other).reuse_key()


def test_operator_binding_changes_the_construction_fingerprint() -> None:
    base, ref = _bindings({"logp.backend": ["xconf.reference_logp"]})
    for s in ("rollout", "training"):
        assert base.side(s).construction_fingerprint != ref.side(s).construction_fingerprint
        assert base.side(s).process_fingerprint == ref.side(s).process_fingerprint


def test_process_knobs_change_the_process_fingerprint() -> None:
    base, tp2 = _bindings({"rollout.tensor_parallel_size": [2]})
    assert base.rollout.process_fingerprint != tp2.rollout.process_fingerprint
    assert base.rollout.construction_fingerprint != tp2.rollout.construction_fingerprint
    assert base.training.reuse_key() == tp2.training.reuse_key()


def test_distributed_context_feeds_the_fingerprints() -> None:
    (base,) = _bindings({})
    from xconf.operators.catalog import OperatorBinding

    op = OperatorBinding("selected_logprob", "rollout", "native", (), "f", False, True)
    one = with_fingerprints(replace(base.rollout, distributed_context=(("world", 1),)), op, "k")
    two = with_fingerprints(replace(base.rollout, distributed_context=(("world", 2),)), op, "k")
    assert one.distributed_fingerprint != two.distributed_fingerprint
    assert one.process_fingerprint != two.process_fingerprint
    assert one.construction_fingerprint != two.construction_fingerprint


def test_materialized_record_has_three_stages_and_lifecycles() -> None:
    (base,) = _bindings({})
    record = base.to_dict()
    assert record["runtime_kind"] == "cpu-smoke"
    knobs = {k["path"]: k for k in record["sides"]["rollout"]["knobs"]}
    assert knobs["rollout.dtype"]["lifecycle"] == "engine_construction"
    assert knobs["rollout.tensor_parallel_size"]["lifecycle"] == "process"
    assert knobs["batch.size"]["lifecycle"] == "request"
    assert set(knobs["batch.size"]) >= {"requested", "materialized", "actual", "status", "evidence"}
    assert set(record["sides"]["rollout"]["fingerprints"]) == {
        "construction",
        "distributed_context",
        "process",
    }
