"""The per-sequence view: each sequence as text, and the worst sequences.

:func:`sequences`: the prompt, then every response token with its |diff|; only built when a
tokenizer is at hand (see :mod:`xconf.report.tokens`). The prompt is known when the
identity is in the runner's teacher-forcing layout (``selected_token_ids`` is ``token_ids``
shifted by one); a judged dump carries only the response.

:func:`worst_sequences`: the sequences with the largest |sequence log-ratio| (the sum of
``training - rollout`` over the row: verl's sequence-level importance log-weight) and those
with the most mismatches, with their response text when token ids and a tokenizer exist.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from xconf.report.loader import TokenDiffs
from xconf.report.model import SequenceDrift, SequenceText
from xconf.report.tokens import TokenDecoder

MAX_SEQUENCES = 32
MAX_TOKENS = 512
WORST_SEQUENCES = 5
TEXT_TOKENS = 64  # response tokens decoded per worst sequence


def _decode(decode: TokenDecoder, ids: Sequence[int]) -> str:
    out = []
    for token in ids:
        try:
            out.append(decode(int(token)))
        except Exception:  # a decoder must never break the report
            out.append(f"<{int(token)}>")
    return "".join(out)


def _rows(identity: Mapping[str, Any], key: str) -> list[list[int]]:
    rows = identity.get(key)
    return rows if isinstance(rows, list) else []


def sequences(
    identity: Mapping[str, Any], diffs: TokenDiffs, decode: TokenDecoder | None
) -> tuple[SequenceText, ...]:
    if decode is None or diffs.token_ids is None or diffs.abs_diff.ndim != 2:
        return ()
    tokens = _rows(identity, "token_ids")
    selected = _rows(identity, "selected_token_ids")
    out = []
    for b in range(min(diffs.abs_diff.shape[0], MAX_SEQUENCES)):
        active = [int(t) for t in diffs.active_mask[b].nonzero()[0]][:MAX_TOKENS]
        if not active:
            continue
        prompt = ""
        if b < len(tokens) and b < len(selected):
            row, sel = tokens[b], selected[b]
            if len(row) == len(sel) and all(
                sel[t] == row[t + 1] for t in active if t + 1 < len(row)
            ):
                prompt = _decode(decode, row[: active[0] + 1])
        out.append(
            SequenceText(
                batch=b,
                prompt=prompt,
                tokens=tuple(
                    (
                        _decode(decode, [int(diffs.token_ids[b, t])]),
                        float(diffs.abs_diff[b, t]),
                        bool(diffs.mismatch_mask[b, t]),
                    )
                    for t in active
                ),
            )
        )
    return tuple(out)


def _finite(value: float) -> float | None:
    return float(value) if np.isfinite(value) else None


def _row_figures(
    diffs: TokenDiffs, active: np.ndarray, rows: slice
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(active count, sum of training - rollout, mismatches, max |diff|) of each of ``rows``."""
    live = active[rows]
    training = diffs.training_logprobs[rows].astype(np.float64)
    delta = np.where(live, training - diffs.rollout_logprobs[rows].astype(np.float64), 0.0)
    mismatches = (diffs.mismatch_mask[rows].astype(bool, copy=False) & live).sum(axis=1)
    peak = np.where(live, diffs.abs_diff[rows].astype(np.float64), -np.inf).max(axis=1)
    return live.sum(axis=1), delta.sum(axis=1), mismatches, peak


def worst_sequences(
    diffs: TokenDiffs, decode: TokenDecoder | None, limit: int = WORST_SEQUENCES
) -> tuple[tuple[SequenceDrift, ...], tuple[SequenceDrift, ...]]:
    """(worst by |sequence log-ratio|, worst by mismatches), each worst first; rows with no
    active token are left out, and only rows with a mismatch rank by mismatches."""
    if diffs.abs_diff.ndim != 2:
        return (), ()
    active = diffs.active_mask.astype(bool, copy=False)
    # Per row, in float64, a block of rows at a time: a row's sums are the same whichever
    # rows are reduced beside it.
    parts = [_row_figures(diffs, active, rows) for rows in diffs.row_blocks()]
    if not parts:  # no row at all
        return (), ()
    counts, log_ratio, mismatches, peak = (np.concatenate(p) for p in zip(*parts, strict=True))
    rows = [b for b in range(active.shape[0]) if counts[b] > 0]

    def size(b: int) -> float:  # a NaN ratio is as bad as it gets
        value = abs(float(log_ratio[b]))
        return np.inf if np.isnan(value) else value

    def record(b: int) -> SequenceDrift:
        text = None
        if decode is not None and diffs.token_ids is not None:
            positions = np.flatnonzero(active[b])[:TEXT_TOKENS]
            text = _decode(decode, [int(diffs.token_ids[b, t]) for t in positions])
        return SequenceDrift(
            batch=b,
            active=int(counts[b]),
            log_ratio=_finite(log_ratio[b]),
            mean_log_ratio=_finite(log_ratio[b] / counts[b]),
            mismatches=int(mismatches[b]),
            max_abs_diff=_finite(peak[b]),
            text=text,
        )

    by_ratio = sorted(rows, key=lambda b: (-size(b), b))[:limit]
    failing = [b for b in rows if mismatches[b] > 0]
    by_mismatches = sorted(failing, key=lambda b: (-int(mismatches[b]), -float(peak[b]), b))
    return (
        tuple(record(b) for b in by_ratio),
        tuple(record(b) for b in by_mismatches[:limit]),
    )
