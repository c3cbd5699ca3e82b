"""Semantic operator catalog: immutable descriptors and per-case resolution sessions.

Operators plug in as :class:`OperatorDescriptor` records published through the
``xconf.operators`` entry-point group (each entry point names a zero-argument callable
returning an iterable of descriptors). The core never imports an operator module: the
descriptor's ``factory`` is a ``"module:attr"`` import string resolved lazily.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from types import MappingProxyType
from typing import Any, Literal

from xconf.canonical import canonical_digest
from xconf.errors import OperatorResolutionError
from xconf.knobs import normalize_backend_id
from xconf.operators.capability import ROLES, BackendCapability, Role

Side = Role
SIDES: tuple[Side, ...] = ROLES
OPERATOR_ENTRY_POINT_GROUP = "xconf.operators"
SELECTED_LOGPROB = "selected_logprob"
SMOKE_ONLY_PREFIX = "smoke_only."  # smoke-only backends are named so (see SMOKE_OPERATORS.md)


@dataclass(frozen=True)
class OperatorDescriptor:
    """Immutable declaration of one backend of one semantic operation.

    ``capabilities`` (one :class:`BackendCapability` per platform) is the only place a
    backend's devices, sides (roles), dtypes and contract support are declared: planning
    checks the side/device/dtype part, runs check each call's contract against it.
    ``required_topology`` maps a target side to the knob values that side must have
    (for example: on the training side, ``training.sharding`` must be ``unsharded``).
    ``factory`` is a ``"module:callable"`` string; the callable takes the options
    mapping as keyword arguments and returns the operator implementation.
    """

    semantic_operation: str
    backend_id: str
    factory: str
    version: str
    capabilities: tuple[BackendCapability, ...]
    required_topology: Mapping[Side, Mapping[str, Any]] = field(
        default_factory=lambda: MappingProxyType({})
    )
    alignment_properties: frozenset[str] = frozenset()
    lifecycle: str = "engine_construction"
    build_fingerprint: str = ""
    fallback_policy: Literal["never"] = "never"
    is_smoke_only: bool = False
    runtime_native: bool = False  # True: the runtime computes it on its own path
    factory_takes_side: bool = False  # True: the factory gets side= (rollout or training)

    def __post_init__(self) -> None:
        object.__setattr__(self, "backend_id", normalize_backend_id(self.backend_id))
        capabilities = tuple(self.capabilities)
        platforms = [c.platform for c in capabilities]
        if not capabilities or len(set(platforms)) != len(platforms):
            raise OperatorResolutionError(
                "operator.capability.declaration",
                f"backend '{self.backend_id}' must declare one capability per platform, "
                f"got platforms {platforms}",
                f"operators.{self.semantic_operation}.{self.backend_id}",
            )
        object.__setattr__(self, "capabilities", capabilities)
        frozen = {k: MappingProxyType(dict(v)) for k, v in self.required_topology.items()}
        object.__setattr__(self, "required_topology", MappingProxyType(frozen))

    @property
    def devices(self) -> frozenset[str]:
        return frozenset(c.platform for c in self.capabilities)

    def capability(self, platform: str) -> BackendCapability | None:
        """The capability declared on ``platform``; ``None``: undeclared there."""
        return next((c for c in self.capabilities if c.platform == platform), None)

    def fingerprint(self) -> str:
        """Digest of everything that defines this backend's behaviour (not what it declares
        to support: a capability fix does not invalidate stored attempts)."""
        record = {
            "semantic_operation": self.semantic_operation,
            "backend_id": self.backend_id,
            "factory": self.factory,
            "version": self.version,
            "build_fingerprint": self.build_fingerprint,
            "alignment_properties": sorted(self.alignment_properties),
            "is_smoke_only": self.is_smoke_only,
            "factory_takes_side": self.factory_takes_side,
        }
        return canonical_digest(record)


class SemanticOperatorCatalog:
    """Holds descriptors by (semantic operation, backend id); never resolves by priority."""

    def __init__(self, descriptors: Iterable[OperatorDescriptor] = ()) -> None:
        self._descriptors: dict[tuple[str, str], OperatorDescriptor] = {}
        for descriptor in descriptors:
            self.register(descriptor)

    @classmethod
    def from_entry_points(cls) -> SemanticOperatorCatalog:
        """The default catalog: every descriptor published under ``xconf.operators``."""
        catalog = cls()
        for ep in sorted(entry_points(group=OPERATOR_ENTRY_POINT_GROUP), key=lambda e: e.name):
            provider: Callable[[], Iterable[OperatorDescriptor]] = ep.load()
            for descriptor in provider():
                catalog.register(descriptor)
        return catalog

    def register(self, descriptor: OperatorDescriptor, *, replace: bool = False) -> None:
        key = (descriptor.semantic_operation, descriptor.backend_id)
        if key in self._descriptors and not replace:
            raise OperatorResolutionError(
                "operator.duplicate_registration",
                f"backend '{descriptor.backend_id}' is already registered",
                path=f"operators.{descriptor.semantic_operation}",
            )
        self._descriptors[key] = descriptor

    def get(self, semantic_operation: str, backend_id: str) -> OperatorDescriptor | None:
        return self._descriptors.get((semantic_operation, normalize_backend_id(backend_id)))

    def backend_ids(self, semantic_operation: str) -> tuple[str, ...]:
        return tuple(sorted(b for op, b in self._descriptors if op == semantic_operation))

    def registered(self, semantic_operation: str) -> tuple[OperatorDescriptor, ...]:
        """One operation's descriptors in registration order (dispatch's tie-break)."""
        return tuple(d for (op, _), d in self._descriptors.items() if op == semantic_operation)

    def descriptors(self) -> tuple[OperatorDescriptor, ...]:
        return tuple(self._descriptors[k] for k in sorted(self._descriptors))


@dataclass(frozen=True)
class OperatorBinding:
    """The backend bound to one side of one case: part of the execution identity."""

    semantic_operation: str
    side: Side
    backend_id: str
    options: tuple[tuple[str, Any], ...]
    descriptor_fingerprint: str
    is_smoke_only: bool
    runtime_native: bool

    def to_dict(self) -> dict[str, Any]:
        return {
            "semantic_operation": self.semantic_operation,
            "side": self.side,
            "backend_id": self.backend_id,
            "options": dict(self.options),
            "descriptor_fingerprint": self.descriptor_fingerprint,
            "is_smoke_only": self.is_smoke_only,
            "runtime_native": self.runtime_native,
        }


@dataclass(frozen=True)
class ResolutionPolicy:
    """Execution policy from the command line, never from a config file."""

    allow_smoke_operators: bool = False
    device: str = "cpu"


def check_descriptor(
    descriptor: OperatorDescriptor | None,
    *,
    side: Side,
    backend_id: str,
    dtype: str,
    knobs: Mapping[str, Any],
    policy: ResolutionPolicy,
    path: str,
) -> OperatorDescriptor:
    """Strictly check that ``descriptor`` serves ``side`` here; raise with every reason."""
    if descriptor is None:
        if normalize_backend_id(backend_id).startswith(SMOKE_ONLY_PREFIX):
            raise OperatorResolutionError(
                "operator.smoke_not_authorized",
                f"smoke-only backend '{backend_id}' is not registered: the command line registers "
                "smoke backends only with --allow-smoke-operators / allow_smoke_operators=true",
                path,
            )
        raise OperatorResolutionError(
            "operator.unknown_backend", f"no registered backend '{backend_id}'", path
        )
    reasons: list[str] = []
    capability = descriptor.capability(policy.device)
    if capability is None:
        reasons.append(f"does not run on device '{policy.device}'")
    else:
        if side not in capability.roles:
            reasons.append(f"does not serve the {side} side")
        if dtype not in capability.dtypes:
            reasons.append(f"does not support dtype '{dtype}'")
    for knob, required in descriptor.required_topology.get(side, {}).items():
        if knobs.get(knob) != required:
            reasons.append(f"requires {knob}={required!r}, case has {knobs.get(knob)!r}")
    if descriptor.is_smoke_only and not policy.allow_smoke_operators:
        reasons.append("is smoke-only and the command line did not authorize smoke operators")
    if reasons:
        raise OperatorResolutionError(
            "operator.incompatible_backend",
            f"backend '{descriptor.backend_id}' rejected: " + "; ".join(reasons),
            path,
        )
    return descriptor


def load_object(import_path: str) -> Any:
    """Resolve ``"package.module:attr"`` (or ``package.module.attr``) to an object."""
    from hydra.utils import get_object

    return get_object(import_path.replace(":", "."))
