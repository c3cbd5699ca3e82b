"""Contract-aware dispatch through the operator catalog: declared capabilities only.

A backend serves a call only when its descriptor declares a capability on the call's
platform that meets the call's contract. Every candidate that is not chosen is reported
with its reasons. A candidate excluded by the caller's own policy (tier) is recorded as
such and never makes the choice a fallback; choosing a backend after a capability
rejection is a fallback, refused unless the caller allows it, and then recorded: nothing
falls back silently. ``requested_backend="auto"`` is resolved per process, so it is not
distributed-safe on its own: the operator's preflight checks that every rank resolved the
same backend.

Runs dispatch here too: :class:`DispatchedOperator` (what an ``OperatorSession`` hands a
runtime) checks a call's contract against the bound descriptor before computing, once per
call signature (device, dtype, vocabulary width).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal, get_args

from xconf.errors import OperatorResolutionError
from xconf.operators.capability import BackendCapability, Platform, check_platform
from xconf.operators.catalog import (
    SELECTED_LOGPROB,
    OperatorBinding,
    OperatorDescriptor,
    ResolutionPolicy,
    SemanticOperatorCatalog,
    load_object,
)

DispatchPolicy = Literal["any", "production", "reference"]
DISPATCH_POLICIES: tuple[DispatchPolicy, ...] = get_args(DispatchPolicy)
# Words that name a determinism property, not a tier: asking for one as a policy is a
# category error that must not be silently read as "any backend".
DETERMINISM_WORDS = frozenset(
    {"deterministic", "nondeterministic", "non_deterministic", "bitwise", "fast"}
)
TIER_ORDER = {"production": 0, "reference": 1}  # auto tries production first
RUNTIME_NATIVE_REASON = "runtime-native: computed on the runtime's own path, never called"


def _error(code: str, message: str, path: str) -> OperatorResolutionError:
    return OperatorResolutionError(f"operator.dispatch.{code}", message, path)


@dataclass(frozen=True)
class Rejection:
    backend_id: str
    reasons: tuple[str, ...]
    by_policy: bool

    def to_dict(self) -> dict[str, Any]:
        return {
            "backend_id": self.backend_id,
            "reasons": list(self.reasons),
            "by_policy": self.by_policy,
        }


@dataclass(frozen=True)
class DispatchResult:
    descriptor: OperatorDescriptor
    platform: Platform
    capability: BackendCapability
    rejections: tuple[Rejection, ...]
    fallback: bool

    @property
    def backend_id(self) -> str:
        return self.descriptor.backend_id

    def load(self) -> Any:
        """The descriptor's factory (imported from its ``"module:attr"`` path)."""
        return load_object(self.descriptor.factory)

    def provenance(self) -> dict[str, Any]:
        return {
            "backend_id": self.backend_id,
            "platform": self.platform,
            "tier": self.capability.tier,
            "fallback": self.fallback,
            "rejections": [r.to_dict() for r in self.rejections],
        }


def contract_reasons(
    descriptor: OperatorDescriptor, contract: Any, platform: str
) -> tuple[str, ...]:
    """Every reason ``descriptor`` cannot serve ``contract`` on ``platform``."""
    if descriptor.runtime_native:
        return (RUNTIME_NATIVE_REASON,)
    capability = descriptor.capability(platform)
    if capability is None:
        return (f"no declared capability on '{platform}'",)
    return capability.reasons_against(contract)


def _check_policy(policy: object) -> DispatchPolicy:
    if isinstance(policy, str) and policy.strip().lower() in DETERMINISM_WORDS:
        raise _error(
            "policy_is_not_determinism",
            f"policy {policy!r} names a determinism property; request it through "
            "contract.reduction.determinism_scope ('fixed_topology' or 'cross_tp_bitwise')",
            "reduction.determinism_scope",
        )
    if policy not in DISPATCH_POLICIES:
        raise _error(
            "unknown_policy",
            f"policy must be one of {list(DISPATCH_POLICIES)}, got {policy!r}",
            "policy",
        )
    return policy  # type: ignore[return-value]


def _describe(rejections: list[Rejection]) -> str:
    if not rejections:
        return "no candidates"
    return "; ".join(f"{r.backend_id}: {', '.join(r.reasons)}" for r in rejections)


def _candidates(
    catalog: SemanticOperatorCatalog, semantic_operation: str, platform: str
) -> tuple[OperatorDescriptor, ...]:
    """Production before reference before the rest, then registration order."""

    def rank(item: tuple[int, OperatorDescriptor]) -> tuple[int, int]:
        index, descriptor = item
        cap = descriptor.capability(platform)
        tier = len(TIER_ORDER) if cap is None else TIER_ORDER.get(cap.tier, len(TIER_ORDER))
        return (tier, index)

    pool = [d for d in catalog.registered(semantic_operation) if not d.runtime_native]
    return tuple(d for _, d in sorted(enumerate(pool), key=rank))


def select_backend(
    catalog: SemanticOperatorCatalog,
    contract: Any,
    *,
    platform: str = "cpu",
    policy: str = "any",
    allow_fallback: bool = False,
    semantic_operation: str = SELECTED_LOGPROB,
) -> DispatchResult:
    """Choose a backend for ``contract``; raise with every rejection when none fits."""
    plat = check_platform(platform)
    pol = _check_policy(policy)
    requested = contract.requested_backend
    if requested == "auto":
        names = _candidates(catalog, semantic_operation, plat)
    else:
        found = catalog.get(semantic_operation, requested)
        if found is None:
            raise _error(
                "unknown_backend",
                f"backend '{requested}' is not in the catalog",
                "requested_backend",
            )
        names = (found,)
    rejections: list[Rejection] = []
    for descriptor in names:
        cap = descriptor.capability(plat)
        # Policy first: a candidate the caller excluded is never a fallback.
        if cap is not None and pol != "any" and cap.tier != pol:
            rejections.append(
                Rejection(descriptor.backend_id, (f"tier '{cap.tier}' excluded by policy",), True)
            )
            continue
        reasons = contract_reasons(descriptor, contract, plat)
        if reasons or cap is None:
            rejections.append(Rejection(descriptor.backend_id, reasons, False))
            continue
        fallback = any(not r.by_policy for r in rejections)
        if fallback and not allow_fallback:
            raise _error(
                "fallback_refused",
                f"'{descriptor.backend_id}' would replace rejected candidates: "
                + _describe(rejections),
                "requested_backend",
            )
        return DispatchResult(descriptor, plat, cap, tuple(rejections), fallback)
    raise _error(
        "no_compatible_backend",
        f"no backend serves this contract on '{plat}': {_describe(rejections)}",
        "requested_backend",
    )


class DispatchedOperator:
    """A backend's implementation behind its descriptor, bound once per call signature.

    The implementation states the contract of a call through ``contract_for(logits)``;
    one that does not is checked on platform, role and logits dtype only. A contract names
    only the logits' device, dtype and vocabulary width (the rest is the implementation's
    own, fixed at construction), so the check runs once per such signature, when the first
    call of it binds the implementation: later calls of a bound signature go straight to
    the implementation, and a signature the descriptor does not serve is refused on every
    call with the reasons found when it was bound.
    """

    def __init__(self, implementation: Any, descriptor: OperatorDescriptor, side: str) -> None:
        self.implementation = implementation
        self.descriptor = descriptor
        self.side = side
        self._bound: dict[tuple[str, str, int], tuple[str, ...]] = {}

    def reasons(self, logits: Any) -> tuple[str, ...]:
        platform = str(logits.device.type)
        contract_for = getattr(self.implementation, "contract_for", None)
        if contract_for is not None:
            contract = replace(contract_for(logits), role=self.side)
            return contract_reasons(self.descriptor, contract, platform)
        cap = self.descriptor.capability(platform)
        if cap is None:
            return (f"no declared capability on '{platform}'",)
        dtype = str(logits.dtype).removeprefix("torch.")
        reasons = [] if self.side in cap.roles else [f"role '{self.side}' not declared"]
        if dtype not in cap.dtypes:
            reasons.append(f"logits dtype '{dtype}' not declared")
        return tuple(reasons)

    def bind(self, logits: Any) -> None:
        """Check the descriptor serves calls shaped like ``logits``, once per signature;
        raise ``operator.dispatch.incompatible_backend`` with the reasons when it does not."""
        signature = (str(logits.device.type), str(logits.dtype), int(logits.shape[-1]))
        reasons = self._bound.get(signature)
        if reasons is None:
            reasons = self._bound[signature] = self.reasons(logits)
        if reasons:
            raise _error(
                "incompatible_backend",
                f"backend '{self.descriptor.backend_id}' cannot serve this call: "
                + "; ".join(reasons),
                f"operators.{self.descriptor.semantic_operation}.{self.side}",
            )

    def __call__(self, logits: Any, target_ids: Any, active_mask: Any = None) -> Any:
        self.bind(logits)
        return self.implementation(logits, target_ids, active_mask)


class OperatorSession:
    """Per-case resolution: instantiates, caches and records provenance for one case only.

    A fresh session is made for every case, so failed or cached state never leaks.
    """

    def __init__(self, catalog: SemanticOperatorCatalog, policy: ResolutionPolicy) -> None:
        self._catalog = catalog
        self._policy = policy
        self._instances: dict[tuple[str, str, str, tuple[tuple[str, Any], ...]], Any] = {}
        self._provenance: list[dict[str, Any]] = []

    def instantiate(self, binding: OperatorBinding) -> Any:
        """The implementation for ``binding`` behind contract-aware dispatch (a call is checked
        against the descriptor's capabilities, once per signature); ``None`` for a
        runtime-native one."""
        descriptor = self._catalog.get(binding.semantic_operation, binding.backend_id)
        path = f"operators.{binding.semantic_operation}.{binding.side}"
        if descriptor is None or descriptor.fingerprint() != binding.descriptor_fingerprint:
            raise OperatorResolutionError(
                "operator.stale_binding",
                f"backend '{binding.backend_id}' changed or vanished since planning",
                path,
            )
        if descriptor.is_smoke_only and not self._policy.allow_smoke_operators:
            raise OperatorResolutionError(
                "operator.smoke_not_authorized",
                f"smoke-only backend '{binding.backend_id}' needs --allow-smoke-operators",
                path,
            )
        key = (binding.semantic_operation, binding.backend_id, binding.side, binding.options)
        if key not in self._instances:
            instance = None
            if not descriptor.runtime_native:
                options = dict(binding.options)
                if descriptor.factory_takes_side:
                    options["side"] = binding.side
                try:
                    factory = load_object(descriptor.factory)
                except ImportError as exc:
                    raise OperatorResolutionError(
                        "operator.factory_unavailable",
                        f"backend '{binding.backend_id}': cannot import its factory "
                        f"'{descriptor.factory}': {str(exc).splitlines()[0]}",
                        path,
                    ) from exc
                implementation = factory(**options)
                instance = DispatchedOperator(implementation, descriptor, binding.side)
            self._instances[key] = instance
        self._provenance.append({**binding.to_dict(), "version": descriptor.version})
        return self._instances[key]

    def provenance(self) -> tuple[dict[str, Any], ...]:
        return tuple(self._provenance)
