"""What a selected-logprob backend declares it supports, on one platform."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from xconf.ops.logprob.contract import (
    DETERMINISM_SCOPES,
    LOGITS_DTYPES,
    MASK_MODES,
    PLATFORMS,
    ROLES,
    TIERS,
    DeterminismScope,
    LogitsDtype,
    LogprobContract,
    MaskMode,
    Platform,
    Role,
    Tier,
    check_choice,
    check_choices,
    normalize_logprob_backend_id,
)
from xconf.ops.logprob.errors import LogprobContractError


def _sizes(values: Iterable[int] | None, what: str) -> frozenset[int] | None:
    if values is None:
        return None
    if isinstance(values, str) or not isinstance(values, Iterable):
        raise LogprobContractError(
            "logprob.contract.not_iterable", f"{what} must be an iterable of ints", what
        )
    sizes = frozenset(values)
    if any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in sizes):
        raise LogprobContractError(
            "logprob.contract.invalid_value", f"{what} must hold ints >= 1", what
        )
    return sizes


@dataclass(frozen=True)
class BackendCapability:
    """A truthful declaration; ``tp_sizes``/``cp_sizes`` of ``None`` mean any size."""

    backend_id: str
    platform: Platform
    tier: Tier
    roles: frozenset[Role]
    dtypes: frozenset[LogitsDtype]
    mask_modes: frozenset[MaskMode]
    determinism_scopes: frozenset[DeterminismScope]
    supports_padding: bool = True
    tp_sizes: frozenset[int] | None = None
    cp_sizes: frozenset[int] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "backend_id", normalize_logprob_backend_id(self.backend_id))
        check_choice(self.platform, PLATFORMS, "platform", "capability.platform")
        check_choice(self.tier, TIERS, "tier", "capability.tier")
        sets = (
            ("roles", ROLES),
            ("dtypes", LOGITS_DTYPES),
            ("mask_modes", MASK_MODES),
            ("determinism_scopes", DETERMINISM_SCOPES),
        )
        for name, allowed in sets:
            value = check_choices(getattr(self, name), allowed, name, f"capability.{name}")
            object.__setattr__(self, name, value)
        object.__setattr__(self, "tp_sizes", _sizes(self.tp_sizes, "capability.tp_sizes"))
        object.__setattr__(self, "cp_sizes", _sizes(self.cp_sizes, "capability.cp_sizes"))

    def reasons_against(self, contract: LogprobContract) -> tuple[str, ...]:
        """Every reason this capability cannot serve ``contract``; empty when it can."""
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
            "backend_id": self.backend_id,
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
