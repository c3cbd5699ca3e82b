"""The report's figures on the stored float32 arrays, a block of rows at a time, are bit for
bit those it computed on whole float64 copies (the formulas before, kept here to compare)."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from xconf.report import attribution, loader, sequences, stats
from xconf.report.loader import TokenDiffs
from xconf.report.model import DiffStats, Histogram, SequenceDrift


def _stored(seed: int, rows: int = 29, width: int = 41) -> TokenDiffs:
    """float32 token diffs with what breaks naive code: ties, exact zeros, a NaN and an inf
    among the active tokens, NaN and -inf where inactive, rows with no active token."""
    rng = np.random.default_rng(seed)
    active = rng.random((rows, width)) > 0.25
    active[[2, 17]] = False
    rollout = (-rng.random((rows, width)) * 6).astype(np.float32)
    training = (rollout + rng.normal(0, 3e-2, (rows, width))).astype(np.float32)
    training[rng.random((rows, width)) < 0.2] = rollout[rng.random((rows, width)) < 0.2][0]
    abs_diff = np.abs(training - rollout).astype(np.float32)
    abs_diff[rng.random((rows, width)) < 0.15] = 0.0
    abs_diff[rng.random((rows, width)) < 0.1] = np.float32(0.03125)  # ties
    abs_diff[5, 3], abs_diff[9, 8] = np.nan, np.inf
    active[5, 3] = active[9, 8] = True
    abs_diff[~active] = np.nan
    rollout[~active] = -np.inf
    mismatch = active & (abs_diff > np.float32(1e-2))
    return TokenDiffs(rollout, training, active, abs_diff, mismatch, float(np.float32(1e-2)), None)


def _widened(diffs: TokenDiffs) -> TokenDiffs:
    """The arrays as the loader held them before: float64 copies."""
    return replace(
        diffs,
        rollout_logprobs=diffs.rollout_logprobs.astype(np.float64),
        training_logprobs=diffs.training_logprobs.astype(np.float64),
        abs_diff=diffs.abs_diff.astype(np.float64),
    )


def _histogram_before(diffs: TokenDiffs) -> Histogram | None:
    values = diffs.abs_diff[diffs.active_mask]
    values = values[np.isfinite(values)]
    if values.size == 0:
        return None
    threshold = diffs.threshold
    nonzero = values[values > 0]
    candidates = [threshold] if threshold > 0 else []
    low_src = [*candidates, float(nonzero.min())] if nonzero.size else candidates or [1e-12]
    high_src = [*candidates, float(nonzero.max())] if nonzero.size else candidates or [1.0]
    low = math.floor(math.log10(min(low_src))) - (0 if nonzero.size else 1)
    high = math.ceil(math.log10(max(high_src)) + 1e-12)
    high = low + 1 if high <= low else high
    low = max(low, high - stats.MAX_DECADES)
    edges = np.logspace(low, high, (high - low) * stats.BINS_PER_DECADE + 1)
    counts, _ = np.histogram(np.clip(nonzero, edges[0], edges[-1]), bins=edges)
    return Histogram(
        tuple(float(e) for e in edges),
        tuple(int(c) for c in counts),
        int(values.size - nonzero.size),
        threshold,
        int(np.count_nonzero(values > threshold)),
    )


def _worst_before(diffs: TokenDiffs, limit: int) -> list[tuple[int, int]]:
    scores = np.where(diffs.active_mask, diffs.abs_diff, -np.inf)
    scores = np.where(np.isnan(scores), np.inf, scores)
    flat = np.argsort(-scores, axis=None, kind="stable")[:limit]
    out = []
    for index in flat:
        b, t = (int(v) for v in np.unravel_index(int(index), scores.shape))
        if not diffs.active_mask[b, t]:
            break
        out.append((b, t))
    return out


def _sequences_before(diffs: TokenDiffs) -> tuple[np.ndarray, ...]:
    active = diffs.active_mask.astype(bool)
    delta = diffs.training_logprobs.astype(np.float64) - diffs.rollout_logprobs.astype(np.float64)
    delta = np.where(active, delta, 0.0)
    peak = np.where(active, diffs.abs_diff.astype(np.float64), -np.inf).max(axis=1)
    mismatches = (diffs.mismatch_mask.astype(bool) & active).sum(axis=1)
    return active.sum(axis=1), delta.sum(axis=1), mismatches, peak


@pytest.fixture(params=[1, 3, 1 << 20], ids=["a-row-a-block", "three-row-blocks", "one-block"])
def block_rows(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.setattr(loader, "BLOCK_TOKENS", request.param * 41)
    return int(request.param)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_figure_is_the_whole_float64_arrays_figure(seed: int, block_rows: int) -> None:
    stored = _stored(seed)
    before = _widened(stored)
    assert len(stored.row_blocks()) == -(-29 // min(block_rows, 29))
    assert stats.histogram(stored) == _histogram_before(before)
    for limit in (1, 7, 10, 2000):
        got = [(w.batch, w.position) for w in stats.worst_tokens(stored, None, limit)]
        assert got == _worst_before(before, limit), limit
    worst = stats.worst_tokens(stored, None)
    shown = [w.abs_diff for w in worst]
    want = [float(before.abs_diff[w.batch, w.position]) for w in worst]
    assert np.array_equal(np.array(shown, dtype=float), want, equal_nan=True)
    # per row: the sequences' figures, the attribution's sums
    counts, log_ratio, mismatches, peak = _sequences_before(before)
    by_ratio, by_mismatches = sequences.worst_sequences(stored, None, limit=40)
    for drift in (*by_ratio, *by_mismatches):
        b = drift.batch
        assert drift == SequenceDrift(
            b,
            int(counts[b]),
            sequences._finite(log_ratio[b]),
            sequences._finite(log_ratio[b] / counts[b]),
            int(mismatches[b]),
            sequences._finite(peak[b]),
            None,
        )
    assert [d.batch for d in by_ratio] == [
        d.batch for d in sequences.worst_sequences(before, None, 40)[0]
    ]
    finite = replace(stored, abs_diff=np.nan_to_num(stored.abs_diff, nan=0.0, posinf=1.0))
    sums = attribution.sequence_sums(finite)
    assert sums is not None
    widened = np.where(finite.active_mask, finite.abs_diff.astype(np.float64), 0.0)
    assert np.array_equal(sums.abs_sum, widened.sum(axis=1))
    assert attribution.sequence_sums(stored) is None  # a non-finite diff: nothing to resample
    # the offline recount, and the diagnostics when the comparison recorded none
    assert stats.recompute({}, stored) == stats.recompute({}, before)
    values = before.abs_diff[before.active_mask]
    finite_values = finite.abs_diff[finite.active_mask].astype(np.float64)
    p50, p90, p99 = (float(v) for v in np.quantile(finite_values, [0.5, 0.9, 0.99]))
    assert stats.diff_stats({}, finite) == DiffStats(
        float(finite_values.mean()), p50, p90, p99, float(finite_values.max())
    )
    assert values.dtype == np.float64


def test_all_ties_and_no_active_row() -> None:
    """Identical sides (every |diff| 0) tie everywhere: the first positions win, in order."""
    zeros = np.zeros((6, 9), dtype=np.float32)
    active = np.ones((6, 9), dtype=bool)
    active[0] = False
    diffs = TokenDiffs(zeros, zeros, active, zeros, np.zeros_like(active), 1e-5, None)
    assert [(w.batch, w.position) for w in stats.worst_tokens(diffs, None, 4)] == [
        (1, 0),
        (1, 1),
        (1, 2),
        (1, 3),
    ]
    assert stats.histogram(diffs) == _histogram_before(_widened(diffs))
    empty = TokenDiffs(zeros[:0], zeros[:0], active[:0], zeros[:0], active[:0], 1e-5, None)
    assert sequences.worst_sequences(empty, None) == ((), ())
    assert stats.worst_tokens(empty, None) == ()
