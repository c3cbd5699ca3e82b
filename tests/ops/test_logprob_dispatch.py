"""Contract-aware dispatch through the catalog: declared capabilities only, reasons, no
silent fallback; runs get the same check on every call."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from xconf.errors import OperatorResolutionError
from xconf.operators.capability import BackendCapability, Role
from xconf.operators.catalog import (
    SELECTED_LOGPROB,
    OperatorBinding,
    OperatorDescriptor,
    ResolutionPolicy,
    SemanticOperatorCatalog,
)
from xconf.operators.dispatch import OperatorSession, select_backend
from xconf.ops.logprob.contract import LogprobContract, ReductionSpec, ShardingSpec
from xconf.ops.logprob.descriptors import VOCAB_PARALLEL_ID
from xconf.ops.reference import REFERENCE_ID


def _cap(platform: str = "cpu", **overrides: object) -> BackendCapability:
    base: dict[str, object] = {
        "platform": platform,
        "tier": "production",
        "roles": {"rollout", "training"},
        "dtypes": {"float32", "bfloat16"},
        "mask_modes": {"explicit_active_mask"},
        "determinism_scopes": {"fixed_topology", "cross_tp_bitwise"},
    }
    return BackendCapability(**{**base, **overrides})  # type: ignore[arg-type]


def _descriptor(backend_id: str, *caps: BackendCapability) -> OperatorDescriptor:
    return OperatorDescriptor(
        semantic_operation=SELECTED_LOGPROB,
        backend_id=backend_id,
        factory=f"m:{backend_id}",
        version="1",
        capabilities=caps or (_cap(),),
    )


def _catalog(*descriptors: OperatorDescriptor) -> SemanticOperatorCatalog:
    return SemanticOperatorCatalog(descriptors)


def _contract(
    tp: int = 2, scope: str = "cross_tp_bitwise", backend: str = "auto"
) -> LogprobContract:
    return LogprobContract(
        ShardingSpec.even(250, 256, tp),
        logits_dtype="bfloat16",
        reduction=ReductionSpec(determinism_scope=scope),  # type: ignore[arg-type]
        requested_backend=backend,
    )


BUILTIN = SemanticOperatorCatalog.from_entry_points()


def test_builtin_dispatch_picks_the_deterministic_operator() -> None:
    result = select_backend(BUILTIN, _contract())
    assert result.backend_id == VOCAB_PARALLEL_ID and not result.fallback
    assert result.load().__name__ == "VocabParallelSelectedLogprob"
    # The reference is only TP=1 and unpadded: it would be rejected, with reasons.
    with pytest.raises(OperatorResolutionError) as err:
        select_backend(BUILTIN, _contract(tp=1, scope="fixed_topology", backend=REFERENCE_ID))
    assert err.value.code == "operator.dispatch.no_compatible_backend"
    assert "padded vocabulary" in err.value.message


def test_runtime_native_backend_is_never_a_dispatch_candidate() -> None:
    with pytest.raises(OperatorResolutionError) as err:
        select_backend(BUILTIN, _contract(backend="native"))
    assert "runtime-native" in err.value.message
    # auto never considers it, so it never shows up as a rejection either.
    assert "native:" not in str(select_backend(BUILTIN, _contract()).provenance())


def test_one_production_backend_serves_both_scopes_and_the_fast_one_is_gone() -> None:
    # The layout-dependent "fast" backend was removed (it was not faster: docs/operators.md).
    with pytest.raises(OperatorResolutionError) as err:
        select_backend(BUILTIN, _contract(backend="xconf.vocab_parallel_logp_fast"))
    assert err.value.code == "operator.dispatch.unknown_backend"
    for scope in ("fixed_topology", "cross_tp_bitwise"):
        assert select_backend(BUILTIN, _contract(scope=scope)).backend_id == VOCAB_PARALLEL_ID


def test_undeclared_platform_is_rejected_with_reason() -> None:
    with pytest.raises(OperatorResolutionError) as err:
        select_backend(BUILTIN, _contract(), platform="rocm")
    assert "no declared capability on 'rocm'" in err.value.message
    with pytest.raises(OperatorResolutionError) as unknown:
        select_backend(BUILTIN, _contract(), platform="tpu")
    assert unknown.value.code == "operator.capability.unknown_platform"


def test_unknown_requested_backend_is_an_error() -> None:
    with pytest.raises(OperatorResolutionError) as err:
        select_backend(BUILTIN, _contract(backend="nope.logp"))
    assert err.value.code == "operator.dispatch.unknown_backend"


def test_asking_for_deterministic_as_policy_points_at_determinism_scope() -> None:
    for word in ("deterministic", " Deterministic ", "fast"):
        with pytest.raises(OperatorResolutionError) as err:
            select_backend(BUILTIN, _contract(), policy=word)
        assert err.value.code == "operator.dispatch.policy_is_not_determinism"
        assert err.value.path == "reduction.determinism_scope"
    with pytest.raises(OperatorResolutionError):
        select_backend(BUILTIN, _contract(), policy="best")


def test_capability_rejection_then_choice_is_a_refused_fallback() -> None:
    cat = _catalog(_descriptor("a.first", _cap(tp_sizes={1})), _descriptor("b.second"))
    with pytest.raises(OperatorResolutionError) as err:
        select_backend(cat, _contract())
    assert err.value.code == "operator.dispatch.fallback_refused"
    assert "a.first" in err.value.message and "TP size 2" in err.value.message
    result = select_backend(cat, _contract(), allow_fallback=True)
    assert result.backend_id == "b.second" and result.fallback
    assert [r.to_dict() for r in result.rejections] == [
        {"backend_id": "a.first", "reasons": ["TP size 2 not in [1]"], "by_policy": False}
    ]
    assert result.provenance()["fallback"] is True


@pytest.mark.parametrize("skipped_is_capable", [True, False])
def test_policy_exclusions_never_count_as_fallback(skipped_is_capable: bool) -> None:
    extra: dict[str, Any] = {} if skipped_is_capable else {"tp_sizes": {1}}
    cat = _catalog(
        _descriptor("p.prod", _cap(**extra)), _descriptor("r.ref", _cap(tier="reference"))
    )
    result = select_backend(cat, _contract(), policy="reference")
    assert result.backend_id == "r.ref" and result.fallback is False
    assert len(result.rejections) == 1 and result.rejections[0].by_policy


def test_explicit_request_never_falls_back() -> None:
    cat = _catalog(_descriptor("a.first", _cap(dtypes={"float32"})), _descriptor("b.second"))
    with pytest.raises(OperatorResolutionError) as err:
        select_backend(cat, _contract(backend="A.First"), allow_fallback=True)
    assert err.value.code == "operator.dispatch.no_compatible_backend"


def test_capabilities_are_scoped_per_platform() -> None:
    cat = _catalog(_descriptor("x.op", _cap("cpu", tp_sizes={1}), _cap("cuda")))
    assert select_backend(cat, _contract(), platform="cuda").backend_id == "x.op"
    with pytest.raises(OperatorResolutionError, match="TP size 2"):
        select_backend(cat, _contract(), platform="cpu")
    d = cat.get(SELECTED_LOGPROB, "X.OP")
    assert d is not None and d.capability("cuda") is not None and d.capability("rocm") is None


def test_registration_replace_semantics_and_validation() -> None:
    cat = _catalog()
    cat.register(_descriptor(" My.Op ", _cap(tp_sizes={1})))
    assert cat.backend_ids(SELECTED_LOGPROB) == ("my.op",)
    with pytest.raises(OperatorResolutionError) as dup:
        cat.register(_descriptor("my.op"))
    assert dup.value.code == "operator.duplicate_registration"
    cat.register(_descriptor("MY.OP"), replace=True)
    assert select_backend(cat, _contract()).backend_id == "my.op"
    with pytest.raises(OperatorResolutionError) as plat:
        _cap("tpu")
    assert plat.value.code == "operator.capability.unknown_platform"


def test_registering_into_the_default_catalog_keeps_registration_order() -> None:
    cat = SemanticOperatorCatalog.from_entry_points()
    cat.register(_descriptor("tmp.seam"))
    # Production candidates registered before it win ties: no change of choice.
    assert select_backend(cat, _contract()).backend_id == VOCAB_PARALLEL_ID
    assert select_backend(cat, _contract(backend="tmp.seam")).backend_id == "tmp.seam"


# -- runs dispatch through the same declarations -----------------------------------------------


def _binding(cat: SemanticOperatorCatalog, backend_id: str, side: Role = "training"):
    d = cat.get(SELECTED_LOGPROB, backend_id)
    assert d is not None
    return OperatorBinding(
        SELECTED_LOGPROB,
        side,
        d.backend_id,
        (),
        d.fingerprint(),
        False,
        False,  # type: ignore[arg-type]
    )


def _reference_with(*caps: BackendCapability) -> SemanticOperatorCatalog:
    return _catalog(
        OperatorDescriptor(
            semantic_operation=SELECTED_LOGPROB,
            backend_id="test.ref",
            factory="xconf.ops.reference:ReferenceSelectedLogprob",
            version="1",
            capabilities=caps,
        )
    )


def test_run_calls_are_checked_against_the_descriptor() -> None:
    logits = torch.randn(4, 16, generator=torch.Generator().manual_seed(0))
    target = torch.tensor([1, 2, 3, 4])
    active = torch.tensor([True, True, False, True])
    ok = _reference_with(_cap(tier="reference", tp_sizes={1}, supports_padding=False))
    op = OperatorSession(ok, ResolutionPolicy()).instantiate(_binding(ok, "test.ref"))
    expected = torch.log_softmax(logits, -1).gather(1, target[:, None]).squeeze(1)
    assert torch.equal(op(logits, target, active)[active], expected[active])
    # Declared for another role, another dtype, or bitwise-across-TP only: every call refused.
    for cap, needle in (
        (_cap(tier="reference", roles={"rollout"}), "role 'training' not declared"),
        (_cap(tier="reference", dtypes={"bfloat16"}), "logits dtype 'float32'"),
        (_cap(tier="reference", determinism_scopes={"cross_tp_bitwise"}), "fixed_topology"),
        (_cap("cuda", tier="reference"), "no declared capability on 'cpu'"),
    ):
        bad = _reference_with(cap)
        op = OperatorSession(bad, ResolutionPolicy()).instantiate(_binding(bad, "test.ref"))
        with pytest.raises(OperatorResolutionError) as err:
            op(logits, target, active)
        assert err.value.code == "operator.dispatch.incompatible_backend"
        assert needle in err.value.message
        assert err.value.path == "operators.selected_logprob.training"


def test_run_calls_of_the_builtin_backends_pass_their_own_declarations() -> None:
    logits = torch.randn(6, 64, generator=torch.Generator().manual_seed(1)).bfloat16()
    target = torch.arange(6)
    active = torch.ones(6, dtype=torch.bool)
    session = OperatorSession(BUILTIN, ResolutionPolicy())
    for backend_id in (REFERENCE_ID, VOCAB_PARALLEL_ID):
        for side in ("rollout", "training"):
            op = session.instantiate(_binding(BUILTIN, backend_id, side))
            assert op(logits, target, active).dtype == torch.float32
