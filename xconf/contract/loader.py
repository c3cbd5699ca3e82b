"""The numerical contract: the only source of the pass/fail threshold."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from types import MappingProxyType
from typing import Any

from xconf.canonical import canonical_digest
from xconf.errors import XconfError

CONTRACT_RESOURCE = "numerical_contract.json"


@dataclass(frozen=True)
class ResolvedThreshold:
    """The threshold one comparison uses, and why."""

    value: float
    dtype: str
    rule: str


@dataclass(frozen=True)
class NumericalContract:
    version: str
    sha256: str
    thresholds: Mapping[str, float]
    mixed_dtype_rule: str
    precision_order: tuple[str, ...]  # most precise first

    def threshold_for(self, rollout_dtype: str, training_dtype: str) -> ResolvedThreshold:
        """Same dtype: its threshold. Mixed: the less precise dtype's, per the contract."""
        for dtype, side in ((rollout_dtype, "rollout"), (training_dtype, "training")):
            if dtype not in self.thresholds:
                raise XconfError(
                    "contract.unknown_dtype",
                    f"the numerical contract has no threshold for dtype '{dtype}'",
                    f"{side}.dtype",
                )
        if rollout_dtype == training_dtype:
            return ResolvedThreshold(self.thresholds[rollout_dtype], rollout_dtype, "same_dtype")
        less_precise = max(rollout_dtype, training_dtype, key=self.precision_order.index)
        return ResolvedThreshold(self.thresholds[less_precise], less_precise, self.mixed_dtype_rule)

    def identity(self) -> dict[str, str]:
        return {"version": self.version, "sha256": self.sha256}


def parse_contract(document: Mapping[str, Any]) -> NumericalContract:
    try:
        section = document["selected_logprob"]
        thresholds = {str(k): float(v) for k, v in section["absolute_threshold"].items()}
        rule = section["mixed_dtype_rule"]
        order = tuple(str(d) for d in rule["precision_order"])
        version = str(document["version"])
        rule_id = str(rule["id"])
    except (KeyError, TypeError, ValueError) as exc:
        raise XconfError("contract.malformed", f"numerical contract is malformed: {exc}") from exc
    if set(order) != set(thresholds):
        raise XconfError(
            "contract.malformed", "precision_order must list exactly the dtypes with thresholds"
        )
    return NumericalContract(
        version=version,
        sha256=canonical_digest(document),
        thresholds=MappingProxyType(thresholds),
        mixed_dtype_rule=rule_id,
        precision_order=order,
    )


@cache
def load_contract() -> NumericalContract:
    """The contract shipped inside the package; nothing else can supply a threshold."""
    text = resources.files("xconf.contract").joinpath(CONTRACT_RESOURCE).read_text("utf-8")
    return parse_contract(json.loads(text))
