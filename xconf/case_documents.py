"""What one scored attempt publishes: its five documents and three tensor files."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from xconf.comparison import ComparisonOutcome
from xconf.execution_plan import ExecutionCase
from xconf.experiment import Identity
from xconf.operators.catalog import SIDES, Side
from xconf.runtime.protocol import KnobApplication, RuntimeBinding, SideScore
from xconf.runtime.side_reuse import REUSED_FIELD, SideSource

TENSOR_SCHEMA = "xconf.tensors.v1"


@dataclass(frozen=True)
class SideOutcome:
    """What scoring one side gave: its scores, its knob records as read back after scoring,
    everything else the engine reported (``reported``) or derived, and where the check of the
    scored tokens came from. A later case of the run may take it whole (``side_reuse``)."""

    side: Side
    score: SideScore
    applications: tuple[KnobApplication, ...]
    reported: Mapping[str, Any]
    derived: Mapping[str, Any]
    tokens_checked_from: str


@dataclass(frozen=True)
class Actual:
    """actual.json: what happened when the case was scored (docs/artifacts.md).

    ``outcomes``: the sides scored (or taken from another attempt, ``reused_from``), in
    order; ``unreached``: the knob records of the sides the case never reached (it failed
    first); ``operator_provenance`` is None when scoring did not finish.
    """

    environment: Mapping[str, str]
    provenance: Mapping[str, Any]
    outcomes: tuple[SideOutcome, ...]
    unreached: Mapping[str, tuple[KnobApplication, ...]] = field(default_factory=dict)
    operator_provenance: tuple[Mapping[str, Any], ...] | None = None
    wall_s: float = 0.0
    damaged_attempts: tuple[Mapping[str, str], ...] = ()
    reused_from: Mapping[str, SideSource] = field(default_factory=dict)

    def applications(self) -> tuple[KnobApplication, ...]:
        """Both sides' knob records, as scored (or as requested, on a side never reached)."""
        by_side = {o.side: o.applications for o in self.outcomes}
        return tuple(a for side in SIDES for a in by_side.get(side, self.unreached.get(side, ())))

    def to_dict(self) -> dict[str, Any]:
        sides: dict[str, tuple[KnobApplication, ...]] = {
            o.side: o.applications for o in self.outcomes
        }
        sides.update({s: rows for s, rows in self.unreached.items() if s not in sides})
        document: dict[str, Any] = {
            "sides": {side: [a.to_dict() for a in rows] for side, rows in sides.items()},
            "environment": dict(self.environment),
            "provenance": dict(self.provenance),
            "wall_s": self.wall_s,
        }
        if self.outcomes:
            document["scored_tokens_checked_from"] = {
                o.side: o.tokens_checked_from for o in self.outcomes
            }
            document["readback"] = {o.side: dict(o.reported) for o in self.outcomes}
            document["derived"] = {o.side: dict(o.derived) for o in self.outcomes}
        if self.operator_provenance is not None:
            document["operator_provenance"] = [dict(p) for p in self.operator_provenance]
        if self.damaged_attempts:
            document["resume"] = {"damaged_attempts": [dict(d) for d in self.damaged_attempts]}
        if self.reused_from:
            document[REUSED_FIELD] = {s: src.to_dict() for s, src in self.reused_from.items()}
        return document


@dataclass(frozen=True)
class Requested:
    """requested.json: what the plan asks of the case, before any engine is built."""

    case_id: str
    knobs: Mapping[str, Any]
    changed: Mapping[str, Any]
    strict_execution: bool
    operators: Mapping[str, Mapping[str, Any]]

    @classmethod
    def of(cls, case: ExecutionCase, changed: Mapping[str, Any], strict: bool) -> Requested:
        operators: dict[str, Mapping[str, Any]] = {b.side: b.to_dict() for b in case.operators}
        return cls(case.case.case_id, case.case.knob_dict(), dict(changed), strict, operators)

    def to_dict(self) -> dict[str, Any]:
        return {
            "case_id": self.case_id,
            "knobs": dict(self.knobs),
            "changed": dict(self.changed),
            "strict_execution": self.strict_execution,
            "operators": {side: dict(b) for side, b in self.operators.items()},
        }


def static_documents(
    case: ExecutionCase,
    binding: RuntimeBinding,
    identity: Identity,
    changed: dict[str, Any],
    strict_execution: bool,
) -> dict[str, Any]:
    """requested/materialized/identity documents: what the plan and the adapter give before
    anything is scored (resume re-derives them to compare with a stored attempt)."""
    return {
        "requested.json": Requested.of(case, changed, strict_execution).to_dict(),
        # materialized.json is the binding's own record (runtime/protocol.py RuntimeBinding)
        "materialized.json": binding.to_dict(),
        "identity.json": {"sha256": identity.digest(), **identity.to_dict()},
    }


def case_documents(
    case: ExecutionCase,
    binding: RuntimeBinding,
    identity: Identity,
    changed: dict[str, Any],
    strict_execution: bool,
    actual: Actual,
    scores: Mapping[str, SideScore],
    outcome: ComparisonOutcome,
) -> tuple[dict[str, Any], dict[str, dict[str, torch.Tensor]]]:
    """requested/materialized/actual/identity/comparison documents and the score tensors
    (``scores``: every side's scores as its engine returned them, a refused side's too)."""
    documents = {
        **static_documents(case, binding, identity, changed, strict_execution),
        "actual.json": actual.to_dict(),
        "comparison.json": outcome.document,
    }
    tensors = {
        "score_rollout.safetensors": score_tensors(scores.get("rollout")),
        "score_training.safetensors": score_tensors(scores.get("training")),
        "token_diffs.safetensors": outcome.token_diffs,
    }
    return documents, tensors


def score_tensors(score: SideScore | None) -> dict[str, torch.Tensor]:
    if score is None:
        return {}
    return {
        # float64 scores stay float64 (they are judged in float64); the rest are float32.
        "logprobs": (
            score.logprobs if score.logprobs.dtype == torch.float64 else score.logprobs.float()
        ).contiguous(),
        "token_ids": score.scored_token_ids.to(torch.int64).contiguous(),
        "selected_token_ids": score.scored_selected_ids.to(torch.int64).contiguous(),
        "active_mask": score.scored_active_mask.to(torch.uint8).contiguous(),
    }
