"""What one operator backend declares it supports on one platform (part of its descriptor).

Torch-free: planning reads capabilities without importing any operator. The vocabularies
here (platforms, tiers, roles, dtypes, mask modes, determinism scopes) are the ones the
selected-logprob contract (``xconf.ops.logprob.contract``) is written in.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal, get_args

from xconf.errors import OperatorResolutionError
from xconf.knobs import DTYPES
from xconf.knobs import Dtype as LogitsDtype

DeterminismScope = Literal["fixed_topology", "cross_tp_bitwise"]
MaskMode = Literal["explicit_active_mask", "ignore_index"]
# runtime: the runtime's own path (never called with logits); smoke: testing-only backends.
Tier = Literal["reference", "production", "runtime", "smoke"]
Role = Literal["rollout", "training"]
Platform = Literal["cpu", "cuda", "rocm"]

DETERMINISM_SCOPES: tuple[DeterminismScope, ...] = get_args(DeterminismScope)
MASK_MODES: tuple[MaskMode, ...] = get_args(MaskMode)
TIERS: tuple[Tier, ...] = get_args(Tier)
ROLES: tuple[Role, ...] = get_args(Role)
PLATFORMS: tuple[Platform, ...] = get_args(Platform)
LOGITS_DTYPES: tuple[LogitsDtype, ...] = DTYPES


def _invalid(code: str, message: str, path: str) -> OperatorResolutionError:
    return OperatorResolutionError(f"operator.capability.{code}", message, path)


def check_platform(platform: object, path: str = "platform") -> Platform:
    if platform not in PLATFORMS:
        raise _invalid(
            "unknown_platform", f"platform must be one of {list(PLATFORMS)}, got {platform!r}", path
        )
    return platform  # type: ignore[return-value]


def _choices(values: object, allowed: tuple[str, ...], path: str) -> frozenset[Any]:
    if isinstance(values, str) or not isinstance(values, Iterable):
        raise _invalid(
            "not_iterable", f"{path} must be an iterable of values, got {values!r}", path
        )
    items = frozenset(values)
    bad = sorted(str(v) for v in items if v not in allowed)
    if bad:
        raise _invalid("invalid_value", f"{path} must hold values of {list(allowed)}: {bad}", path)
    return items


def _sizes(values: Iterable[int] | None, path: str) -> frozenset[int] | None:
    if values is None:
        return None
    if isinstance(values, str) or not isinstance(values, Iterable):
        raise _invalid("not_iterable", f"{path} must be an iterable of ints", path)
    sizes = frozenset(values)
    if any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in sizes):
        raise _invalid("invalid_value", f"{path} must hold ints >= 1", path)
    return sizes


@dataclass(frozen=True)
class BackendCapability:
    """A truthful declaration for one platform; ``tp_sizes``/``cp_sizes`` ``None``: any.

    ``tp_sizes`` and ``cp_sizes`` are the operator contract's sharding (how many vocab
    shards one call sees), not the engine's parallelism: runtimes call their operators
    with the full vocabulary row (a TP=1 contract) whatever the engine's TP degree.
    """

    platform: Platform
    tier: Tier
    roles: frozenset[Role] = frozenset(ROLES)
    dtypes: frozenset[LogitsDtype] = frozenset(LOGITS_DTYPES)
    mask_modes: frozenset[MaskMode] = frozenset({"explicit_active_mask"})
    determinism_scopes: frozenset[DeterminismScope] = frozenset({"fixed_topology"})
    supports_padding: bool = True
    tp_sizes: frozenset[int] | None = None
    cp_sizes: frozenset[int] | None = None

    def __post_init__(self) -> None:
        check_platform(self.platform, "capability.platform")
        if self.tier not in TIERS:
            raise _invalid(
                "invalid_value", f"tier must be one of {list(TIERS)}, got {self.tier!r}", "tier"
            )
        sets = (
            ("roles", ROLES),
            ("dtypes", LOGITS_DTYPES),
            ("mask_modes", MASK_MODES),
            ("determinism_scopes", DETERMINISM_SCOPES),
        )
        for name, allowed in sets:
            value = _choices(getattr(self, name), allowed, f"capability.{name}")
            object.__setattr__(self, name, value)
        object.__setattr__(self, "tp_sizes", _sizes(self.tp_sizes, "capability.tp_sizes"))
        object.__setattr__(self, "cp_sizes", _sizes(self.cp_sizes, "capability.cp_sizes"))

    def reasons_against(self, contract: Any) -> tuple[str, ...]:
        """Every reason this capability cannot serve ``contract`` (a ``LogprobContract``)."""
        reasons: list[str] = []
        sharding = contract.sharding
        if contract.role not in self.roles:
            reasons.append(f"role '{contract.role}' not declared")
        if contract.logits_dtype not in self.dtypes:
            reasons.append(f"logits dtype '{contract.logits_dtype}' not declared")
        if self.tp_sizes is not None and sharding.tp_world_size not in self.tp_sizes:
            reasons.append(f"TP size {sharding.tp_world_size} not in {sorted(self.tp_sizes)}")
        if self.cp_sizes is not None and sharding.cp_world_size not in self.cp_sizes:
            reasons.append(f"CP size {sharding.cp_world_size} not in {sorted(self.cp_sizes)}")
        if sharding.has_padding and not self.supports_padding:
            reasons.append("padded vocabulary not supported")
        if contract.mask.mode not in self.mask_modes:
            reasons.append(
                f"mask mode '{contract.mask.mode}' not supported"
                + (
                    " (ignore_index cannot express inactive targets that hold a real token)"
                    if contract.mask.mode == "explicit_active_mask"
                    else ""
                )
            )
        scope = contract.reduction.determinism_scope
        if scope not in self.determinism_scopes:
            reasons.append(f"determinism scope '{scope}' not guaranteed")
        return tuple(reasons)

    def to_dict(self) -> dict[str, Any]:
        return {
            "platform": self.platform,
            "tier": self.tier,
            "roles": sorted(self.roles),
            "dtypes": sorted(self.dtypes),
            "mask_modes": sorted(self.mask_modes),
            "determinism_scopes": sorted(self.determinism_scopes),
            "supports_padding": self.supports_padding,
            "tp_sizes": None if self.tp_sizes is None else sorted(self.tp_sizes),
            "cp_sizes": None if self.cp_sizes is None else sorted(self.cp_sizes),
        }
