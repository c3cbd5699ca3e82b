"""Identity validation and the one fixed-threshold verdict, with diagnostics that never vote."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import torch

from xconf.contract.loader import NumericalContract, ResolvedThreshold
from xconf.full_vocab import full_vocab_figures, unavailable
from xconf.rollout_correction import Correction, rollout_correction
from xconf.rollout_correction.offpolicy import Selection
from xconf.runtime.protocol import FrozenInputs, SideScore

Result = Literal[
    "pass", "fail", "zero_active_tokens", "invalid_artifact", "invalid_identity", "error"
]
COMPARISON_SCHEMA = "xconf.comparison.v1"
PERCENTILES = {"p50": 0.5, "p90": 0.9, "p99": 0.99}


@dataclass(frozen=True)
class Intervention:
    """comparison.json ``intervention``: what the case declared it changes, and the knobs
    that kept it from being that one-knob case (a declared knob not run as set, another knob
    not run as set). Neither list is ever evidence of a knob's effect."""

    declared: tuple[str, ...]
    not_applied: tuple[Mapping[str, Any], ...] = ()
    confounded: tuple[Mapping[str, Any], ...] = ()

    @property
    def applied(self) -> bool:
        return not self.not_applied and not self.confounded

    def to_dict(self) -> dict[str, Any]:
        return {
            "declared": list(self.declared),
            "applied": self.applied,
            "not_applied": [dict(r) for r in self.not_applied],
            "confounded": [dict(r) for r in self.confounded],
        }


@dataclass(frozen=True)
class ComparisonOutcome:
    """The verdict document and the token-level tensors that let anyone recompute it (as a
    case publishes it: ``case_documents.Comparison``)."""

    document: dict[str, Any]
    token_diffs: dict[str, torch.Tensor]

    @property
    def result(self) -> Result:
        return self.document["result"]  # type: ignore[no-any-return]


def identity_violations(
    inputs: FrozenInputs,
    identity_digest: str,
    rollout: SideScore,
    training: SideScore,
    training_kv_cache_allowed: bool = False,
) -> list[str]:
    """Both sides must have scored exactly the frozen input, read-only; the training side
    without a KV cache unless the identity allows one."""
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
        if name == "training" and evidence.used_kv_cache and not training_kv_cache_allowed:
            violations.append(
                "training scorer used a KV cache, which the identity forbids "
                "(cache_metadata.training_kv_cache is not 'allowed')"
            )
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


def quantiles(
    values: torch.Tensor, qs: dict[str, float], dtype: torch.dtype = torch.float64
) -> dict[str, float]:
    """``torch.quantile`` (linear interpolation) of a 1-D tensor, bit for bit, for any size.

    ``torch.quantile`` refuses more than 2**24 elements and sorts everything; a verl batch has
    more. The order statistics it interpolates are selected with one ``numpy.partition``
    (no full sort), then interpolated exactly as torch does on ``values.to(dtype)``
    (``rank = q * (n - 1)``, lerp): widening is exact and keeps the order, so the selection
    runs on the narrower values.
    """
    import numpy as np

    n = values.numel()
    ranks = {k: torch.tensor(q, dtype=dtype) * (n - 1) for k, q in qs.items()}
    picks = sorted(
        {int(r.floor()) for r in ranks.values()} | {int(r.ceil()) for r in ranks.values()}
    )
    chosen = np.partition(values.numpy(), picks)
    out = {}
    for k, rank in ranks.items():
        below, above = int(rank.floor()), int(rank.ceil())
        low = torch.tensor(float(chosen[below]), dtype=dtype)
        high = torch.tensor(float(chosen[above]), dtype=dtype)
        out[k] = float(torch.lerp(low, high, rank - below))
    return out


def _drift_profile(diff: torch.Tensor, active: torch.Tensor) -> list[dict[str, Any]]:
    """Per position: active count, mean and max |diff| (inactive diffs are 0 by construction)."""
    counts = active.sum(0)
    sums = diff.double().sum(0)
    peaks = diff.max(0).values.double()  # the max widened is the max of the widened values
    return [
        {
            "position": position,
            "active": int(counts[position]),
            "mean_abs_diff": float(sums[position] / counts[position]),
            "max_abs_diff": float(peaks[position]),
        }
        for position in torch.nonzero(counts).flatten().tolist()
    ]


def _diagnostics(
    diff: torch.Tensor,
    rollout: torch.Tensor,
    training: torch.Tensor,
    active: torch.Tensor,
    inputs: FrozenInputs,
) -> dict[str, Any]:
    # One figure at a time, temporaries freed and terms taken in place: at verl's batch sizes
    # every [B, T] copy counts. The same operations on the same values: the same bits.
    select = Selection.of(active)  # diff[active], as one parallel gather
    selected = select(diff)
    values = selected.double()
    mean, top = float(values.mean()), float(values.max())
    del values
    diff_figures = {"mean": mean, **quantiles(selected, PERCENTILES), "max": top}
    del selected
    delta = select(training - rollout).double()
    del select
    # Approximate KL(rollout || training) per token: mean of exp(d) - d - 1, d = train - roll.
    approx_kl = float(torch.exp(delta).sub_(delta).sub_(1.0).mean())
    del delta
    worst_flat = int(torch.argmax(diff.masked_fill(~active, -1.0)))
    b, t = divmod(worst_flat, diff.shape[1])
    return {
        "diff": diff_figures,
        "approx_kl": approx_kl,
        "worst_token": {
            "batch": b,
            "position": t,
            "token_id": int(inputs.selected_token_ids[b, t]),
            "rollout_logprob": float(rollout[b, t]),
            "training_logprob": float(training[b, t]),
        },
        "drift_profile": _drift_profile(diff, active),
    }


def compare(
    inputs: FrozenInputs,
    identity_digest: str,
    rollout: SideScore,
    training: SideScore,
    threshold: ResolvedThreshold,
    contract: NumericalContract,
    *,
    correction: Correction | None = None,
    training_kv_cache_allowed: bool = False,
    owned: bool = False,
) -> ComparisonOutcome:
    """Judge every active token by ``abs(training - rollout) > threshold``; nothing else votes.

    ``owned``: the two sides' logprobs are the caller's to give away (read from a file for
    this call): the stored token diffs reuse their memory, zeroed where inactive, instead of
    a copy of each (``xconf judge`` at verl's batch sizes)."""
    doc = _base_document(threshold, contract)
    active = inputs.active_mask.bool()
    violations = identity_violations(
        inputs, identity_digest, rollout, training, training_kv_cache_allowed
    )
    if violations:
        doc.update(
            result="invalid_identity",
            reason=violations[0],
            identity={"valid": False, "violations": violations},
        )
        return ComparisonOutcome(doc, {})
    select = Selection.of(active)  # lp[active], as one parallel gather
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
        scores = select(lp)
        if not bool(torch.isfinite(scores).all()):
            doc.update(result="invalid_artifact", reason=f"{name} has non-finite active scores")
            return ComparisonOutcome(doc, {})
        # A log-probability is at most 0; above 0 by more than the contract's rounding
        # threshold it is not a log-probability at all (p > 1), whatever the other side says.
        top = float(scores.max()) if scores.numel() else 0.0
        if top > threshold.value:
            doc.update(
                result="invalid_artifact",
                reason=f"{name} has active log-probabilities above 0 (max {top:+.6g} > "
                f"{threshold.value:g}): p > 1 is not a probability",
            )
            return ComparisonOutcome(doc, {})
    del select, scores
    if rollout.logprobs.dtype != training.logprobs.dtype:
        doc.update(result="invalid_artifact", reason="the two sides report different dtypes")
        return ComparisonOutcome(doc, {})
    # float64 scores are judged in float64; every other float dtype in float32 (exactly).
    dtype = torch.float64 if rollout.logprobs.dtype == torch.float64 else torch.float32
    roll = rollout.logprobs.to(dtype)
    train = training.logprobs.to(dtype)
    # [B, T] temporaries: at verl scale every one of them counts, so they are taken in place
    # (and counts by count_nonzero: a bool sum first copies the mask to int64)
    active = active.contiguous()
    active_count = int(torch.count_nonzero(active))
    # verl's rollout-correction figures (never vote: xconf/rollout_correction) first, on the
    # scores as given, while nothing else of this verdict is held beside their temporaries.
    figures: dict[str, Any] | Exception | None = None
    if active_count:
        try:
            figures = rollout_correction(roll, train, active, correction=correction)
        except Exception as exc:  # raised in its place below: the diagnostics' error
            figures = exc
    inactive = ~active
    gap = (train - roll).abs_()
    mismatch = torch.gt(gap, threshold.value).logical_and_(active)  # active & (gap > t)
    diff = gap.masked_fill_(inactive, 0.0)  # where(active, gap, 0), in place
    # Every figure below reads the active tokens only, so the stored sides (0 where
    # inactive) may be the scores themselves, zeroed in place, wherever the scores are this
    # call's to change: ``owned``, or converted to the verdict dtype above.
    stored = [
        t.masked_fill_(inactive, 0.0)
        if owned or t is not given
        else torch.where(active, t, 0.0).contiguous()
        for t, given in ((roll, rollout.logprobs), (train, training.logprobs))
    ]
    del inactive
    token_diffs = {
        "rollout_logprobs": stored[0].contiguous(),
        "training_logprobs": stored[1].contiguous(),
        # 0/1 bytes: a bool tensor's own memory read as uint8 (the mask: when owned)
        "active_mask": active.view(torch.uint8) if owned else active.to(torch.uint8),
        "abs_diff": diff.contiguous(),
        "mismatch_mask": mismatch.view(torch.uint8),
        # The verdict compares differences in the scores' dtype with the threshold rounded to
        # it; storing it so lets any offline recompute (torch or numpy) reproduce it bit for bit.
        "threshold": torch.tensor(threshold.value, dtype=dtype),
    }
    if active_count == 0:
        doc.update(result="zero_active_tokens", reason="no active token to judge")
        return ComparisonOutcome(doc, token_diffs)
    mismatches = int(torch.count_nonzero(mismatch))
    doc.update(
        result="fail" if mismatches else "pass",
        active_tokens=active_count,
        mismatches=mismatches,
        mismatch_ratio=mismatches / active_count,
    )
    try:
        diagnostics = _diagnostics(diff, roll, train, active, inputs)
        if isinstance(figures, Exception):
            raise figures
        diagnostics["rollout_correction"] = figures
    except Exception as exc:  # diagnostics never vote, so they can never crash a verdict
        diagnostics = {"diagnostics_error": f"{type(exc).__name__}: {exc}"}
    try:  # figures of the whole distributions; they never vote either
        diagnostics["full_vocab"] = full_vocab_figures(
            rollout.vocab_rows, training.vocab_rows, active
        )
    except Exception as exc:
        diagnostics["full_vocab"] = unavailable(f"{type(exc).__name__}: {exc}")
    doc.update(diagnostics)
    return ComparisonOutcome(finite_document(doc), token_diffs)


def finite_document(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` with every non-finite float replaced by None, each listed in ``non_finite``.

    A finite extreme score (-1e4, float32 min) makes diagnostics such as the approximate KL
    overflow; JSON cannot hold inf or NaN, so the value becomes null and the flag names it.
    """
    flags: list[str] = []

    def clean(value: Any, where: str) -> Any:
        if isinstance(value, float) and not math.isfinite(value):
            flags.append(where)
            return None
        if isinstance(value, dict):
            return {k: clean(v, f"{where}.{k}" if where else str(k)) for k, v in value.items()}
        if isinstance(value, list):
            return [clean(v, f"{where}[{i}]") for i, v in enumerate(value)]
        return value

    cleaned = clean(doc, "")
    if flags:
        cleaned["non_finite"] = flags
    return cleaned  # type: ignore[no-any-return]


def verdict_threshold(value: float, dtype: torch.dtype = torch.float32) -> float:
    """A contract threshold as the verdict applies it: rounded to the scores' dtype."""
    return float(torch.tensor(value, dtype=dtype))


def error_outcome(
    threshold: ResolvedThreshold, contract: NumericalContract, error: dict[str, Any]
) -> ComparisonOutcome:
    """No comparison was possible: the runtime raised or strict execution refused the case."""
    document = _base_document(threshold, contract)
    document.update(result="error", reason=error["message"], error=error)
    return ComparisonOutcome(document, {})


def identity_outcome(
    threshold: ResolvedThreshold, contract: NumericalContract, error: dict[str, Any]
) -> ComparisonOutcome:
    """A side reported (or a guard found) that it did not score the frozen identity."""
    document = _base_document(threshold, contract)
    document.update(
        result="invalid_identity",
        reason=error["message"],
        error=error,
        identity={"valid": False, "violations": [f"[{error['code']}] {error['message']}"]},
    )
    return ComparisonOutcome(document, {})


def recompute_result(token_diffs: dict[str, torch.Tensor]) -> tuple[Result, int]:
    """Offline re-judgement from stored tensors and the stored threshold alone."""
    active = token_diffs["active_mask"].bool()
    diff = torch.abs(token_diffs["training_logprobs"] - token_diffs["rollout_logprobs"])
    threshold = token_diffs["threshold"].to(diff.dtype)
    mismatches = int((active & (diff > threshold)).sum())
    if int(active.sum()) == 0:
        return "zero_active_tokens", 0
    return ("fail" if mismatches else "pass"), mismatches
