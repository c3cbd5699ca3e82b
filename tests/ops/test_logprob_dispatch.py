"""Contract-aware dispatch: declared capabilities only, reasons, no silent fallback."""

from __future__ import annotations

import pytest

from xconf.ops.logprob.builtin import (
    REFERENCE_ID,
    VOCAB_PARALLEL_FAST_ID,
    VOCAB_PARALLEL_ID,
)
from xconf.ops.logprob.capability import BackendCapability
from xconf.ops.logprob.contract import LogprobContract, ReductionSpec, ShardingSpec
from xconf.ops.logprob.dispatch import (
    LogprobBackendRegistry,
    default_logprob_registry,
    register_logprob_backend,
    select_logprob_backend,
)
from xconf.ops.logprob.errors import LogprobDispatchError


def _cap(backend_id: str, platform: str = "cpu", **overrides: object) -> BackendCapability:
    base: dict[str, object] = {
        "backend_id": backend_id,
        "platform": platform,
        "tier": "production",
        "roles": {"rollout", "training"},
        "dtypes": {"float32", "bfloat16"},
        "mask_modes": {"explicit_active_mask"},
        "determinism_scopes": {"fixed_topology", "cross_tp_bitwise"},
    }
    return BackendCapability(**{**base, **overrides})  # type: ignore[arg-type]


def _contract(
    tp: int = 2, scope: str = "cross_tp_bitwise", backend: str = "auto"
) -> LogprobContract:
    return LogprobContract(
        ShardingSpec.even(250, 256, tp),
        logits_dtype="bfloat16",
        reduction=ReductionSpec(determinism_scope=scope),  # type: ignore[arg-type]
        requested_backend=backend,
    )


def test_builtin_dispatch_picks_the_deterministic_operator() -> None:
    result = select_logprob_backend(_contract())
    assert result.backend_id == VOCAB_PARALLEL_ID and not result.fallback
    assert result.load().__name__ == "vocab_parallel_selected_logprob"
    # The reference is only TP=1 and unpadded: it would be rejected, with reasons.
    with pytest.raises(LogprobDispatchError) as err:
        select_logprob_backend(_contract(tp=1, scope="fixed_topology", backend=REFERENCE_ID))
    assert err.value.code == "logprob.dispatch.no_compatible_backend"
    assert "padded vocabulary" in err.value.message


def test_fast_backend_is_refused_for_cross_tp_bitwise() -> None:
    with pytest.raises(LogprobDispatchError) as err:
        select_logprob_backend(_contract(backend=VOCAB_PARALLEL_FAST_ID))
    assert "cross_tp_bitwise" in err.value.message
    ok = select_logprob_backend(_contract(scope="fixed_topology", backend=VOCAB_PARALLEL_FAST_ID))
    assert ok.backend_id == VOCAB_PARALLEL_FAST_ID


def test_undeclared_platform_is_rejected_with_reason() -> None:
    with pytest.raises(LogprobDispatchError) as err:
        select_logprob_backend(_contract(), platform="rocm")
    assert "no declared capability on 'rocm'" in err.value.message
    with pytest.raises(LogprobDispatchError) as unknown:
        select_logprob_backend(_contract(), platform="tpu")
    assert unknown.value.code == "logprob.dispatch.unknown_platform"


def test_unknown_requested_backend_is_an_error() -> None:
    with pytest.raises(LogprobDispatchError) as err:
        select_logprob_backend(_contract(backend="nope.logp"))
    assert err.value.code == "logprob.dispatch.unknown_backend"


def test_asking_for_deterministic_as_policy_points_at_determinism_scope() -> None:
    for word in ("deterministic", " Deterministic ", "fast"):
        with pytest.raises(LogprobDispatchError) as err:
            select_logprob_backend(_contract(), policy=word)
        assert err.value.code == "logprob.dispatch.policy_is_not_determinism"
        assert err.value.path == "reduction.determinism_scope"
    with pytest.raises(LogprobDispatchError):
        select_logprob_backend(_contract(), policy="best")


def test_capability_rejection_then_choice_is_a_refused_fallback() -> None:
    reg = LogprobBackendRegistry()
    reg.register("a.first", "m:a", _cap("a.first", tp_sizes={1}), platform="cpu")
    reg.register("b.second", "m:b", _cap("b.second"), platform="cpu")
    with pytest.raises(LogprobDispatchError) as err:
        reg.select(_contract())
    assert err.value.code == "logprob.dispatch.fallback_refused"
    assert "a.first" in err.value.message and "TP size 2" in err.value.message
    result = reg.select(_contract(), allow_fallback=True)
    assert result.backend_id == "b.second" and result.fallback
    assert [r.to_dict() for r in result.rejections] == [
        {"backend_id": "a.first", "reasons": ["TP size 2 not in [1]"], "by_policy": False}
    ]
    assert result.provenance()["fallback"] is True


@pytest.mark.parametrize("skipped_is_capable", [True, False])
def test_policy_exclusions_never_count_as_fallback(skipped_is_capable: bool) -> None:
    reg = LogprobBackendRegistry()
    extra = {} if skipped_is_capable else {"tp_sizes": {1}}
    reg.register("p.prod", "m:p", _cap("p.prod", **extra), platform="cpu")
    reg.register("r.ref", "m:r", _cap("r.ref", tier="reference"), platform="cpu")
    result = reg.select(_contract(), policy="reference")
    assert result.backend_id == "r.ref" and result.fallback is False
    assert len(result.rejections) == 1 and result.rejections[0].by_policy


def test_explicit_request_never_falls_back() -> None:
    reg = LogprobBackendRegistry()
    reg.register("a.first", "m:a", _cap("a.first", dtypes={"float32"}), platform="cpu")
    reg.register("b.second", "m:b", _cap("b.second"), platform="cpu")
    with pytest.raises(LogprobDispatchError) as err:
        reg.select(_contract(backend="A.First"), allow_fallback=True)
    assert err.value.code == "logprob.dispatch.no_compatible_backend"


def test_capabilities_are_scoped_per_platform() -> None:
    reg = LogprobBackendRegistry()
    reg.register("x.op", "m:x", _cap("x.op", "cpu", tp_sizes={1}), platform="cpu")
    reg.register("x.op", "m:x", _cap("x.op", "cuda"), platform="cuda")
    assert reg.select(_contract(), platform="cuda").backend_id == "x.op"
    with pytest.raises(LogprobDispatchError, match="TP size 2"):
        reg.select(_contract(), platform="cpu")
    assert reg.capability("X.OP", "cuda") is not None and reg.capability("x.op", "rocm") is None


def test_registration_replace_semantics_and_validation() -> None:
    reg = LogprobBackendRegistry()
    register_logprob_backend(
        " My.Op ", "m:x", _cap("my.op", tp_sizes={1}), platform="cpu", registry=reg
    )
    assert reg.backend_ids() == ("my.op",)
    with pytest.raises(LogprobDispatchError) as dup:
        reg.register("my.op", "m:x", _cap("my.op"), platform="cpu")
    assert dup.value.code == "logprob.dispatch.duplicate_backend"
    with pytest.raises(LogprobDispatchError):
        reg.register("my.op", "m:other", _cap("my.op", "cuda"), platform="cuda")
    reg.register("MY.OP", "m:x", _cap("my.op"), platform="cpu", replace=True)
    assert reg.select(_contract()).backend_id == "my.op"
    with pytest.raises(LogprobDispatchError) as plat:
        reg.register("my.op", "m:x", _cap("my.op"), platform="tpu", replace=True)
    assert plat.value.code == "logprob.dispatch.unknown_platform"
    with pytest.raises(LogprobDispatchError) as mismatch:
        reg.register("other.op", "m:x", _cap("my.op"), platform="cpu")
    assert mismatch.value.code == "logprob.dispatch.capability_mismatch"


def test_default_registry_is_shared_and_seam_registers_into_it() -> None:
    reg = default_logprob_registry()
    assert reg is default_logprob_registry()
    register_logprob_backend("tmp.seam", "m:t", _cap("tmp.seam"), platform="cpu")
    try:
        assert reg.capability("tmp.seam", "cpu") is not None
        # Production candidates come before it in registration order: no change of choice.
        assert select_logprob_backend(_contract()).backend_id == VOCAB_PARALLEL_ID
    finally:
        reg.unregister("tmp.seam")
