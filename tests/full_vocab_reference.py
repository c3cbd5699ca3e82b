"""The full-vocabulary figures computed independently: numpy float64, no xconf import.

The referee of ``xconf/full_vocab.py``: the same definitions written from their formulas
(KL both ways, total variation, top-k overlap, argmax agreement), on the rows as stored.
"""

from __future__ import annotations

import numpy as np


def log_softmax(rows: np.ndarray) -> np.ndarray:
    x = rows.astype(np.float64)
    top = np.max(x, axis=-1, keepdims=True)
    shifted = x - top
    return shifted - np.log(np.sum(np.exp(shifted), axis=-1, keepdims=True))


def _kl(logp: np.ndarray, logq: np.ndarray) -> np.ndarray:
    p = np.exp(logp)
    with np.errstate(invalid="ignore"):
        terms = np.where(p > 0, p * (logp - logq), 0.0)
    return terms.sum(-1)


def _topk(logp: np.ndarray, k: int) -> list[set[int]]:
    order = np.argsort(-logp, axis=-1, kind="stable")[:, :k]
    return [set(int(i) for i in row) for row in order]


def figures(rollout: np.ndarray, training: np.ndarray) -> dict[str, np.ndarray]:
    """Per row: every figure, float64."""
    r, t = log_softmax(rollout), log_softmax(training)
    out = {
        "kl_rollout_training": _kl(r, t),
        "kl_training_rollout": _kl(t, r),
        "total_variation": 0.5 * np.abs(np.exp(r) - np.exp(t)).sum(-1),
        "argmax_agrees": (np.argmax(r, -1) == np.argmax(t, -1)).astype(np.float64),
    }
    for k in (1, 10):
        a, b = _topk(r, k), _topk(t, k)
        out[f"top{k}_overlap"] = np.array([len(x & y) / k for x, y in zip(a, b, strict=True)])
    return out


def per_sequence(values: dict[str, np.ndarray], active: np.ndarray) -> list[dict[str, float]]:
    """Each sequence's mean of each figure (rows taken row-major over ``active`` [B, T])."""
    counts = active.astype(bool).sum(1)
    out, start = [], 0
    for count in counts:
        if count:
            out.append({k: float(v[start : start + count].mean()) for k, v in values.items()})
        start += int(count)
    return out
