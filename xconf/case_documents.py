"""What one scored attempt publishes: its five documents and three tensor files."""

from __future__ import annotations

from typing import Any

import torch

from xconf.comparison import ComparisonOutcome
from xconf.execution_plan import ExecutionCase
from xconf.experiment import Identity
from xconf.runtime.protocol import RuntimeBinding, SideScore

TENSOR_SCHEMA = "xconf.tensors.v1"


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
        "requested.json": {
            "case_id": case.case.case_id,
            "knobs": case.case.knob_dict(),
            "changed": changed,
            "strict_execution": strict_execution,
            "operators": {b.side: b.to_dict() for b in case.operators},
        },
        "materialized.json": binding.to_dict(),
        "identity.json": {"sha256": identity.digest(), **identity.to_dict()},
    }


def case_documents(
    case: ExecutionCase,
    binding: RuntimeBinding,
    identity: Identity,
    changed: dict[str, Any],
    strict_execution: bool,
    actual: dict[str, Any],
    scores: dict[str, SideScore],
    outcome: ComparisonOutcome,
) -> tuple[dict[str, Any], dict[str, dict[str, torch.Tensor]]]:
    """requested/materialized/actual/identity/comparison documents and the score tensors."""
    documents = {
        **static_documents(case, binding, identity, changed, strict_execution),
        "actual.json": actual,
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
