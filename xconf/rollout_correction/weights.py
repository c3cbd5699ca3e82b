"""verl's importance-sampling (IS) and rejection-sampling (RS) figures, when configured.

What verl 0.9.1 logs under ``rollout_corr/rollout_is_*`` and ``rollout_corr/rollout_rs_*``
(``compute_rollout_correction_weights``, ``compute_is_metrics``,
``compute_rollout_rejection_mask`` and ``compute_rs_metrics`` in
``verl/trainer/ppo/rollout_corr_helper.py``) for a :class:`Correction` that mirrors the
IS/RS fields of verl's ``RolloutCorrectionConfig``. Computed in the tensors' dtype with
verl's masked means, so the figures match the user's dashboard. Diagnostics: xconf never
applies the weights or the rejection mask, and none of these figures votes.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import torch

from xconf.errors import XconfError
from xconf.rollout_correction.offpolicy import SAFETY_BOUND, masked_mean, masked_sum

IS_LEVELS = ("token", "sequence")
RS_OPTIONS = (
    "token_k1",
    "token_k2",
    "token_k3",
    "seq_sum_k1",
    "seq_sum_k2",
    "seq_sum_k3",
    "seq_mean_k1",
    "seq_mean_k2",
    "seq_mean_k3",
    "seq_max_k2",
    "seq_max_k3",
)


class CorrectionError(XconfError):
    """An IS/RS setting verl would refuse."""


@dataclass(frozen=True)
class Correction:
    """verl's ``algorithm.rollout_correction`` IS/RS settings (None: not configured).

    ``rollout_is_threshold`` is a number (TIS: truncate weights at it) or ``"lower_upper"``
    (IcePop: zero weights outside); ``rollout_rs`` a comma-separated list of
    :data:`RS_OPTIONS` with ``rollout_rs_threshold`` one value or one per option (``*_k1``
    options take ``"lower_upper"`` ratio bounds).
    """

    rollout_is: str | None = None
    rollout_is_threshold: float | str = 2.0
    rollout_is_batch_normalize: bool = False
    rollout_rs: str | None = None
    rollout_rs_threshold: float | str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def configured(self) -> bool:
        return self.rollout_is is not None or self.rollout_rs is not None


def _bad(message: str, where: str) -> CorrectionError:
    return CorrectionError("judge.bad_correction", message, where)


def _number(text: str, where: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise _bad(f"{text!r} is not a number", where) from None
    if not math.isfinite(value) or value <= 0:
        raise _bad(f"{text!r} must be a positive number", where)
    return value


def is_bounds(spec: float | str) -> tuple[float, float | None]:
    """(upper, lower or None) of an IS threshold: a number, or ``"lower_upper"``."""
    where = "rollout_is_threshold"
    if isinstance(spec, bool) or not isinstance(spec, int | float | str):
        raise _bad(f"{spec!r} is not a number or 'lower_upper'", where)
    text = str(spec).strip()
    if "_" not in text:
        return _number(text, where), None
    low, _, up = text.partition("_")
    lower, upper = _number(low, where), _number(up, where)
    if lower > upper:
        raise _bad(f"lower bound {lower} is above the upper bound {upper}", where)
    return upper, lower


def rs_bounds(
    options: list[str], spec: float | str | None
) -> dict[str, tuple[float | None, float]]:
    """Per option (lower or None, upper), as verl parses ``rollout_rs_threshold``."""
    where = "rollout_rs_threshold"
    if spec is None:
        raise _bad("rejection sampling needs rollout_rs_threshold", where)
    parts = [p.strip() for p in str(spec).split(",") if p.strip()]
    if len(parts) not in (1, len(options)):
        raise _bad(f"give one threshold or one per option ({len(options)})", where)
    parts = parts * len(options) if len(parts) == 1 else parts
    bounds: dict[str, tuple[float | None, float]] = {}
    for option, part in zip(options, parts, strict=True):
        if option.endswith("k1"):
            low, sep, up = part.partition("_")
            upper = _number(up if sep else part, where)
            lower = _number(low, where) if sep else 1.0 / upper
            if lower > upper:
                raise _bad(f"{option}: lower bound {lower} is above {upper}", where)
            bounds[option] = (lower, upper)
        else:
            if "_" in part:
                raise _bad(f"{option} takes one upper bound, not {part!r}", where)
            bounds[option] = (None, _number(part, where))
    return bounds


def check_correction(correction: Correction) -> None:
    """Refuse settings verl would refuse, before anything is computed or written."""
    if correction.rollout_is is not None:
        if correction.rollout_is not in IS_LEVELS:
            raise _bad(f"rollout_is {correction.rollout_is!r}; one of {IS_LEVELS}", "rollout_is")
        is_bounds(correction.rollout_is_threshold)
    if correction.rollout_rs is not None:
        rs_bounds(_rs_options(correction.rollout_rs), correction.rollout_rs_threshold)


def _rs_options(spec: str) -> list[str]:
    options: list[str] = []
    for option in (o.strip() for o in spec.split(",")):
        if option and option not in RS_OPTIONS:
            raise _bad(f"rollout_rs option {option!r}; one of {RS_OPTIONS}", "rollout_rs")
        if option and option not in options:
            options.append(option)
    if not options:
        raise _bad("rollout_rs names no option", "rollout_rs")
    return options


def _f(value: torch.Tensor | float) -> float:
    return float(value.item()) if isinstance(value, torch.Tensor) else float(value)


def _masked_max(values: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
    return values.masked_fill(~active, float("-inf")).max()


def _masked_min(values: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
    return values.masked_fill(~active, float("inf")).min()


def _clamped_std(values: torch.Tensor, mask: torch.Tensor, low: float, high: float) -> float:
    if not bool(mask.sum() > 1):
        return 0.0
    clamped = values.clamp(min=low, max=high)
    mean = masked_mean(clamped, mask)
    var = masked_mean(clamped.square(), mask) - mean.square()
    return _f(torch.sqrt(torch.clamp(var, min=0.0)))


def importance_figures(
    log_ratio: torch.Tensor, mask: torch.Tensor, correction: Correction
) -> dict[str, float]:
    """``rollout_is_*`` figures (without the ``rollout_corr/`` prefix)."""
    level = correction.rollout_is
    upper, lower_bound = is_bounds(correction.rollout_is_threshold)
    active = mask.bool()
    if level == "token":
        for_metrics = log_ratio
        raw = torch.exp(torch.clamp(log_ratio, -SAFETY_BOUND, SAFETY_BOUND))
    else:
        for_metrics = masked_sum(log_ratio, mask, -1).unsqueeze(-1)
        raw = torch.exp(torch.clamp(for_metrics, -SAFETY_BOUND, SAFETY_BOUND)).expand_as(log_ratio)
    raw = raw * mask
    if lower_bound is None:
        weights = raw.clamp(max=upper)
    else:
        kept = (raw >= lower_bound) & (raw <= upper)
        weights = torch.where(kept, raw, torch.zeros_like(raw))
    lower = 1.0 / upper if lower_bound is None else lower_bound
    out: dict[str, float] = {}
    if level == "sequence":
        log_upper = torch.log(torch.tensor(upper))
        log_lower = torch.log(torch.tensor(lower))
        out["rollout_is_max"] = _f(torch.exp(torch.clamp(for_metrics.max(), max=SAFETY_BOUND)))
        out["rollout_is_min"] = _f(torch.exp(for_metrics.min()))
        out["rollout_is_mean"] = _f(masked_mean(weights, mask))
        out["rollout_is_ratio_fraction_high"] = _f((for_metrics > log_upper).float().mean())
        out["rollout_is_ratio_fraction_low"] = _f((for_metrics < log_lower).float().mean())
    else:
        out["rollout_is_mean"] = _f(masked_mean(weights, mask))
        out["rollout_is_ratio_fraction_high"] = _f(masked_mean((raw > upper).float(), mask))
        out["rollout_is_ratio_fraction_low"] = _f(masked_mean((raw < lower).float(), mask))
        out["rollout_is_max"] = _f(_masked_max(weights, active))
        out["rollout_is_min"] = _f(_masked_min(weights, active))
    out["rollout_is_std"] = _clamped_std(weights, mask, 0.0, upper)
    for_ess = weights.clamp(min=0.0, max=upper)
    normalized = for_ess / (masked_mean(for_ess, mask) + 1e-8)
    # verl divides by this in Python and raises ZeroDivisionError when every weight is 0
    # (IcePop zeroing all of them); a figure never crashes a verdict: inf (null in JSON).
    mean_square = _f(masked_mean(normalized.square(), mask))
    out["rollout_is_eff_sample_size"] = 1.0 / mean_square if mean_square != 0.0 else math.inf
    seq_mean = masked_mean(weights, mask, -1)
    out["rollout_is_seq_mean"] = _f(seq_mean.mean())
    out["rollout_is_seq_std"] = _f(seq_mean.std()) if seq_mean.numel() > 1 else 0.0
    out["rollout_is_seq_max"] = _f(seq_mean.max())
    out["rollout_is_seq_min"] = _f(seq_mean.min())
    out["rollout_is_seq_max_deviation"] = _f((seq_mean - 1.0).abs().max())
    raw_seq = masked_mean(raw, mask, -1)
    out["rollout_is_seq_fraction_high"] = _f((raw_seq > upper).float().mean())
    out["rollout_is_seq_fraction_low"] = _f((raw_seq < lower).float().mean())
    if lower_bound is not None:
        outside = (raw < lower_bound) | (raw > upper)
        out["rollout_is_oob_ratio"] = _f(masked_mean(outside.float(), mask))
    if correction.rollout_is_batch_normalize:
        if level == "token":
            mean = masked_mean(weights, mask)
        else:
            rows = (mask.sum(-1) > 0).to(weights.dtype)
            mean = (seq_mean * rows).sum() / rows.sum().clamp_min(1e-8)
        out["rollout_is_batch_norm_factor"] = _f(mean) if bool(mean > 1e-8) else 1.0
    return out


def _rs_statistic(
    option: str, token_stat: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(per-token statistic, per-sequence statistic or None) of one RS option."""
    if option.startswith("token_"):
        return token_stat, None
    if option.startswith("seq_sum_"):
        seq = masked_sum(token_stat, mask, -1)
    elif option.startswith("seq_mean_"):
        seq = masked_mean(token_stat, mask, -1)
    else:  # seq_max_*: a row with no active token has 0
        best = token_stat.masked_fill(~mask.bool(), float("-inf")).max(dim=-1).values
        seq = torch.where(best == float("-inf"), torch.zeros_like(best), best)
    return seq.unsqueeze(-1).expand_as(mask), seq


def _rs_option_figures(
    prefix: str,
    stat: torch.Tensor,
    seq_stat: torch.Tensor | None,
    mask: torch.Tensor,
    rows: torch.Tensor,
    bounds: tuple[float, float, bool],
) -> dict[str, float]:
    upper, lower, two_sided = bounds
    active = mask.bool()
    seq_all = masked_mean(stat, mask, -1) if seq_stat is None else seq_stat
    seq = seq_all[rows]
    by_sequence = seq_stat is not None and seq.numel() > 0
    out = {f"{prefix}_mean": _f(masked_mean(stat, mask))}
    if by_sequence:
        out[f"{prefix}_max"] = _f(seq.max())
        out[f"{prefix}_min"] = _f(seq.min())
        high = _f((seq > upper).float().mean())
        low = _f((seq < lower).float().mean()) if two_sided else 0.0
    else:
        out[f"{prefix}_max"] = _f(_masked_max(stat, active))
        out[f"{prefix}_min"] = _f(_masked_min(stat, active))
        high = _f(masked_mean((stat > upper).float(), mask))
        low = _f(masked_mean((stat < lower).float(), mask)) if two_sided else 0.0
    out[f"{prefix}_fraction_high"] = high
    out[f"{prefix}_fraction_low"] = low
    out[f"{prefix}_std"] = _clamped_std(stat, mask, lower if two_sided else 0.0, upper)
    if seq.numel() > 0:
        out[f"{prefix}_seq_mean"] = _f(seq.mean())
        out[f"{prefix}_seq_std"] = _f(seq.std()) if seq.numel() > 1 else 0.0
        out[f"{prefix}_seq_max"] = _f(seq.max())
        out[f"{prefix}_seq_min"] = _f(seq.min())
        out[f"{prefix}_seq_max_deviation"] = _f(seq.abs().max())
        out[f"{prefix}_seq_fraction_high"] = _f((seq > upper).float().mean())
        if two_sided:
            out[f"{prefix}_seq_fraction_low"] = _f((seq < lower).float().mean())
    else:
        for name in ("mean", "std", "max", "min", "max_deviation", "fraction_high", "fraction_low"):
            out[f"{prefix}_seq_{name}"] = 0.0
    return out


def rejection_figures(
    log_ratio: torch.Tensor, mask: torch.Tensor, correction: Correction
) -> dict[str, float]:
    """``rollout_rs_*`` figures (without the ``rollout_corr/`` prefix)."""
    options = _rs_options(str(correction.rollout_rs))
    bounds = rs_bounds(options, correction.rollout_rs_threshold)
    safe = torch.clamp(log_ratio, -SAFETY_BOUND, SAFETY_BOUND)
    per_token = {"k1": -safe, "k2": 0.5 * safe**2, "k3": torch.exp(safe) - 1.0 - safe}
    active = mask.bool()
    rows = mask.sum(dim=-1) > 0
    combined = torch.ones_like(mask, dtype=log_ratio.dtype)
    out: dict[str, float] = {}
    for option in options:
        lower, upper = bounds[option]
        stat, seq_stat = _rs_statistic(option, per_token[option[-2:]], mask)
        if lower is not None:  # k1: bounds on the log of the ratio
            low_log, up_log = math.log(lower), math.log(upper)
            keep = (stat >= low_log) & (stat <= up_log)
            metric_bounds = (up_log, low_log, True)
        else:
            keep = stat <= upper
            metric_bounds = (upper, 0.0, False)
        prefix = f"rollout_rs_{option}"
        out.update(_rs_option_figures(prefix, stat, seq_stat, mask, rows, metric_bounds))
        keep_f = keep.to(dtype=log_ratio.dtype)
        combined = combined * keep_f
        seq_keep = (~((~keep) & active)).all(dim=-1)
        out[f"{prefix}_masked_fraction"] = _f(masked_mean(1 - keep_f, mask))
        rows_f = rows.float()
        out[f"{prefix}_seq_masked_fraction"] = (
            _f(((1.0 - seq_keep.to(dtype=log_ratio.dtype)) * rows_f).sum() / rows_f.sum())
            if bool(rows_f.sum() > 0)
            else 0.0
        )
    out["rollout_rs_masked_fraction"] = _f(masked_mean(1 - combined, mask))
    kept = (combined > 0.5) & active
    out["rollout_rs_seq_masked_fraction"] = _f((~kept & active).any(dim=-1).float().mean())
    return out


def correction_figures(
    rollout: torch.Tensor, training: torch.Tensor, mask: torch.Tensor, correction: Correction
) -> dict[str, float]:
    """Every IS/RS figure the correction configures (short names; none when unconfigured)."""
    log_ratio = training - rollout
    out: dict[str, float] = {}
    if correction.rollout_is is not None:
        out.update(importance_figures(log_ratio, mask, correction))
    if correction.rollout_rs is not None:
        out.update(rejection_figures(log_ratio, mask, correction))
    return out
