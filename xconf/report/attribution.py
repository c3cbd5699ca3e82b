"""Each knob's effect on drift against the baseline, with a bootstrap confidence interval,
the knob ranking, and the headline that names only what the intervals support.

The effect of a case is its mean |diff| over active tokens against the baseline's, on the
same frozen sequences (every case of an experiment scores the one frozen identity). Tokens
of one sequence are not independent (one prompt, one response, one KV history), so the
interval resamples whole *sequences*: ``RESAMPLES`` paired resamples of the sequence
indices, drawn by a generator with the fixed ``SEED`` (the same run gives the same interval
bit for bit), each giving ``sum_s case_abs(s) / sum_s active(s)`` minus the baseline's on
the same resampled sequences; the interval is the 2.5th and 97.5th percentile. A case whose
interval holds 0 is "same as baseline": the data cannot tell it apart from the baseline.

These are diagnostics: nothing here reads or changes a verdict.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from xconf.full_vocab import ARGMAX, KL_RT, KL_TR, TV, case_mean
from xconf.report.loader import TokenDiffs
from xconf.report.model import (
    AttributionRow,
    CaseReport,
    Effect,
    Headline,
    KnobRank,
)
from xconf.report.stats import percent, sci

CONFIDENCE = 0.95
RESAMPLES = 2000
SEED = 20260101
MIN_SEQUENCES = 2  # one sequence resamples to itself: no interval at all
SHIFT_EPS = 1e-12  # floor under max |diff| when comparing orders of magnitude
STATISTIC = "mean |diff| over active tokens"


@dataclass(frozen=True)
class SequenceSums:
    """Per sequence (row of the token artifact): the sum of active |diff| and the count."""

    abs_sum: np.ndarray  # float64 [S]
    active: np.ndarray  # int64 [S]
    mask: np.ndarray  # bool [B, T]: the pairing key (the same frozen tokens)


def sequence_sums(diffs: TokenDiffs | None) -> SequenceSums | None:
    """None when there is nothing to resample (no 2-D artifact, or a non-finite diff)."""
    if diffs is None or diffs.abs_diff.ndim != 2 or diffs.active_mask.shape != diffs.abs_diff.shape:
        return None
    mask = diffs.active_mask.astype(bool, copy=False)
    sums = []
    for rows in diffs.row_blocks():  # per row, so a block of rows at a time: the same sums
        values = np.where(mask[rows], diffs.abs_diff[rows].astype(np.float64), 0.0)
        if not np.isfinite(values).all():
            return None
        sums.append(values.sum(axis=1))
    abs_sum = np.concatenate(sums) if sums else np.zeros(0)
    return SequenceSums(abs_sum, mask.sum(axis=1).astype(np.int64), mask)


def effect(baseline: SequenceSums | None, case: SequenceSums | None) -> Effect | None:
    """The case's mean |diff| against the baseline's, paired over sequences; None when the
    two did not score the same active tokens (nothing to pair)."""
    if baseline is None or case is None or not np.array_equal(baseline.mask, case.mask):
        return None
    keep = baseline.active > 0  # sequences without an active token weigh nothing
    base, other, count = baseline.abs_sum[keep], case.abs_sum[keep], baseline.active[keep]
    n = int(keep.sum())
    if n == 0:
        return None
    base_mean = float(base.sum() / count.sum())
    case_mean = float(other.sum() / count.sum())
    ratio = case_mean / base_mean if base_mean > 0 else None
    if n < MIN_SEQUENCES:
        return Effect(STATISTIC, base_mean, case_mean, case_mean - base_mean, None, None,
                      ratio, None, None, n, 0, SEED, CONFIDENCE)  # fmt: skip
    rng = np.random.default_rng(SEED)
    picks = rng.integers(0, n, size=(RESAMPLES, n))
    weights = np.zeros((RESAMPLES, n), dtype=np.float64)
    np.add.at(weights, (np.arange(RESAMPLES)[:, None], picks), 1.0)
    tokens = weights @ count.astype(np.float64)
    base_b, case_b = weights @ base / tokens, weights @ other / tokens
    tail = (1.0 - CONFIDENCE) / 2
    low, high = (float(v) for v in np.quantile(case_b - base_b, [tail, 1.0 - tail]))
    ratio_low = ratio_high = None
    if ratio is not None and bool((base_b > 0).all()):
        ratio_low, ratio_high = (float(v) for v in np.quantile(case_b / base_b, [tail, 1.0 - tail]))
    return Effect(STATISTIC, base_mean, case_mean, case_mean - base_mean, low, high,
                  ratio, ratio_low, ratio_high, n, RESAMPLES, SEED, CONFIDENCE)  # fmt: skip


def distinguishable(e: Effect | None) -> bool:
    """The interval excludes "same as baseline" (and there is an interval at all)."""
    if e is None or e.delta_low is None or e.delta_high is None:
        return False
    return not e.delta_low <= 0.0 <= e.delta_high


def more_drift(e: Effect | None) -> bool:
    return distinguishable(e) and e is not None and e.delta > 0


def describe(e: Effect | None) -> str:
    """``×2.4 [1.8, 3.1]`` (ratio and interval), ``+3e-4 [1e-4, 5e-4]`` when the baseline
    mean is 0, prefixed ``≈ same`` when the interval holds the baseline."""
    if e is None:
        return "—"
    if e.delta_low is None or e.delta_high is None:
        return f"{_point(e)} (no interval: {e.sequences} sequence)"
    if e.ratio is not None and e.ratio_low is not None and e.ratio_high is not None:
        text = f"×{e.ratio:.3g} [{e.ratio_low:.3g}, {e.ratio_high:.3g}]"
    else:
        text = f"{e.delta:+.2e} [{e.delta_low:+.2e}, {e.delta_high:+.2e}]"
    return text if distinguishable(e) else f"≈ same {text}"


def _point(e: Effect) -> str:
    return f"×{e.ratio:.3g}" if e.ratio is not None else f"{e.delta:+.2e}"


def attribution_row(
    case: CaseReport, baseline: CaseReport | None, case_effect: Effect | None
) -> AttributionRow:
    base_max = baseline.diff.max if baseline else None
    base_ratio = baseline.mismatch_ratio if baseline else None
    shift = None
    if (
        case.diff.max is not None
        and base_max is not None
        and math.isfinite(case.diff.max)
        and math.isfinite(base_max)
    ):
        shift = math.log10((case.diff.max + SHIFT_EPS) / (base_max + SHIFT_EPS))
    delta = None
    if case.mismatch_ratio is not None and base_ratio is not None:
        delta = case.mismatch_ratio - base_ratio
    return AttributionRow(
        case_id=case.case_id,
        knobs=tuple(path for path, _ in case.changed),
        label=case.label,
        kind=case.kind,
        result=case.result,
        baseline_max_abs_diff=base_max,
        max_abs_diff=case.diff.max,
        baseline_mismatch_ratio=base_ratio,
        mismatch_ratio=case.mismatch_ratio,
        delta_mismatch_ratio=delta,
        log10_shift=shift,
        threshold=case.threshold,
        effect=case_effect,
        kl_rollout_training=case_mean(case.full_vocab, KL_RT),
        kl_training_rollout=case_mean(case.full_vocab, KL_TR),
        total_variation=case_mean(case.full_vocab, TV),
        top10_overlap=case_mean(case.full_vocab, "top10_overlap"),
        argmax_agreement=case_mean(case.full_vocab, ARGMAX),
    )


def _order(row: AttributionRow) -> tuple[int, float]:
    """Cases whose interval shows more drift first, by how much; then the others."""
    e = row.effect
    return (0 if more_drift(e) else 1, -(e.delta if e is not None else -math.inf))


def ordered(rows: Iterable[AttributionRow]) -> tuple[AttributionRow, ...]:
    return tuple(sorted(rows, key=lambda r: (*_order(r), r.label)))


def rank_knobs(rows: Sequence[AttributionRow]) -> tuple[KnobRank, ...]:
    """One rank per knob (or pair), represented by its case that moves drift most."""
    groups: dict[str, list[AttributionRow]] = {}
    for row in ordered(rows):
        groups.setdefault(" × ".join(row.knobs) if row.knobs else row.label, []).append(row)
    ranked = sorted(groups.items(), key=lambda kv: (*_order(kv[1][0]), kv[0]))
    return tuple(
        KnobRank(
            rank=i + 1,
            knob=name,
            case_ids=tuple(m.case_id for m in members),
            worst_case_id=members[0].case_id,
            results=tuple(sorted({m.result for m in members})),
            max_abs_diff=members[0].max_abs_diff,
            mismatch_ratio=members[0].mismatch_ratio,
            delta_mismatch_ratio=members[0].delta_mismatch_ratio,
            log10_shift=members[0].log10_shift,
            effect=members[0].effect,
            label=members[0].label,
        )
        for i, (name, members) in enumerate(ranked)
    )


def headline(
    baseline: CaseReport | None,
    rows: Sequence[AttributionRow],
    ranking: Sequence[KnobRank],
) -> Headline:
    """What the report says first: a failing baseline before anything else, then the knob
    that moves drift most, only when its interval tells it apart from the baseline."""
    lines: list[str] = []
    fails = baseline is not None and baseline.result == "fail"
    under: tuple[str, ...] = ()
    if baseline is None:
        lines.append("no baseline case: no knob can be set against one")
    elif fails:
        lines.append(
            f"baseline fails: {baseline.mismatches} of {baseline.active_tokens} active tokens "
            f"over the threshold {sci(baseline.threshold)} (max |diff| {sci(baseline.diff.max)}); "
            "every case starts from its drift"
        )
        # Judged at the baseline's own threshold: a bfloat16 case that passes at bfloat16's
        # looser threshold has not brought the float32 baseline under anything.
        under = tuple(
            r.label for r in rows if r.result == "pass" and r.threshold == baseline.threshold
        )
        if not rows:
            lines.append("no intervention was run: nothing to bring it under the threshold")
        else:
            lines.append(
                "brings it under the threshold: " + ", ".join(under)
                if under
                else "no knob brings it under the threshold"
            )
    elif baseline.result != "pass":
        lines.append(
            f"baseline is {baseline.result}"
            + (f" ({baseline.reason})" if baseline.reason else "")
            + ": knob effects need a scored baseline"
        )
    top = ranking[0] if ranking else None
    named = top.knob if top is not None and more_drift(top.effect) else None
    if named is not None and top is not None and top.effect is not None:
        lines.append(
            f"most drift: {top.label}  {STATISTIC} {describe(top.effect)} against the baseline "
            f"({top.effect.confidence:.0%} interval over {top.effect.sequences} sequences)"
            f"; max |diff| {sci(top.max_abs_diff)}, mismatches {percent(top.mismatch_ratio)}"
        )
    elif rows:
        counted = {r.effect.sequences for r in rows if r.effect is not None}
        over = f" over {max(counted)} sequences" if counted else ""
        lines.append(
            "most drift: no knob moves drift distinguishably beyond the baseline's (every "
            f"{CONFIDENCE:.0%} interval{over} includes the baseline)"
        )
    return Headline(
        baseline_fails=fails,
        under_threshold=under,
        most_drift=named,
        most_drift_case_id=top.worst_case_id if named is not None and top else None,
        lines=tuple(lines),
    )
