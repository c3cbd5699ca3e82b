"""Semantic operator catalog: immutable descriptors, strict resolution, per-case sessions."""

from __future__ import annotations

from dataclasses import FrozenInstanceError, replace

import pytest
import torch

from xconf.errors import OperatorResolutionError
from xconf.knobs import normalize_backend_id
from xconf.operators.capability import BackendCapability
from xconf.operators.catalog import (
    SELECTED_LOGPROB,
    OperatorBinding,
    OperatorDescriptor,
    ResolutionPolicy,
    SemanticOperatorCatalog,
    check_descriptor,
    load_object,
)
from xconf.operators.dispatch import OperatorSession
from xconf.testing.smoke_ops import register_smoke_operators, smoke_descriptors

KNOBS = {"training.sharding": "unsharded", "rollout.tensor_parallel_size": 1}


def cap(platform: str = "cpu", **changes) -> BackendCapability:
    return BackendCapability(platform=platform, tier="reference", **changes)  # type: ignore[arg-type]


def descriptor(backend_id: str = "test.op", **changes) -> OperatorDescriptor:
    base = OperatorDescriptor(
        semantic_operation=SELECTED_LOGPROB,
        backend_id=backend_id,
        factory="xconf.ops.reference:ReferenceSelectedLogprob",
        version="1",
        capabilities=(cap(),),
    )
    return replace(base, **changes)


def registered(catalog: SemanticOperatorCatalog, backend_id: str) -> OperatorDescriptor:
    """``catalog``'s descriptor for ``backend_id``; fails the test when it is not registered."""
    d = catalog.get(SELECTED_LOGPROB, backend_id)
    assert d is not None, f"{backend_id} is not registered"
    return d


def declared(d: OperatorDescriptor, platform: str) -> BackendCapability:
    """``d``'s capability on ``platform``; fails the test when it declares none there."""
    c = d.capability(platform)
    assert c is not None, f"{d.backend_id} declares no capability on {platform}"
    return c


def binding_for(d: OperatorDescriptor, side="training", options=()) -> OperatorBinding:
    return OperatorBinding(
        SELECTED_LOGPROB, side, d.backend_id, options, d.fingerprint(), d.is_smoke_only, False
    )


def check(d, *, side="training", dtype="float32", knobs=KNOBS, policy=None):
    return check_descriptor(
        d,
        side=side,
        backend_id=getattr(d, "backend_id", "missing"),
        dtype=dtype,
        knobs=knobs,
        policy=policy or ResolutionPolicy(),
        path="operators.selected_logprob.training",
    )


# -- catalog ---------------------------------------------------------------------------------


def test_duplicate_registration_is_refused() -> None:
    catalog = SemanticOperatorCatalog([descriptor()])
    with pytest.raises(OperatorResolutionError) as info:
        catalog.register(descriptor(version="2"))
    assert info.value.code == "operator.duplicate_registration"
    assert registered(catalog, "test.op").version == "1"


def test_duplicate_registration_by_alias_is_refused() -> None:
    catalog = SemanticOperatorCatalog([descriptor("xconf.reference_logp")])
    with pytest.raises(OperatorResolutionError):
        catalog.register(descriptor("RLKernel.Reference_LogP"))


def test_replace_swaps_the_descriptor() -> None:
    catalog = SemanticOperatorCatalog([descriptor()])
    catalog.register(descriptor(version="2"), replace=True)
    assert registered(catalog, "test.op").version == "2"
    assert catalog.backend_ids(SELECTED_LOGPROB) == ("test.op",)


@pytest.mark.parametrize(
    ("raw", "normalized"),
    [
        ("  Native ", "native"),
        ("auto", "native"),
        ("default", "native"),
        ("rlkernel.reference_logp", "xconf.reference_logp"),
        ("reference", "xconf.reference_logp"),
        ("Smoke_Only.Logp_Offset", "smoke_only.logp_offset"),
    ],
)
def test_backend_ids_normalize(raw: str, normalized: str) -> None:
    assert normalize_backend_id(raw) == normalized
    assert descriptor(raw).backend_id == normalized
    catalog = SemanticOperatorCatalog([descriptor(normalized)])
    assert catalog.get(SELECTED_LOGPROB, raw) is not None


def test_descriptors_are_immutable() -> None:
    d = descriptor(required_topology={"training": {"training.sharding": "unsharded"}})
    with pytest.raises(FrozenInstanceError):
        d.version = "2"  # type: ignore[misc]
    with pytest.raises(TypeError):
        d.required_topology["training"]["training.sharding"] = "fsdp"  # type: ignore[index]


def test_fingerprint_tracks_behaviour_defining_fields() -> None:
    d = descriptor()
    assert d.fingerprint() == descriptor().fingerprint()
    for change in ({"version": "2"}, {"factory": "x:y"}, {"build_fingerprint": "abc"}):
        assert descriptor(**change).fingerprint() != d.fingerprint()


def test_default_catalog_has_no_smoke_operators() -> None:
    catalog = SemanticOperatorCatalog.from_entry_points()
    ids = catalog.backend_ids(SELECTED_LOGPROB)
    assert "native" in ids and "xconf.reference_logp" in ids
    assert not [b for b in ids if b.startswith("smoke_only.")]
    assert not any(d.is_smoke_only for d in catalog.descriptors())


def test_smoke_descriptors_are_marked_and_cpu_only() -> None:
    found = {d.backend_id: d for d in smoke_descriptors()}
    assert set(found) == {"smoke_only.logp_reference", "smoke_only.logp_offset"}
    assert all(d.is_smoke_only and d.devices == frozenset({"cpu"}) for d in found.values())


# -- strict resolution -----------------------------------------------------------------------


def test_unknown_backend_never_falls_back() -> None:
    catalog = SemanticOperatorCatalog.from_entry_points()
    with pytest.raises(OperatorResolutionError) as info:
        check(catalog.get(SELECTED_LOGPROB, "acme.fast"))
    assert info.value.code == "operator.unknown_backend"
    assert info.value.path == "operators.selected_logprob.training"


@pytest.mark.parametrize(
    ("changes", "kwargs", "reason"),
    [
        ({"capabilities": (cap(roles={"rollout"}),)}, {}, "does not serve the training side"),
        ({"capabilities": (cap("cuda"),)}, {}, "does not run on device 'cpu'"),
        ({"capabilities": (cap(dtypes={"bfloat16"}),)}, {}, "does not support dtype 'float32'"),
        (
            {"required_topology": {"training": {"training.sharding": "fsdp"}}},
            {},
            "requires training.sharding='fsdp'",
        ),
        ({"is_smoke_only": True}, {}, "did not authorize smoke operators"),
    ],
)
def test_incompatible_backend_is_refused(changes, kwargs, reason) -> None:
    with pytest.raises(OperatorResolutionError) as info:
        check(descriptor(**changes), **kwargs)
    assert info.value.code == "operator.incompatible_backend"
    assert reason in info.value.message


def test_every_reason_is_reported() -> None:
    bad = descriptor(
        capabilities=(cap(roles={"rollout"}, dtypes={"float16"}),),
        required_topology={"training": {"training.sharding": "fsdp"}},
        is_smoke_only=True,
    )
    with pytest.raises(OperatorResolutionError) as info:
        check(bad)
    assert info.value.message.count(";") == 3
    # The side, dtype and topology of a platform the descriptor does not declare are moot.
    with pytest.raises(OperatorResolutionError) as info:
        check(replace(bad, capabilities=(cap("cuda", roles={"rollout"}),)))
    assert info.value.message.count(";") == 2 and "device 'cpu'" in info.value.message


def test_capabilities_are_declared_once_per_platform() -> None:
    for capabilities in ((), (cap(), cap(roles={"rollout"}))):
        with pytest.raises(OperatorResolutionError) as info:
            descriptor(capabilities=capabilities)
        assert info.value.code == "operator.capability.declaration"
    d = descriptor(capabilities=(cap(), cap("cuda", dtypes={"bfloat16"})))
    assert d.devices == frozenset({"cpu", "cuda"})
    assert declared(d, "cuda").dtypes == frozenset({"bfloat16"})
    assert d.capability("rocm") is None
    # Declarations do not define behaviour: stored attempts stay reusable across them.
    assert d.fingerprint() == descriptor().fingerprint()


def test_reference_backend_is_declared_once_and_truthfully() -> None:
    # One declaration: the reference runs on cpu and cuda, over one whole unpadded row.
    reference = registered(SemanticOperatorCatalog.from_entry_points(), "xconf.reference_logp")
    assert reference.devices == frozenset({"cpu", "cuda"})
    for platform in ("cpu", "cuda"):
        c = declared(reference, platform)
        assert c.tier == "reference" and c.tp_sizes == c.cp_sizes == frozenset({1})
        assert not c.supports_padding


def test_compatible_backend_resolves() -> None:
    d = descriptor(required_topology={"training": {"training.sharding": "unsharded"}})
    assert check(d) is d


def test_smoke_needs_registration_and_authorization() -> None:
    allowed = ResolutionPolicy(allow_smoke_operators=True)
    catalog = SemanticOperatorCatalog.from_entry_points()
    # authorized but not registered: unknown
    with pytest.raises(OperatorResolutionError) as info:
        check(catalog.get(SELECTED_LOGPROB, "smoke_only.logp_offset"), policy=allowed)
    assert info.value.code == "operator.unknown_backend"
    register_smoke_operators(catalog)
    smoke = catalog.get(SELECTED_LOGPROB, "smoke_only.logp_offset")
    # registered but not authorized: refused
    with pytest.raises(OperatorResolutionError) as info:
        check(smoke)
    assert info.value.code == "operator.incompatible_backend"
    # both: resolves
    assert check(smoke, policy=allowed) is smoke


# -- sessions --------------------------------------------------------------------------------


def _catalog(*extra: OperatorDescriptor) -> SemanticOperatorCatalog:
    catalog = SemanticOperatorCatalog.from_entry_points()
    register_smoke_operators(catalog)
    for d in extra:
        catalog.register(d)
    return catalog


def test_session_caches_within_a_case_and_records_provenance() -> None:
    catalog = _catalog()
    d = registered(catalog, "xconf.reference_logp")
    session = OperatorSession(catalog, ResolutionPolicy())
    first = session.instantiate(binding_for(d))
    assert session.instantiate(binding_for(d)) is first
    assert len(session.provenance()) == 2
    assert session.provenance()[0]["backend_id"] == "xconf.reference_logp"
    assert session.provenance()[0]["version"] == "1"


def test_sessions_do_not_share_instances_or_provenance() -> None:
    catalog = _catalog()
    d = registered(catalog, "xconf.reference_logp")
    one = OperatorSession(catalog, ResolutionPolicy())
    two = OperatorSession(catalog, ResolutionPolicy())
    assert one.instantiate(binding_for(d)) is not two.instantiate(binding_for(d))
    one.instantiate(binding_for(d, side="rollout"))
    assert len(one.provenance()) == 2 and len(two.provenance()) == 1


def test_failed_resolution_does_not_leak_into_the_next_session() -> None:
    catalog = _catalog(descriptor("test.broken", factory="xconf.no_such_module:Op"))
    broken = registered(catalog, "test.broken")
    session = OperatorSession(catalog, ResolutionPolicy())
    with pytest.raises(OperatorResolutionError) as info:
        session.instantiate(binding_for(broken))
    assert info.value.code == "operator.factory_unavailable"
    assert "xconf.no_such_module" in info.value.message
    assert session.provenance() == ()
    fresh = OperatorSession(catalog, ResolutionPolicy())
    ref = registered(catalog, "xconf.reference_logp")
    assert fresh.instantiate(binding_for(ref)) is not None
    assert [p["backend_id"] for p in fresh.provenance()] == ["xconf.reference_logp"]


def test_runtime_native_backend_has_no_instance() -> None:
    catalog = _catalog()
    native = registered(catalog, "native")
    b = OperatorBinding(
        SELECTED_LOGPROB, "rollout", "native", (), native.fingerprint(), False, True
    )
    assert OperatorSession(catalog, ResolutionPolicy()).instantiate(b) is None


def test_stale_binding_is_detected() -> None:
    catalog = _catalog(descriptor())
    binding = binding_for(registered(catalog, "test.op"))
    catalog.register(descriptor(version="2"), replace=True)
    with pytest.raises(OperatorResolutionError) as info:
        OperatorSession(catalog, ResolutionPolicy()).instantiate(binding)
    assert info.value.code == "operator.stale_binding"


def test_vanished_backend_is_a_stale_binding() -> None:
    binding = binding_for(descriptor("test.gone"))
    with pytest.raises(OperatorResolutionError) as info:
        OperatorSession(_catalog(), ResolutionPolicy()).instantiate(binding)
    assert info.value.code == "operator.stale_binding"


def test_session_refuses_unauthorized_smoke() -> None:
    catalog = _catalog()
    smoke = registered(catalog, "smoke_only.logp_reference")
    with pytest.raises(OperatorResolutionError) as info:
        OperatorSession(catalog, ResolutionPolicy()).instantiate(binding_for(smoke))
    assert info.value.code == "operator.smoke_not_authorized"


def test_offset_operator_shifts_only_the_training_side() -> None:
    catalog = _catalog()
    offset = registered(catalog, "smoke_only.logp_offset")
    session = OperatorSession(catalog, ResolutionPolicy(allow_smoke_operators=True))
    logits = torch.randn(3, 11, generator=torch.Generator().manual_seed(0))
    targets = torch.tensor([1, 2, 3])
    active = torch.tensor([True, True, False])
    roll = session.instantiate(binding_for(offset, side="rollout"))(logits, targets, active)
    train = session.instantiate(binding_for(offset, side="training"))(logits, targets, active)
    assert torch.allclose(train[:2] - roll[:2], torch.tensor(0.25))
    assert train[2] == roll[2]


def test_load_object_accepts_both_spellings() -> None:
    a = load_object("xconf.ops.reference:ReferenceSelectedLogprob")
    assert a is load_object("xconf.ops.reference.ReferenceSelectedLogprob")
