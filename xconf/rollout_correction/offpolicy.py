"""verl's off-policy and debug figures, computed as verl computes them, and xconf's exact ones.

Two evaluations of the same definitions (``docs/judge.md`` lists every figure):

* :func:`verl_offpolicy` / :func:`verl_debug`: the arithmetic of verl 0.9.1
  (``compute_offpolicy_metrics`` in ``verl/trainer/ppo/rollout_corr_helper.py`` and
  ``calculate_debug_metrics`` in ``verl/utils/debug/metrics.py``), in the tensors' own dtype
  and with the caller's mask as given: masked means divide by ``count + 1e-8`` (the guard
  vanishes in float32 once the count is at least 1), a row with no active token has a mean
  of 0 and still counts in the batch means, ``exp`` of a log-probability mean below about
  -88.7 overflows float32 to ``inf``. These are the numbers on the user's dashboard.
* :func:`exact`: the same figures in float64, with exact
  counts (no guard) and batch means over the rows that have an active token. They differ
  from verl's where float32 rounds or overflows, and where a fully masked row is present.

All of them are diagnostics: none of them ever votes on a verdict.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

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


def masked_sum(
    values: torch.Tensor, mask: torch.Tensor, dim: int | None = None, *, owned: bool = False
) -> torch.Tensor:
    """verl's masked sum: inactive entries (padding, -inf, NaN) zeroed, then times the mask.

    ``owned``: ``values`` is a temporary of the caller's, zeroed in place. The products are
    taken in place whenever that keeps verl's dtype: the same elements, the same reduction,
    so the same bits, without a [B, T] temporary per step at verl's batch sizes.
    """
    active = mask.bool()
    if owned and values.is_floating_point():  # where(mask, v, 0.0) keeps a float v's dtype
        kept = values.masked_fill_(~active, 0.0)
    else:
        kept = torch.where(active, values, 0.0)
    if torch.promote_types(kept.dtype, mask.dtype) == kept.dtype:
        kept.mul_(mask)
    else:
        kept = kept * mask
    return kept.sum() if dim is None else kept.sum(dim)


def masked_mean(
    values: torch.Tensor, mask: torch.Tensor, dim: int | None = None, *, owned: bool = False
) -> torch.Tensor:
    """verl's masked mean: the masked sum over ``count + 1e-8``, in the promoted dtype."""
    return masked_sum(values, mask, dim, owned=owned) / (_count(mask, dim) + EPS)


# Rows per block of a bool mask's row counts: a [B, T] int64 copy of the mask is what
# ``mask.sum(-1)`` makes first (8 bytes a token); blocks of rows keep it to a few MiB.
COUNT_ROWS = 256


def _count(mask: torch.Tensor, dim: int | None) -> torch.Tensor:
    """``mask.sum()`` / ``mask.sum(dim)``: for a bool mask the same int64 counts (integers:
    exact however they are added), without the int64 copy of the mask the sum makes."""
    if mask.dtype != torch.bool or mask.dim() != 2 or dim not in (None, -1, 1) or not len(mask):
        return mask.sum() if dim is None else mask.sum(dim)
    if dim is None:
        return torch.count_nonzero(mask)
    return torch.cat(
        [mask[i : i + COUNT_ROWS].sum(-1) for i in range(0, mask.shape[0], COUNT_ROWS)]
    )


@dataclass(frozen=True)
class Selection:
    """``torch.masked_select(values, mask)`` for any ``values`` of the mask's shape: the same
    elements in the same (row-major) order, so the same bits. The mask's positions are found
    once, and each selection is one parallel gather: ``masked_select`` scans serially, and at
    verl's 16M tokens it was the slowest step of the figures. The positions are int32 when
    they fit (4 bytes an active token, not 8)."""

    index: torch.Tensor

    @classmethod
    def of(cls, mask: torch.Tensor) -> Selection:
        index = mask.bool().reshape(-1).nonzero().squeeze(1)
        return cls(index.to(torch.int32) if mask.numel() <= torch.iinfo(torch.int32).max else index)

    def __call__(self, values: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        flat = values.reshape(-1)  # row-major, as masked_select reads it
        if out is None:
            return flat.index_select(0, self.index)
        return torch.index_select(flat, 0, self.index, out=out)

    @property
    def count(self) -> int:
        return self.index.numel()


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
    seq_log_ratio = torch.clamp(masked_sum(log_ratio, mask, -1), -SAFETY_BOUND, SAFETY_BOUND)
    # Each [B, T] term is verl's expression evaluated in place, one at a time: the same
    # elementwise operations in the same order give the same bits with one temporary.
    k3 = torch.exp(log_ratio).sub_(log_ratio).sub_(1)
    k3_kl = masked_mean(k3, mask, owned=True)
    del k3
    rho = torch.clamp(log_ratio, -SAFETY_BOUND, SAFETY_BOUND).exp_()
    del log_ratio
    chi2_token = masked_mean(rho.square_(), mask, owned=True) - 1.0
    del rho
    values = {
        "training_ppl": torch.exp(-mean_t).mean(),
        "training_log_ppl": (-mean_t).mean(),
        "kl": masked_mean(rollout - training, mask, owned=True),
        "k3_kl": k3_kl,
        "rollout_ppl": torch.exp(-mean_r).mean(),
        "rollout_log_ppl": (-mean_r).mean(),
        "log_ppl_diff": log_ppl_diff.mean(),
        "log_ppl_abs_diff": log_ppl_diff.abs().mean(),
        "log_ppl_diff_max": log_ppl_diff.max(),
        "log_ppl_diff_min": log_ppl_diff.min(),
        "ppl_ratio": torch.exp(log_ppl_diff).mean(),
        "chi2_token": chi2_token,
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
    select = Selection.of(active)
    if training.dtype != rollout.dtype:  # verl's subtraction and stack promote: as they do
        actor, roll = torch.exp(training), torch.exp(rollout)
        diff = select((actor - roll).abs_())
        return {
            **_probability_figures(diff),
            DEBUG[4]: _item(_pearson(select(actor), select(roll))),
        }
    # verl stacks the two selections: each probability selected straight into its stacked
    # row, one [B, T] exp at a time; |actor - roll| of the selected values is verl's
    # selection of |actor - roll| (subtraction and abs are exact elementwise: the same bits).
    both = torch.empty((2, select.count), dtype=training.dtype)
    for row, side in enumerate((training, rollout)):
        probability = torch.exp(side)
        select(probability, out=both[row])
        del probability
    del select
    diff = (both[0] - both[1]).abs_()
    figures = _probability_figures(diff)
    del diff
    figures[DEBUG[4]] = _item(torch.corrcoef(both)[0][1])
    return figures


def _probability_figures(diff: torch.Tensor) -> dict[str, float]:
    """verl's valid, max, mean and (unbiased) std of the active |p_training - p_rollout|."""
    return {
        DEBUG[0]: 1.0,
        DEBUG[1]: _item(torch.max(diff)),
        DEBUG[2]: _item(torch.mean(diff)),
        DEBUG[3]: _item(torch.std(diff)),
    }


# Tokens per block of the float64 pass (whole rows, at least one): a dozen float64 block
# temporaries stay near 12 MiB at any batch size, a small fraction of a verl batch's bytes.
BLOCK_TOKENS = 1 << 17


def _blocks(
    rollout: torch.Tensor, training: torch.Tensor, mask: torch.Tensor
) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """(rollout, training, active) in float64 blocks of rows; inactive entries are 0."""
    zero = torch.zeros((), dtype=torch.float64)
    step = max(1, BLOCK_TOKENS // max(1, rollout.shape[1]))
    for start in range(0, rollout.shape[0], step):
        rows = slice(start, start + step)
        active = mask[rows].bool()
        r = torch.where(active, rollout[rows].to(torch.float64), zero)
        t = torch.where(active, training[rows].to(torch.float64), zero)
        yield r, t, active


def exact(
    rollout: torch.Tensor, training: torch.Tensor, mask: torch.Tensor
) -> tuple[dict[str, float], dict[str, float]]:
    """The 13 off-policy and the 5 debug definitions in float64, in one pass over row blocks.

    Exact counts (no guard), batch means over the rows that have an active token. Sums are
    float64 per block, so a 16M-token batch never holds a float64 copy of itself; second
    moments are taken about a pilot mean (the first block's), which keeps them free of
    cancellation. Requires an active token.
    """
    per_row: dict[str, list[torch.Tensor]] = {"t": [], "r": [], "d": [], "n": []}
    acc = dict.fromkeys(("k3", "rho2", "diff", "actor", "roll"), 0.0)
    acc.update(dict.fromkeys(("diff2", "actor2", "roll2", "cross", "top"), 0.0))
    pilot: tuple[float, float, float] | None = None
    for r, t, active in _blocks(rollout, training, mask):
        d = t - r
        per_row["t"].append(t.sum(-1))
        per_row["r"].append(r.sum(-1))
        per_row["d"].append(d.sum(-1))
        count = active.sum(-1).to(torch.float64)
        per_row["n"].append(count)
        n = float(count.sum())
        if n == 0:
            continue
        # Inactive entries are 0 on both sides (d = 0), where expm1 is exactly 0: no masking,
        # and expm1 keeps the tiny k3 / chi2 terms free of the cancellation of exp(d) - 1.
        acc["k3"] += float((torch.expm1(d) - d).sum())
        acc["rho2"] += float(torch.expm1(2.0 * torch.clamp(d, -SAFETY_BOUND, SAFETY_BOUND)).sum())
        actor = torch.where(active, torch.exp(t), 0.0)
        roll = torch.where(active, torch.exp(r), 0.0)
        diff = torch.abs(actor - roll)
        if pilot is None:
            pilot = (float(diff.sum()) / n, float(actor.sum()) / n, float(roll.sum()) / n)
        c_diff, c_actor, c_roll = pilot
        acc["top"] = max(acc["top"], float(diff.max()))
        for key, side, centre in (("diff", diff, c_diff), ("actor", actor, c_actor)):
            acc[key] += float(side.sum())
            acc[key + "2"] += float(torch.where(active, side - centre, 0.0).square().sum())
        acc["roll"] += float(roll.sum())
        centred_roll = torch.where(active, roll - c_roll, 0.0)
        acc["roll2"] += float(centred_roll.square().sum())
        acc["cross"] += float((torch.where(active, actor - c_actor, 0.0) * centred_roll).sum())
    counts = torch.cat(per_row["n"])
    rows = counts > 0
    total = float(counts.sum())
    mean_t = torch.cat(per_row["t"])[rows] / counts[rows]
    mean_r = torch.cat(per_row["r"])[rows] / counts[rows]
    seq = torch.clamp(torch.cat(per_row["d"])[rows], -SAFETY_BOUND, SAFETY_BOUND)
    log_ppl_diff = mean_r - mean_t
    values: dict[str, torch.Tensor | float] = {
        "training_ppl": torch.exp(-mean_t).mean(),
        "training_log_ppl": (-mean_t).mean(),
        "kl": -float(torch.cat(per_row["d"]).sum()) / total,
        "k3_kl": acc["k3"] / total,
        "rollout_ppl": torch.exp(-mean_r).mean(),
        "rollout_log_ppl": (-mean_r).mean(),
        "log_ppl_diff": log_ppl_diff.mean(),
        "log_ppl_abs_diff": log_ppl_diff.abs().mean(),
        "log_ppl_diff_max": log_ppl_diff.max(),
        "log_ppl_diff_min": log_ppl_diff.min(),
        "ppl_ratio": torch.exp(log_ppl_diff).mean(),
        # identical sides: exactly 0 (verl's 1e-8 guard is not part of the definition)
        "chi2_token": acc["rho2"] / total,  # mean of (rho^2 - 1), each term by expm1
        "chi2_seq": torch.exp(2.0 * seq).mean() - 1.0,
    }
    offpolicy = {name: _item(values[name]) for name in OFFPOLICY}
    return offpolicy, _exact_debug(acc, pilot or (0.0, 0.0, 0.0), total)


def _exact_debug(
    acc: dict[str, float], pilot: tuple[float, float, float], n: float
) -> dict[str, float]:
    """Mean, unbiased std and Pearson r from sums about the pilot centres."""
    nan = float("nan")
    means = {key: acc[key] / n for key in ("diff", "actor", "roll")}
    shift = dict(zip(("diff", "actor", "roll"), pilot, strict=True))
    # sum (x - m)^2 = sum (x - c)^2 - n (m - c)^2 ; sum (x - mx)(y - my) likewise
    var = {k: max(acc[k + "2"] - n * (means[k] - shift[k]) ** 2, 0.0) for k in means}
    cov = acc["cross"] - n * (means["actor"] - shift["actor"]) * (means["roll"] - shift["roll"])
    denominator = math.sqrt(var["actor"] * var["roll"])
    return {
        DEBUG[0]: 1.0,
        DEBUG[1]: acc["top"],
        DEBUG[2]: means["diff"],
        DEBUG[3]: math.sqrt(var["diff"] / (n - 1)) if n > 1 else nan,
        # torch.corrcoef clips to [-1, 1]; a constant side has no correlation (NaN)
        DEBUG[4]: max(-1.0, min(1.0, cov / denominator)) if denominator > 0 else nan,
    }
