"""Numeric views of one case's token diffs: histogram, drift profile, worst tokens."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from xconf.report.loader import TokenDiffs
from xconf.report.model import DiffStats, Histogram, ProfilePoint, WorstToken

BINS_PER_DECADE = 4
MAX_DECADES = 18
WORST_TOKENS = 10

TokenDecoder = Callable[[int], str]


def as_float(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def as_int(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value


def diff_stats(comparison: Mapping[str, Any], diffs: TokenDiffs | None) -> DiffStats:
    """Diagnostics as the comparator recorded them; recomputed only where it left none."""
    recorded = comparison.get("diff")
    if isinstance(recorded, dict) and any(as_float(recorded.get(k)) is not None for k in recorded):
        return DiffStats(*(as_float(recorded.get(k)) for k in ("mean", "p50", "p90", "p99", "max")))
    if diffs is None:
        return DiffStats(None, None, None, None, None)
    values = diffs.abs_diff[diffs.active_mask].astype(np.float64)
    if values.size == 0:
        return DiffStats(None, None, None, None, None)
    p50, p90, p99 = (float(v) for v in np.quantile(values, [0.5, 0.9, 0.99]))
    return DiffStats(float(values.mean()), p50, p90, p99, float(values.max()))


def histogram(diffs: TokenDiffs, threshold_line: float | None = None) -> Histogram | None:
    """Log-binned |diff| of the active tokens, spanning the threshold too.

    ``threshold_line`` is the contract value to draw (comparison.json); the count above it
    uses the stored float32 threshold, the precision the verdict was computed in. Counted
    one block of rows at a time: counts add exactly, extremes are the blocks' extremes.
    """
    size = nonzero_count = 0
    low_nonzero, high_nonzero = math.inf, -math.inf
    for rows in diffs.row_blocks():
        values = _finite_active(diffs, rows)
        nonzero = values[values > 0]
        size, nonzero_count = size + values.size, nonzero_count + nonzero.size
        if nonzero.size:
            low_nonzero = min(low_nonzero, float(nonzero.min()))
            high_nonzero = max(high_nonzero, float(nonzero.max()))
    if size == 0:
        return None
    threshold = diffs.threshold
    zero_count = int(size - nonzero_count)
    candidates = [threshold] if threshold > 0 else []
    low_src = [*candidates, low_nonzero] if nonzero_count else candidates or [1e-12]
    high_src = [*candidates, high_nonzero] if nonzero_count else candidates or [1.0]
    low = math.floor(math.log10(min(low_src))) - (0 if nonzero_count else 1)
    high = math.ceil(math.log10(max(high_src)) + 1e-12)
    if high <= low:
        high = low + 1
    low = max(low, high - MAX_DECADES)
    edges = np.logspace(low, high, (high - low) * BINS_PER_DECADE + 1)
    counts = np.zeros(len(edges) - 1, dtype=np.int64)
    above = 0
    for rows in diffs.row_blocks():  # the second pass: the bins are known now
        values = _finite_active(diffs, rows)
        clipped = np.clip(values[values > 0], edges[0], edges[-1])
        counts += np.histogram(clipped, bins=edges)[0]
        above += int(np.count_nonzero(values > threshold))
    return Histogram(
        edges=tuple(float(e) for e in edges),
        counts=tuple(int(c) for c in counts),
        zero_count=zero_count,
        threshold_line=threshold if threshold_line is None else threshold_line,
        above_threshold=above,
    )


def _above(diffs: TokenDiffs, rows: slice) -> int:
    """Active tokens of ``rows`` whose float64 |diff| is above the stored threshold."""
    above = diffs.abs_diff[rows].astype(np.float64) > diffs.threshold
    return int(np.count_nonzero(diffs.active_mask[rows] & above))


def _finite_active(diffs: TokenDiffs, rows: slice) -> np.ndarray:
    """The finite |diff| of the active tokens of ``rows``, in float64."""
    values = diffs.abs_diff[rows][diffs.active_mask[rows]].astype(np.float64)
    return values[np.isfinite(values)]


def drift_profile(
    comparison: Mapping[str, Any], diffs: TokenDiffs | None
) -> tuple[ProfilePoint, ...]:
    recorded = comparison.get("drift_profile")
    if isinstance(recorded, list) and all(isinstance(p, dict) for p in recorded):
        points = []
        for i, point in enumerate(recorded):
            position = as_int(point.get("position"))
            points.append(
                ProfilePoint(
                    position=position if position is not None else i,
                    active=as_int(point.get("active")) or 0,
                    mean_abs_diff=as_float(point.get("mean_abs_diff")),
                    max_abs_diff=as_float(point.get("max_abs_diff")),
                )
            )
        return tuple(points)
    if diffs is None or diffs.abs_diff.ndim != 2:
        return ()
    active = diffs.active_mask
    out = []
    for position in range(diffs.abs_diff.shape[1]):
        column = diffs.abs_diff[:, position][active[:, position]].astype(np.float64)
        out.append(
            ProfilePoint(
                position=position,
                active=int(column.size),
                mean_abs_diff=float(column.mean()) if column.size else None,
                max_abs_diff=float(column.max()) if column.size else None,
            )
        )
    return tuple(out)


def worst_tokens(
    diffs: TokenDiffs, decode: TokenDecoder | None, limit: int = WORST_TOKENS
) -> tuple[WorstToken, ...]:
    """The active tokens with the largest |diff|, worst first (ties by position)."""
    if diffs.abs_diff.ndim != 2:
        return ()
    shape = diffs.abs_diff.shape
    out = []
    for index in _worst_first(diffs, limit):
        batch, position = (int(v) for v in np.unravel_index(int(index), shape))
        if not diffs.active_mask[batch, position]:
            break
        token_id = int(diffs.token_ids[batch, position]) if diffs.token_ids is not None else None
        out.append(
            WorstToken(
                batch=batch,
                position=position,
                token_id=token_id,
                text=_decode(decode, token_id),
                rollout_logprob=float(diffs.rollout_logprobs[batch, position]),
                training_logprob=float(diffs.training_logprobs[batch, position]),
                abs_diff=float(diffs.abs_diff[batch, position]),
                mismatch=bool(diffs.mismatch_mask[batch, position]),
            )
        )
    return tuple(out)


def _worst_first(diffs: TokenDiffs, limit: int) -> list[int]:
    """The first ``limit`` flat indices of ``np.argsort(-scores, kind="stable")``, where a
    score is the |diff| of an active token (-inf elsewhere, +inf for NaN): the largest
    scores, ties by flat index. Found a block of rows at a time, each block's own first
    ``limit`` (a global winner is one of its block's), so no [B, T] sort is ever held."""
    if limit <= 0:
        return []
    width = diffs.abs_diff.shape[1]
    pool: list[tuple[float, int]] = []  # (-score, flat index) of each block's winners
    for rows in diffs.row_blocks():
        scores = np.where(diffs.active_mask[rows], diffs.abs_diff[rows], -np.inf)
        neg = -np.where(np.isnan(scores), np.inf, scores).ravel()
        if neg.size > limit:
            kth = np.partition(neg, limit - 1)[limit - 1]
            better = np.flatnonzero(neg < kth)
            tied = np.flatnonzero(neg == kth)[: limit - better.size]
            chosen = np.concatenate([better, tied])
        else:
            chosen = np.arange(neg.size)
        base = (rows.start or 0) * width
        pool.extend((float(neg[i]), base + int(i)) for i in chosen)
    return [index for _, index in sorted(pool)[:limit]]


def _decode(decode: TokenDecoder | None, token_id: int | None) -> str | None:
    if decode is None or token_id is None:
        return None
    try:
        return decode(token_id)
    except Exception:  # a decoder hook must never break the report
        return None


def recompute(
    comparison: Mapping[str, Any], diffs: TokenDiffs | None
) -> tuple[str, tuple[str, ...]]:
    """Recount mismatches offline from the token artifact; returns (summary, problems)."""
    if diffs is None:
        return "unavailable", ()
    problems: list[str] = []
    active = diffs.active_mask
    # in float64, as the stored diffs widen, a block of rows at a time
    recount = sum(_above(diffs, rows) for rows in diffs.row_blocks())
    stored = int(np.count_nonzero(active & diffs.mismatch_mask))
    recorded = as_int(comparison.get("mismatches"))
    recorded_threshold = as_float(comparison.get("threshold"))
    if recorded_threshold is not None and np.float32(recorded_threshold) != np.float32(
        diffs.threshold
    ):
        problems.append(
            f"comparison.json threshold {recorded_threshold:g} differs from the token "
            f"artifact's {diffs.threshold:g}"
        )
    if stored != recount:
        problems.append(f"mismatch_mask marks {stored} tokens, the threshold gives {recount}")
    if recorded is not None and recorded != recount:
        problems.append(f"comparison.json records {recorded} mismatches, recomputed {recount}")
    active_count = int(np.count_nonzero(active))
    recorded_active = as_int(comparison.get("active_tokens"))
    if recorded_active is not None and recorded_active != active_count:
        problems.append(
            f"comparison.json records {recorded_active} active tokens, the mask has {active_count}"
        )
    if problems:
        return "disagrees", tuple(problems)
    return f"agrees ({recount} mismatches of {active_count} active)", ()


def percent(value: float | None) -> str:
    return "—" if value is None else f"{100.0 * value:.2f}%"


def sci(value: float | None) -> str:
    if value is None:
        return "—"
    if value == 0:
        return "0"
    if not math.isfinite(value):
        return str(value)
    return f"{value:.3g}" if 1e-3 <= abs(value) < 1e4 else f"{value:.2e}"
