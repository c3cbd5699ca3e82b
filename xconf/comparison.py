"""Identity validation and the one fixed-threshold verdict, with diagnostics that never vote."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch

from xconf.contract.loader import NumericalContract, ResolvedThreshold
from xconf.rollout_correction import rollout_correction
from xconf.runtime.protocol import FrozenInputs, SideScore

Result = Literal[
    "pass", "fail", "zero_active_tokens", "invalid_artifact", "invalid_identity", "error"
]
COMPARISON_SCHEMA = "xconf.comparison.v1"
PERCENTILES = {"p50": 0.5, "p90": 0.9, "p99": 0.99}


@dataclass(frozen=True)
class ComparisonOutcome:
    """The verdict document and the token-level tensors that let anyone recompute it."""

    document: dict[str, Any]
    token_diffs: dict[str, torch.Tensor]

    @property
    def result(self) -> Result:
        return self.document["result"]  # type: ignore[no-any-return]


def identity_violations(
    inputs: FrozenInputs, identity_digest: str, rollout: SideScore, training: SideScore
) -> list[str]:
    """Both sides must have scored exactly the frozen input, read-only."""
    violations = []
    for name, score in (("rollout", rollout), ("training", training)):
        if score.identity_digest != identity_digest:
            violations.append(
                f"{name} scored identity {score.identity_digest[:12]}, "
                f"expected {identity_digest[:12]}"
            )
        for field, echoed, frozen in (
            ("token_ids", score.scored_token_ids, inputs.token_ids),
            ("selected_token_ids", score.scored_selected_ids, inputs.selected_token_ids),
            ("active_mask", score.scored_active_mask, inputs.active_mask),
        ):
            if echoed.shape != frozen.shape or not torch.equal(echoed.to(frozen.dtype), frozen):
                violations.append(f"{name} scored different {field}")
        evidence = score.evidence
        if evidence.state_digest_before != evidence.state_digest_after:
            violations.append(f"{name} scorer changed its parameters or buffers")
        if not evidence.mode_restored:
            violations.append(f"{name} scorer left the module in a different mode")
        if evidence.generated_tokens:
            violations.append(f"{name} scorer generated tokens instead of scoring frozen ones")
        if name == "training" and evidence.used_kv_cache:
            violations.append("training scorer used a KV cache")
    return violations


def _base_document(threshold: ResolvedThreshold, contract: NumericalContract) -> dict[str, Any]:
    return {
        "schema": COMPARISON_SCHEMA,
        "result": "error",
        "reason": None,
        "error": None,
        "threshold": threshold.value,
        "threshold_dtype": threshold.dtype,
        "threshold_rule": threshold.rule,
        "contract": contract.identity(),
        "active_tokens": 0,
        "mismatches": 0,
        "mismatch_ratio": 0.0,
        "diff": None,
        "approx_kl": None,
        "worst_token": None,
        "drift_profile": [],
        "identity": {"valid": True, "violations": []},
    }


def _diagnostics(
    diff: torch.Tensor,
    rollout: torch.Tensor,
    training: torch.Tensor,
    active: torch.Tensor,
    inputs: FrozenInputs,
) -> dict[str, Any]:
    values = diff[active].double()
    delta = (training - rollout)[active].double()
    worst_flat = int(torch.argmax(torch.where(active, diff, torch.full_like(diff, -1.0))))
    b, t = divmod(worst_flat, diff.shape[1])
    profile = []
    for position in range(diff.shape[1]):
        column = active[:, position]
        if bool(column.any()):
            d = diff[:, position][column].double()
            profile.append(
                {
                    "position": position,
                    "active": int(column.sum()),
                    "mean_abs_diff": float(d.mean()),
                    "max_abs_diff": float(d.max()),
                }
            )
    return {
        "diff": {
            "mean": float(values.mean()),
            **{k: float(torch.quantile(values, q)) for k, q in PERCENTILES.items()},
            "max": float(values.max()),
        },
        # Approximate KL(rollout || training) per token: mean of exp(d) - d - 1, d = train - roll.
        "approx_kl": float((torch.exp(delta) - delta - 1.0).mean()),
        "worst_token": {
            "batch": b,
            "position": t,
            "token_id": int(inputs.selected_token_ids[b, t]),
            "rollout_logprob": float(rollout[b, t]),
            "training_logprob": float(training[b, t]),
        },
        "drift_profile": profile,
    }


def compare(
    inputs: FrozenInputs,
    identity_digest: str,
    rollout: SideScore,
    training: SideScore,
    threshold: ResolvedThreshold,
    contract: NumericalContract,
) -> ComparisonOutcome:
    """Judge every active token by ``abs(training - rollout) > threshold``; nothing else votes."""
    doc = _base_document(threshold, contract)
    active = inputs.active_mask.bool()
    violations = identity_violations(inputs, identity_digest, rollout, training)
    if violations:
        doc.update(
            result="invalid_identity",
            reason=violations[0],
            identity={"valid": False, "violations": violations},
        )
        return ComparisonOutcome(doc, {})
    for name, score in (("rollout", rollout), ("training", training)):
        lp = score.logprobs
        if lp.shape != active.shape:
            doc.update(
                result="invalid_artifact",
                reason=f"{name} logprobs have shape {tuple(lp.shape)}, "
                f"expected {tuple(active.shape)}",
            )
            return ComparisonOutcome(doc, {})
        if not lp.is_floating_point():
            doc.update(result="invalid_artifact", reason=f"{name} logprobs are {lp.dtype}")
            return ComparisonOutcome(doc, {})
        if not bool(torch.isfinite(lp[active]).all()):
            doc.update(result="invalid_artifact", reason=f"{name} has non-finite active scores")
            return ComparisonOutcome(doc, {})
    if rollout.logprobs.dtype != training.logprobs.dtype:
        doc.update(result="invalid_artifact", reason="the two sides report different dtypes")
        return ComparisonOutcome(doc, {})
    roll = rollout.logprobs.float()
    train = training.logprobs.float()
    zeros = torch.zeros_like(roll)
    diff = torch.where(active, torch.abs(train - roll), zeros)
    mismatch = active & (torch.abs(train - roll) > threshold.value)
    active_count = int(active.sum())
    token_diffs = {
        "rollout_logprobs": torch.where(active, roll, zeros).contiguous(),
        "training_logprobs": torch.where(active, train, zeros).contiguous(),
        "active_mask": active.to(torch.uint8).contiguous(),
        "abs_diff": diff.contiguous(),
        "mismatch_mask": mismatch.to(torch.uint8).contiguous(),
        # The verdict compares float32 differences with the threshold rounded to float32;
        # storing it so lets any offline recompute (torch or numpy) reproduce it bit for bit.
        "threshold": torch.tensor(threshold.value, dtype=torch.float32),
    }
    if active_count == 0:
        doc.update(result="zero_active_tokens", reason="no active token to judge")
        return ComparisonOutcome(doc, token_diffs)
    mismatches = int(mismatch.sum())
    doc.update(
        result="fail" if mismatches else "pass",
        active_tokens=active_count,
        mismatches=mismatches,
        mismatch_ratio=mismatches / active_count,
        **_diagnostics(diff, roll, train, active, inputs),
    )
    # verl's rollout-correction figures (never vote): xconf/rollout_correction.py
    doc["rollout_correction"] = rollout_correction(roll, train, active)
    return ComparisonOutcome(doc, token_diffs)


def verdict_threshold(value: float) -> float:
    """A contract threshold as the verdict applies it: rounded to float32, like the scores."""
    return float(torch.tensor(value, dtype=torch.float32))


def error_outcome(
    threshold: ResolvedThreshold, contract: NumericalContract, error: dict[str, Any]
) -> ComparisonOutcome:
    """No comparison was possible: the runtime raised or strict execution refused the case."""
    document = _base_document(threshold, contract)
    document.update(result="error", reason=error["message"], error=error)
    return ComparisonOutcome(document, {})


def recompute_result(token_diffs: dict[str, torch.Tensor]) -> tuple[Result, int]:
    """Offline re-judgement from stored tensors and the stored threshold alone."""
    active = token_diffs["active_mask"].bool()
    threshold = token_diffs["threshold"].to(torch.float32)
    diff = torch.abs(token_diffs["training_logprobs"] - token_diffs["rollout_logprobs"])
    mismatches = int((active & (diff.float() > threshold)).sum())
    if int(active.sum()) == 0:
        return "zero_active_tokens", 0
    return ("fail" if mismatches else "pass"), mismatches
