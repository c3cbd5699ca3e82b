"""Contract-aware dispatch: only backends with a declared capability are candidates.

Every candidate that is not chosen is reported with its reasons. A candidate excluded
by the caller's own policy (tier) is recorded as such and never makes the choice a
fallback. Choosing a backend after a capability rejection is a fallback, which is
refused unless the caller allows it, and then recorded: nothing falls back silently.
``requested_backend="auto"`` is not distributed-safe on its own: the operator's
preflight checks that every rank resolved the same backend.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, get_args

from xconf.ops.logprob.capability import BackendCapability
from xconf.ops.logprob.contract import (
    PLATFORMS,
    LogprobContract,
    Platform,
    normalize_logprob_backend_id,
)
from xconf.ops.logprob.errors import LogprobDispatchError

DispatchPolicy = Literal["any", "production", "reference"]
DISPATCH_POLICIES: tuple[DispatchPolicy, ...] = get_args(DispatchPolicy)
# Words that name a determinism property, not a tier: asking for one as a policy is a
# category error that must not be silently read as "any backend".
DETERMINISM_WORDS = frozenset(
    {"deterministic", "nondeterministic", "non_deterministic", "bitwise", "fast"}
)

Factory = Callable[..., Any] | str


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
    backend_id: str
    platform: Platform
    capability: BackendCapability
    factory: Factory
    rejections: tuple[Rejection, ...]
    fallback: bool

    def load(self) -> Any:
        """The factory itself, importing it first when declared as ``"module:attr"``."""
        if isinstance(self.factory, str):
            from xconf.semantic_registry import load_object

            return load_object(self.factory)
        return self.factory

    def provenance(self) -> dict[str, Any]:
        return {
            "backend_id": self.backend_id,
            "platform": self.platform,
            "tier": self.capability.tier,
            "fallback": self.fallback,
            "rejections": [r.to_dict() for r in self.rejections],
        }


@dataclass(frozen=True)
class _Entry:
    factory: Factory
    capabilities: tuple[tuple[Platform, BackendCapability], ...]

    def on(self, platform: str) -> BackendCapability | None:
        return next((cap for p, cap in self.capabilities if p == platform), None)


def _check_platform(platform: object) -> Platform:
    if platform not in PLATFORMS:
        raise LogprobDispatchError(
            "logprob.dispatch.unknown_platform",
            f"platform must be one of {list(PLATFORMS)}, got {platform!r}",
            "platform",
        )
    return platform  # type: ignore[return-value]


def _check_policy(policy: object) -> DispatchPolicy:
    if isinstance(policy, str) and policy.strip().lower() in DETERMINISM_WORDS:
        raise LogprobDispatchError(
            "logprob.dispatch.policy_is_not_determinism",
            f"policy {policy!r} names a determinism property; request it through "
            "contract.reduction.determinism_scope ('fixed_topology' or 'cross_tp_bitwise')",
            "reduction.determinism_scope",
        )
    if policy not in DISPATCH_POLICIES:
        raise LogprobDispatchError(
            "logprob.dispatch.unknown_policy",
            f"policy must be one of {list(DISPATCH_POLICIES)}, got {policy!r}",
            "policy",
        )
    return policy  # type: ignore[return-value]


class LogprobBackendRegistry:
    """Backends by normalized id; capabilities are scoped per platform."""

    def __init__(self) -> None:
        self._entries: dict[str, _Entry] = {}

    def register(
        self,
        backend_id: str,
        factory: Factory,
        capability: BackendCapability,
        *,
        platform: str,
        replace: bool = False,
    ) -> None:
        """Declare ``backend_id`` on ``platform``; re-declaring needs ``replace=True``."""
        key = normalize_logprob_backend_id(backend_id)
        plat = _check_platform(platform)
        if capability.backend_id != key or capability.platform != plat:
            raise LogprobDispatchError(
                "logprob.dispatch.capability_mismatch",
                f"capability declares ({capability.backend_id}, {capability.platform}), "
                f"registered as ({key}, {plat})",
                f"backends.{key}",
            )
        entry = self._entries.get(key)
        if entry is not None and not replace:
            if entry.on(plat) is not None:
                raise LogprobDispatchError(
                    "logprob.dispatch.duplicate_backend",
                    f"backend '{key}' is already declared on '{plat}' (use replace=True)",
                    f"backends.{key}",
                )
            if entry.factory != factory:
                raise LogprobDispatchError(
                    "logprob.dispatch.duplicate_backend",
                    f"backend '{key}' is registered with another factory (use replace=True)",
                    f"backends.{key}",
                )
        kept = () if entry is None else tuple((p, c) for p, c in entry.capabilities if p != plat)
        self._entries[key] = _Entry(factory, (*kept, (plat, capability)))

    def unregister(self, backend_id: str) -> None:
        self._entries.pop(normalize_logprob_backend_id(backend_id), None)

    def backend_ids(self) -> tuple[str, ...]:
        return tuple(self._entries)

    def capability(self, backend_id: str, platform: str) -> BackendCapability | None:
        entry = self._entries.get(normalize_logprob_backend_id(backend_id))
        return None if entry is None else entry.on(_check_platform(platform))

    def select(
        self,
        contract: LogprobContract,
        *,
        platform: str = "cpu",
        policy: str = "any",
        allow_fallback: bool = False,
    ) -> DispatchResult:
        """Choose a backend for ``contract``; raise with every rejection when none fits."""
        plat = _check_platform(platform)
        pol = _check_policy(policy)
        requested = contract.requested_backend
        if requested != "auto" and requested not in self._entries:
            raise LogprobDispatchError(
                "logprob.dispatch.unknown_backend",
                f"backend '{requested}' has no declared capability on any platform",
                "requested_backend",
            )
        names = (requested,) if requested != "auto" else self._ordered(plat)
        rejections: list[Rejection] = []
        for name in names:
            entry = self._entries[name]
            cap = entry.on(plat)
            # Policy first: a candidate the caller excluded is never a fallback.
            if cap is not None and pol != "any" and cap.tier != pol:
                rejections.append(Rejection(name, (f"tier '{cap.tier}' excluded by policy",), True))
                continue
            if cap is None:
                rejections.append(Rejection(name, (f"no declared capability on '{plat}'",), False))
                continue
            reasons = cap.reasons_against(contract)
            if reasons:
                rejections.append(Rejection(name, reasons, False))
                continue
            fallback = any(not r.by_policy for r in rejections)
            if fallback and not allow_fallback:
                raise LogprobDispatchError(
                    "logprob.dispatch.fallback_refused",
                    f"'{name}' would replace rejected candidates: {_describe(rejections)}",
                    "requested_backend",
                )
            return DispatchResult(name, plat, cap, entry.factory, tuple(rejections), fallback)
        raise LogprobDispatchError(
            "logprob.dispatch.no_compatible_backend",
            f"no backend serves this contract on '{plat}': {_describe(rejections)}",
            "requested_backend",
        )

    def _ordered(self, platform: str) -> tuple[str, ...]:
        """Production before reference, then registration order; undeclared ones last."""

        def rank(item: tuple[int, str]) -> tuple[int, int]:
            index, name = item
            cap = self._entries[name].on(platform)
            tier_rank = 2 if cap is None else (0 if cap.tier == "production" else 1)
            return (tier_rank, index)

        return tuple(name for _, name in sorted(enumerate(self._entries), key=rank))


def _describe(rejections: list[Rejection]) -> str:
    if not rejections:
        return "no candidates"
    return "; ".join(f"{r.backend_id}: {', '.join(r.reasons)}" for r in rejections)


def _builtin_registry() -> LogprobBackendRegistry:
    from xconf.ops.logprob.builtin import builtin_capabilities

    registry = LogprobBackendRegistry()
    for backend_id, factory, cap in builtin_capabilities():
        registry.register(backend_id, factory, cap, platform=cap.platform)
    return registry


_DEFAULT: list[LogprobBackendRegistry] = []


def default_logprob_registry() -> LogprobBackendRegistry:
    """The process-wide registry, holding xconf's own declared backends."""
    if not _DEFAULT:
        _DEFAULT.append(_builtin_registry())
    return _DEFAULT[0]


def register_logprob_backend(
    backend_id: str,
    factory: Factory,
    capability: BackendCapability,
    *,
    platform: str,
    replace: bool = False,
    registry: LogprobBackendRegistry | None = None,
) -> None:
    """Public registration seam (tests and third-party backends)."""
    target = default_logprob_registry() if registry is None else registry
    target.register(backend_id, factory, capability, platform=platform, replace=replace)


def select_logprob_backend(
    contract: LogprobContract,
    *,
    platform: str = "cpu",
    policy: str = "any",
    allow_fallback: bool = False,
    registry: LogprobBackendRegistry | None = None,
) -> DispatchResult:
    target = default_logprob_registry() if registry is None else registry
    return target.select(contract, platform=platform, policy=policy, allow_fallback=allow_fallback)
