"""Execution plan: operator bindings folded into each immutable case, strictly resolved."""

from __future__ import annotations

from dataclasses import FrozenInstanceError

import pytest

from xconf.config.strict import parse_experiment
from xconf.errors import PlanError
from xconf.execution_plan import build_execution_plan
from xconf.operators.capability import BackendCapability
from xconf.operators.catalog import (
    SELECTED_LOGPROB,
    OperatorDescriptor,
    ResolutionPolicy,
    SemanticOperatorCatalog,
)
from xconf.planner import plan_experiment
from xconf.testing.smoke_ops import register_smoke_operators

ALLOW = ResolutionPolicy(allow_smoke_operators=True)


def catalog(smoke: bool = True) -> SemanticOperatorCatalog:
    c = SemanticOperatorCatalog.from_entry_points()
    if smoke:
        register_smoke_operators(c)
    return c


def execution(doc, policy=ALLOW, cat=None):
    return build_execution_plan(plan_experiment(parse_experiment(doc)), cat or catalog(), policy)


def test_logp_backend_binds_the_same_backend_on_both_sides(s0_doc) -> None:
    for case in execution(s0_doc).cases:
        backend = case.case.knob_dict()["logp.backend"]
        assert case.operator("rollout").backend_id == backend
        assert case.operator("training").backend_id == backend
        assert case.to_row()["operators"] == {"rollout": backend, "training": backend}


def test_explicit_mapping_picks_each_side_independently(s0_doc) -> None:
    s0_doc["interventions"] = [{"path": "batch.size", "values": [1]}]
    s0_doc["operators"] = {
        "selected_logprob": {
            "rollout": "native",
            "training": {"backend": "rlkernel.reference_logp", "options": {}},
        }
    }
    for case in execution(s0_doc).cases:
        assert case.operator("rollout").backend_id == "native"
        assert case.operator("rollout").runtime_native
        assert case.operator("training").backend_id == "xconf.reference_logp"
        assert not case.operator("training").runtime_native


def test_a_side_left_out_of_the_mapping_follows_logp_backend(s0_doc) -> None:
    s0_doc["interventions"] = []
    s0_doc["baseline"]["logp"]["backend"] = "xconf.reference_logp"
    s0_doc["operators"] = {"selected_logprob": {"training": "native"}}
    (case,) = execution(s0_doc).cases
    assert case.operator("rollout").backend_id == "xconf.reference_logp"
    assert case.operator("training").backend_id == "native"


def test_bindings_carry_the_descriptor_fingerprint(s0_doc) -> None:
    cat = catalog()
    for case in execution(s0_doc, cat=cat).cases:
        for side in ("rollout", "training"):
            b = case.operator(side)
            d = cat.get(SELECTED_LOGPROB, b.backend_id)
            assert d is not None and b.descriptor_fingerprint == d.fingerprint()
    digests = {c.binding_digest() for c in execution(s0_doc, cat=cat).cases}
    assert len(digests) == 4  # native, reference, smoke reference, smoke offset


def test_smoke_cases_are_refused_without_authorization(s0_doc) -> None:
    with pytest.raises(PlanError) as info:
        execution(s0_doc, policy=ResolutionPolicy())
    issues = info.value.issues
    assert {i.code for i in issues} == {"operator.incompatible_backend"}
    assert {i.path for i in issues} == {"logp.backend"}
    assert len(issues) == 4  # two smoke cases, two sides each
    assert all("smoke-only" in i.message for i in issues)


def test_unregistered_smoke_is_refused_even_when_authorized(s0_doc) -> None:
    with pytest.raises(PlanError) as info:
        execution(s0_doc, cat=catalog(smoke=False))
    assert {i.code for i in info.value.issues} == {"operator.smoke_not_authorized"}


def test_device_incompatibility_is_reported_per_case(s0_doc) -> None:
    with pytest.raises(PlanError) as info:
        execution(s0_doc, policy=ResolutionPolicy(allow_smoke_operators=True, device="cuda"))
    assert all("does not run on device 'cuda'" in i.message for i in info.value.issues)


def test_topology_requirement_is_checked_per_case(s0_doc) -> None:
    cat = catalog()
    cat.register(
        OperatorDescriptor(
            semantic_operation=SELECTED_LOGPROB,
            backend_id="test.unsharded_only",
            factory="xconf.ops.reference:ReferenceSelectedLogprob",
            version="1",
            capabilities=(BackendCapability(platform="cpu", tier="reference"),),
            required_topology={"training": {"training.sharding": "unsharded"}},
        )
    )
    s0_doc["baseline"]["logp"]["backend"] = "test.unsharded_only"
    s0_doc["interventions"] = [{"path": "training.sharding", "values": ["fsdp"]}]
    with pytest.raises(PlanError) as info:
        execution(s0_doc, cat=cat)
    (issue,) = info.value.issues
    assert issue.code == "operator.incompatible_backend"
    assert "requires training.sharding='unsharded'" in issue.message
    assert "training.sharding=fsdp" in issue.message  # names the case


def test_execution_cases_are_immutable_rows(s0_doc) -> None:
    case = execution(s0_doc).cases[0]
    with pytest.raises(FrozenInstanceError):
        case.operators = ()  # type: ignore[misc]
    row = case.to_row()
    assert set(row) == {"case_id", "index", "kind", "changed", "knobs", "operators"}
    assert row["knobs"]["batch.size"] == 2
