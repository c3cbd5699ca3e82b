"""The rollout-vs-training numbers verl's rollout correction logs (``rollout_corr/*``).

Computed over the response mask with verl's definitions (``compute_offpolicy_metrics`` in
``verl/trainer/ppo/rollout_corr_helper.py``), so a user can put xconf's figures next to their
training dashboard. With ``r`` rollout and ``t`` training logprobs, ``m`` the mask:

- masked means divide by ``sum(m) + 1e-8`` (verl's ``masked_mean``); per-sequence means are
  taken over each row, and a row with no active token contributes a mean of 0, as in verl;
- ``kl = mean_m(r - t)``; ``k3_kl = mean_m(exp(t - r) - (t - r) - 1)``;
- ``training_ppl = mean_b exp(-mean_m,row(t))``, ``rollout_ppl`` likewise with ``r``;
- ``log_ppl_diff = mean_b(mean_row(r) - mean_row(t))``, ``log_ppl_abs_diff`` of its |.|,
  ``ppl_ratio = mean_b exp(mean_row(r) - mean_row(t))``;
- ``chi2_token = mean_m(exp(2 clamp(t - r, ±20))) - 1``;
  ``chi2_seq = mean_b exp(2 clamp(sum_row(t - r), ±20)) - 1``.

Computed in float64. These are diagnostics: they never vote. A value that is not finite
(overflow on extreme inputs) is reported as null and named in ``non_finite``.
"""

from __future__ import annotations

import math
from typing import Any

import torch

SAFETY_BOUND = 20.0  # verl's clamp on log-ratios before exponentiating (chi-squared)
EPS = 1e-8  # verl's masked_mean denominator guard
METRICS = (
    "kl",
    "k3_kl",
    "training_ppl",
    "rollout_ppl",
    "log_ppl_diff",
    "log_ppl_abs_diff",
    "ppl_ratio",
    "chi2_token",
    "chi2_seq",
)


def _masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    if dim is None:
        return (values * mask).sum() / (mask.sum() + EPS)
    return (values * mask).sum(dim) / (mask.sum(dim) + EPS)


def rollout_correction(
    rollout: torch.Tensor, training: torch.Tensor, mask: torch.Tensor
) -> dict[str, Any]:
    """verl's off-policy metrics for [B, T] logprobs; None when no token is active."""
    active = mask.bool()
    if rollout.dim() != 2 or rollout.shape != training.shape or rollout.shape != mask.shape:
        return {"metrics": None, "non_finite": [], "reason": "shapes differ"}
    if not bool(active.any()):
        return {"metrics": None, "non_finite": [], "reason": "no active token"}
    m = active.double()
    # Inactive positions may hold anything (padding, -inf): zero them before any arithmetic.
    r = torch.where(active, rollout.double(), torch.zeros_like(m))
    t = torch.where(active, training.double(), torch.zeros_like(m))
    with torch.no_grad():
        log_ratio = t - r
        mean_r = _masked_mean(r, m, dim=-1)
        mean_t = _masked_mean(t, m, dim=-1)
        log_ppl_diff = mean_r - mean_t
        clamped = torch.clamp(log_ratio, -SAFETY_BOUND, SAFETY_BOUND)
        seq_sum = torch.clamp((log_ratio * m).sum(-1), -SAFETY_BOUND, SAFETY_BOUND)
        values = {
            "kl": _masked_mean(r - t, m),
            "k3_kl": _masked_mean(torch.exp(log_ratio) - log_ratio - 1.0, m),
            "training_ppl": torch.exp(-mean_t).mean(),
            "rollout_ppl": torch.exp(-mean_r).mean(),
            "log_ppl_diff": log_ppl_diff.mean(),
            "log_ppl_abs_diff": log_ppl_diff.abs().mean(),
            "ppl_ratio": torch.exp(log_ppl_diff).mean(),
            "chi2_token": _masked_mean(torch.exp(2.0 * clamped), m) - 1.0,
            "chi2_seq": torch.exp(2.0 * seq_sum).mean() - 1.0,
        }
    metrics: dict[str, float | None] = {}
    non_finite = []
    for name in METRICS:
        value = float(values[name])
        if math.isfinite(value):
            metrics[name] = value
        else:
            metrics[name] = None
            non_finite.append(name)
    return {"metrics": metrics, "non_finite": non_finite, "reason": None}
