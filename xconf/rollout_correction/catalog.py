"""What each verl figure is: its space (nats, perplexity, probability, ratio, fraction).

``docs/judge.md`` shows this table; a test keeps the two in step. ``r``, ``t``: rollout and
training log-probabilities; ``d = t - r``; means are masked means over the response mask,
"per row" means over one sequence's active tokens and "over rows" the batch mean of those.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Figure:
    name: str  # verl's logged name
    space: str  # nats | perplexity | probability | ratio | fraction | count
    meaning: str


_OFFPOLICY = (
    ("kl", "nats", "mean of r - t (KL(rollout || training), direct estimator)"),
    ("k3_kl", "nats", "mean of exp(d) - d - 1 (K3 estimator); xconf's former approx_kl"),
    ("training_ppl", "perplexity", "over rows: exp(-mean per row of t)"),
    ("training_log_ppl", "nats", "over rows: -mean per row of t"),
    ("rollout_ppl", "perplexity", "over rows: exp(-mean per row of r)"),
    ("rollout_log_ppl", "nats", "over rows: -mean per row of r"),
    ("log_ppl_diff", "nats", "over rows: mean per row of r minus mean per row of t"),
    ("log_ppl_abs_diff", "nats", "over rows: |log_ppl_diff of the row|"),
    ("log_ppl_diff_max", "nats", "largest row log_ppl_diff"),
    ("log_ppl_diff_min", "nats", "smallest row log_ppl_diff"),
    ("ppl_ratio", "ratio", "over rows: exp(row log_ppl_diff) = training ppl / rollout ppl"),
    ("chi2_token", "ratio", "mean of exp(clamp(d, ±20))² - 1"),
    ("chi2_seq", "ratio", "over rows: exp(2 clamp(sum per row of d, ±20)) - 1"),
)
_DEBUG = (
    ("rollout_probs_diff_valid", "count", "1 when a token is active, else 0"),
    ("rollout_probs_diff_max", "probability", "max |exp(t) - exp(r)| (not nats)"),
    ("rollout_probs_diff_mean", "probability", "mean |exp(t) - exp(r)| (not nats)"),
    ("rollout_probs_diff_std", "probability", "unbiased std of |exp(t) - exp(r)|"),
    ("rollout_actor_probs_pearson_corr", "probability", "Pearson r of exp(t) and exp(r)"),
)
_WEIGHTS = (
    ("rollout_is_mean", "ratio", "mean of the applied (truncated) IS weights"),
    ("rollout_is_max", "ratio", "largest IS weight (sequence level: exp of the largest sum)"),
    ("rollout_is_min", "ratio", "smallest IS weight"),
    ("rollout_is_std", "ratio", "std of the weights clamped to [0, threshold]"),
    ("rollout_is_eff_sample_size", "fraction", "1 / mean of the squared normalized weights"),
    ("rollout_is_ratio_fraction_high", "fraction", "share of raw weights above the threshold"),
    ("rollout_is_ratio_fraction_low", "fraction", "share of raw weights below the lower bound"),
    ("rollout_is_seq_mean", "ratio", "over rows: mean weight per row"),
    ("rollout_is_seq_std", "ratio", "std over rows of the mean weight per row"),
    ("rollout_is_seq_max", "ratio", "largest mean weight per row"),
    ("rollout_is_seq_min", "ratio", "smallest mean weight per row"),
    ("rollout_is_seq_max_deviation", "ratio", "largest |row mean weight - 1|"),
    ("rollout_is_seq_fraction_high", "fraction", "rows whose raw mean weight is above"),
    ("rollout_is_seq_fraction_low", "fraction", "rows whose raw mean weight is below"),
    ("rollout_is_oob_ratio", "fraction", "IcePop: share of weights zeroed (outside bounds)"),
    ("rollout_is_batch_norm_factor", "ratio", "batch normalization divisor"),
    ("rollout_rs_masked_fraction", "fraction", "share of tokens the rejection vetoes"),
    ("rollout_rs_seq_masked_fraction", "fraction", "share of rows with a vetoed token"),
    (
        "rollout_rs_<option>_*",
        "nats",
        "per option: mean, max, min, std, fraction_high/low, seq_* of its k1/k2/k3 statistic, "
        "masked_fraction and seq_masked_fraction",
    ),
)

FIGURES: dict[str, Figure] = {
    **{f"rollout_corr/{n}": Figure(f"rollout_corr/{n}", s, m) for n, s, m in _OFFPOLICY},
    **{f"training/{n}": Figure(f"training/{n}", s, m) for n, s, m in _DEBUG},
    **{f"rollout_corr/{n}": Figure(f"rollout_corr/{n}", s, m) for n, s, m in _WEIGHTS},
}
