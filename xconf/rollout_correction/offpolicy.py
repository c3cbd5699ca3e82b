"""verl's off-policy and debug figures, computed as verl computes them, and xconf's exact ones.

Two evaluations of the same definitions (``docs/judge.md`` lists every figure):

* :func:`verl_offpolicy` / :func:`verl_debug`: the arithmetic of verl 0.9.1
  (``compute_offpolicy_metrics`` in ``verl/trainer/ppo/rollout_corr_helper.py`` and
  ``calculate_debug_metrics`` in ``verl/utils/debug/metrics.py``), in the tensors' own dtype
  and with the caller's mask as given: masked means divide by ``count + 1e-8`` (the guard
  vanishes in float32 once the count is at least 1), a row with no active token has a mean
  of 0 and still counts in the batch means, ``exp`` of a log-probability mean below about
  -88.7 overflows float32 to ``inf``. These are the numbers on the user's dashboard.
* :func:`exact_offpolicy` / :func:`exact_debug`: the same figures in float64, with exact
  counts (no guard) and batch means over the rows that have an active token. They differ
  from verl's where float32 rounds or overflows, and where a fully masked row is present.

All of them are diagnostics: none of them ever votes on a verdict.
"""

from __future__ import annotations

import torch

SAFETY_BOUND = 20.0  # verl's clamp on log-ratios before exponentiating
EPS = 1e-8  # verl's masked-mean guard on the count
OFFPOLICY = (
    "training_ppl",
    "training_log_ppl",
    "kl",
    "k3_kl",
    "rollout_ppl",
    "rollout_log_ppl",
    "log_ppl_diff",
    "log_ppl_abs_diff",
    "log_ppl_diff_max",
    "log_ppl_diff_min",
    "ppl_ratio",
    "chi2_token",
    "chi2_seq",
)
DEBUG = (
    "training/rollout_probs_diff_valid",
    "training/rollout_probs_diff_max",
    "training/rollout_probs_diff_mean",
    "training/rollout_probs_diff_std",
    "training/rollout_actor_probs_pearson_corr",
)


def masked_sum(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """verl's masked sum: inactive entries (padding, -inf, NaN) zeroed, then times the mask."""
    kept = torch.where(mask.bool(), values, 0.0) * mask
    return kept.sum() if dim is None else kept.sum(dim)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """verl's masked mean: the masked sum over ``count + 1e-8``, in the promoted dtype."""
    count = mask.sum() if dim is None else mask.sum(dim)
    return masked_sum(values, mask, dim) / (count + EPS)


def _item(value: torch.Tensor | float) -> float:
    return float(value.item()) if isinstance(value, torch.Tensor) else float(value)


def verl_offpolicy(
    rollout: torch.Tensor, training: torch.Tensor, mask: torch.Tensor
) -> dict[str, float]:
    """The 13 ``rollout_corr/`` off-policy figures (short names), verl's arithmetic.

    ``mask`` must have an active token (verl asserts it); the caller checks.
    """
    mean_t = masked_mean(training, mask, -1)
    mean_r = masked_mean(rollout, mask, -1)
    log_ratio = training - rollout
    log_ppl_diff = mean_r - mean_t
    rho = torch.exp(torch.clamp(log_ratio, -SAFETY_BOUND, SAFETY_BOUND))
    seq_log_ratio = torch.clamp(masked_sum(log_ratio, mask, -1), -SAFETY_BOUND, SAFETY_BOUND)
    values = {
        "training_ppl": torch.exp(-mean_t).mean(),
        "training_log_ppl": (-mean_t).mean(),
        "kl": masked_mean(rollout - training, mask),
        "k3_kl": masked_mean(torch.exp(log_ratio) - log_ratio - 1, mask),
        "rollout_ppl": torch.exp(-mean_r).mean(),
        "rollout_log_ppl": (-mean_r).mean(),
        "log_ppl_diff": log_ppl_diff.mean(),
        "log_ppl_abs_diff": log_ppl_diff.abs().mean(),
        "log_ppl_diff_max": log_ppl_diff.max(),
        "log_ppl_diff_min": log_ppl_diff.min(),
        "ppl_ratio": torch.exp(log_ppl_diff).mean(),
        "chi2_token": masked_mean(rho.square(), mask) - 1.0,
        "chi2_seq": torch.exp(2.0 * seq_log_ratio).mean() - 1.0,
    }
    return {name: _item(values[name]) for name in OFFPOLICY}


def _pearson(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.corrcoef(torch.stack([a, b], dim=0))[0][1]


def verl_debug(
    rollout: torch.Tensor, training: torch.Tensor, mask: torch.Tensor
) -> dict[str, float]:
    """verl's ``training/rollout_probs_diff_*`` and Pearson figures: **probability** space.

    ``|exp(training) - exp(rollout)|`` over the active tokens (max, mean, unbiased std), and
    the Pearson correlation of the two probabilities. No active token: valid 0, the rest NaN.
    """
    active = mask.bool()
    if not bool(active.any()):
        nan = float("nan")
        return {DEBUG[0]: 0.0, **{name: nan for name in DEBUG[1:]}}
    actor = torch.exp(training)
    roll = torch.exp(rollout)
    diff = torch.masked_select(torch.abs(actor - roll), active)
    pearson = _pearson(torch.masked_select(actor, active), torch.masked_select(roll, active))
    return {
        DEBUG[0]: 1.0,
        DEBUG[1]: _item(torch.max(diff)),
        DEBUG[2]: _item(torch.mean(diff)),
        DEBUG[3]: _item(torch.std(diff)),
        DEBUG[4]: _item(pearson),
    }


def _exact_inputs(
    rollout: torch.Tensor, training: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    active = mask.bool()
    zero = torch.zeros((), dtype=torch.float64)
    r = torch.where(active, rollout.to(torch.float64), zero)
    t = torch.where(active, training.to(torch.float64), zero)
    counts = active.sum(-1).to(torch.float64)
    return r, t, active, counts, counts > 0


def exact_offpolicy(
    rollout: torch.Tensor, training: torch.Tensor, mask: torch.Tensor
) -> dict[str, float]:
    """The same 13 definitions in float64: exact counts, batch means over non-empty rows."""
    r, t, active, counts, rows = _exact_inputs(rollout, training, mask)
    total = counts.sum()
    log_ratio = t - r
    mean_t = t.sum(-1)[rows] / counts[rows]
    mean_r = r.sum(-1)[rows] / counts[rows]
    log_ppl_diff = mean_r - mean_t
    rho = torch.exp(torch.clamp(log_ratio, -SAFETY_BOUND, SAFETY_BOUND))
    seq = torch.clamp(log_ratio.sum(-1)[rows], -SAFETY_BOUND, SAFETY_BOUND)
    values = {
        "training_ppl": torch.exp(-mean_t).mean(),
        "training_log_ppl": (-mean_t).mean(),
        "kl": (r - t).sum() / total,
        "k3_kl": torch.where(active, torch.exp(log_ratio) - log_ratio - 1.0, 0.0).sum() / total,
        "rollout_ppl": torch.exp(-mean_r).mean(),
        "rollout_log_ppl": (-mean_r).mean(),
        "log_ppl_diff": log_ppl_diff.mean(),
        "log_ppl_abs_diff": log_ppl_diff.abs().mean(),
        "log_ppl_diff_max": log_ppl_diff.max(),
        "log_ppl_diff_min": log_ppl_diff.min(),
        "ppl_ratio": torch.exp(log_ppl_diff).mean(),
        # identical sides: exactly 0 (verl's 1e-8 guard is not part of the definition)
        "chi2_token": torch.where(active, rho.square(), 0.0).sum() / total - 1.0,
        "chi2_seq": torch.exp(2.0 * seq).mean() - 1.0,
    }
    return {name: _item(values[name]) for name in OFFPOLICY}


def exact_debug(
    rollout: torch.Tensor, training: torch.Tensor, mask: torch.Tensor
) -> dict[str, float]:
    """verl's probability-space debug figures in float64."""
    active = mask.bool()
    return verl_debug(rollout.to(torch.float64), training.to(torch.float64), active)
