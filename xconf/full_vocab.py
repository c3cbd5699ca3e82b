"""Full-vocabulary figures: how far the two sides' whole next-token distributions differ.

Two engines can agree on the sampled token's log-probability and disagree on the rest of the
distribution, which is what the next sample draws from. From each side's full logits rows
(``[N, V]`` tensors, one row per scored position, in the same order on both sides) this
module gives, per position, in float64:

- ``kl_rollout_training``: KL(rollout ‖ training) = Σ p_r (log p_r − log p_t), in nats;
- ``kl_training_rollout``: KL(training ‖ rollout), the reverse;
- ``total_variation``: ½ Σ |p_r − p_t|;
- ``top1_overlap``, ``top10_overlap``: |top-k(rollout) ∩ top-k(training)| / k;
- ``argmax_agrees``: 1.0 where the two argmaxes are the same token, else 0.0;

then the per-sequence means and the case's figures (:func:`summarize`). Each row is
normalized on its own side (``log_softmax`` in float64), so rows may be raw logits or
log-probabilities alike. They are figures, never votes: the contract's selected-token
verdict (``xconf/comparison.py``) is the only verdict.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

SCHEMA = "xconf.full_vocab.v1"
TOP_K = (1, 10)
KL_RT = "kl_rollout_training"
KL_TR = "kl_training_rollout"
TV = "total_variation"
ARGMAX = "argmax_agrees"
# Per position, in this order (the per-position tensors' names).
FIGURES: tuple[str, ...] = (KL_RT, KL_TR, TV, *(f"top{k}_overlap" for k in TOP_K), ARGMAX)
# Rows per float64 block: 128 rows of a 49,152-token vocabulary are ~50 MB a temporary.
BLOCK_ROWS = 128
MAX_WORKERS = 2


class RowsError(ValueError):
    """The two sides' rows cannot be compared (shape or dtype); the figures say why."""


def _kl(p: torch.Tensor, logratio: torch.Tensor, logp: torch.Tensor, logq: torch.Tensor) -> Any:
    """Σ p · logratio per row (logratio = log p − log q). A term with p = 0 is 0: a row where
    ``-inf`` made a term NaN (0 · −inf) is summed again term by term."""
    kl = torch.linalg.vecdot(p, logratio)
    bad = kl.isnan()
    if bool(bad.any()):
        rows = bad.nonzero().flatten()
        terms = p[rows] * (logp[rows] - logq[rows])
        kl[rows] = torch.where(p[rows] > 0, terms, torch.zeros((), dtype=p.dtype)).sum(-1)
    return kl


def _members(rows: torch.Tensor, k: int) -> torch.Tensor:
    """[n, V] bool: each row's top-``k`` tokens, ties at the k-th value broken by the lowest
    token id (a bfloat16 engine's rows hold many exact ties). ``log_softmax`` keeps each
    row's order and its ties (one constant subtracted), so the raw rows give the same set."""
    k = min(k, rows.shape[-1])
    kth = rows.topk(k, dim=-1).values[:, -1:]
    above = rows > kth
    equal = rows == kth
    room = k - above.sum(-1, keepdim=True)
    return above | (equal & (equal.cumsum(-1) <= room))


def _overlap_by_masks(a: torch.Tensor, b: torch.Tensor, k: int) -> torch.Tensor:
    """[n] int64: how many tokens the two rows' top-``k`` sets share (the whole-row rule)."""
    return (_members(a, k) & _members(b, k)).sum(-1)


class _Tops:
    """One side's sorted top ``kmax + 1`` values and ids of a block of rows: where the k-th
    value is strictly above the (k+1)-th (so no NaN among them, NaN sorting first), the
    first ``k`` ids are the row's whole top-``k`` set, with no tie to break, and the row's
    argmax is id 0 when k = 1; other rows take the whole-row rule."""

    def __init__(self, rows: torch.Tensor, kmax: int) -> None:
        self.rows = rows
        self.values, self.ids = rows.topk(kmax + 1, dim=-1)

    def clear(self, k: int) -> torch.Tensor:
        return self.values[:, k - 1] > self.values[:, k]


def _overlap(a: _Tops, b: _Tops, k: int) -> torch.Tensor:
    """The share of the top-``k`` sets, as :func:`_overlap_by_masks` gives it, bit for bit:
    the rows whose two sets are clear are counted from their ids, the rest from masks."""
    clear = a.clear(k) & b.clear(k)
    shared = (a.ids[:, :k, None] == b.ids[:, None, :k]).sum((1, 2))
    if not bool(clear.all()):
        rest = (~clear).nonzero().flatten()
        shared[rest] = _overlap_by_masks(a.rows[rest], b.rows[rest], k)
    return shared.to(torch.float64) / k


def _argmax_agrees(a: _Tops, b: _Tops) -> torch.Tensor:
    """1.0 where ``argmax`` of the two rows is the same token (torch.argmax: the first
    maximal index, NaN counting as maximal): a row with one clear maximum has it as id 0."""
    clear = a.clear(1) & b.clear(1)
    agrees = a.ids[:, 0] == b.ids[:, 0]
    if not bool(clear.all()):
        rest = (~clear).nonzero().flatten()
        agrees[rest] = a.rows[rest].argmax(-1) == b.rows[rest].argmax(-1)
    return agrees.to(torch.float64)


def _top_figures(raw_r: torch.Tensor, raw_t: torch.Tensor) -> dict[str, torch.Tensor]:
    """The top-k overlaps and argmax agreement of a block of raw rows."""
    vocab = raw_r.shape[-1]
    if max(TOP_K) >= vocab:  # no (k+1)-th value to compare with: the whole-row rule
        out = {
            f"top{k}_overlap": _overlap_by_masks(raw_r, raw_t, min(k, vocab)).to(torch.float64)
            / min(k, vocab)
            for k in TOP_K
        }
        out[ARGMAX] = (raw_r.argmax(-1) == raw_t.argmax(-1)).to(torch.float64)
        return out
    a, b = _Tops(raw_r, max(TOP_K)), _Tops(raw_t, max(TOP_K))
    out = {f"top{k}_overlap": _overlap(a, b, k) for k in TOP_K}
    out[ARGMAX] = _argmax_agrees(a, b)
    return out


def position_figures(rollout: torch.Tensor, training: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per position (row), every figure of :data:`FIGURES` as float64 ``[N]``."""
    if rollout.ndim != 2 or rollout.shape != training.shape:
        raise RowsError(
            f"rollout rows {tuple(rollout.shape)} and training rows {tuple(training.shape)} "
            "are not one [positions, vocab] layout"
        )
    if not (rollout.is_floating_point() and training.is_floating_point()):
        raise RowsError(f"rows are {rollout.dtype} and {training.dtype}, not floating point")
    n = rollout.shape[0]
    out = {name: torch.empty(n, dtype=torch.float64) for name in FIGURES}

    def block(start: int) -> None:
        stop = min(start + BLOCK_ROWS, n)
        for name, values in _block_figures(rollout[start:stop], training[start:stop]).items():
            out[name][start:stop] = values

    # Blocks are independent (each row's figures are that row's alone) and each writes its
    # own slices, so blocks on parallel threads give the serial figures bit for bit: every
    # op runs at the process's intra-op thread count (torch's threads follow the global
    # setting), only several blocks at once. An in-process vLLM engine sets that count to
    # 1, which leaves a core idle here without the threads.
    starts = range(0, n, BLOCK_ROWS)
    workers = min(_workers(), len(starts))
    if workers <= 1:
        for start in starts:
            block(start)
    else:
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="full-vocab") as pool:
            for _ in pool.map(block, starts):  # re-raises a block's error here
                pass
    return out


def _workers() -> int:
    """Blocks computed at once: the CPUs this process may run on, at most
    :data:`MAX_WORKERS` (each block's float64 temporaries are ~300 MB)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return max(1, min(cpus, MAX_WORKERS))


def _block_figures(raw_r: torch.Tensor, raw_t: torch.Tensor) -> dict[str, torch.Tensor]:
    """Every figure of one block of rows."""
    out: dict[str, torch.Tensor] = {}
    r = raw_r.to(torch.float64).log_softmax(-1)
    t = raw_t.to(torch.float64).log_softmax(-1)
    d = r - t
    pr, pt = r.exp(), t.exp()
    out[KL_RT] = _kl(pr, d, r, t)
    out[KL_TR] = _kl(pt, d.neg_(), t, r)
    del d
    out[TV] = pr.sub_(pt).abs_().sum(-1).mul_(0.5)
    del pr, pt, r, t
    # torch.argmax gives the first maximal index: the top-1 tie rule (lowest id).
    out.update(_top_figures(raw_r, raw_t))
    return out


def _means(figures: Mapping[str, torch.Tensor]) -> dict[str, float]:
    return {name: float(values.mean()) for name, values in figures.items()}


def summarize(figures: Mapping[str, torch.Tensor], active_mask: torch.Tensor) -> dict[str, Any]:
    """The case's figures and each sequence's, from the per-position figures of the active
    tokens of ``active_mask`` ([B, T], taken row by row: the order of the rows)."""
    active = active_mask.bool()
    per_row = active.sum(1).tolist()
    positions = int(sum(per_row))
    if any(v.shape != (positions,) for v in figures.values()):
        raise RowsError(f"figures of {positions} active positions expected")
    case: dict[str, Any] = {
        "positions": positions,
        "mean": _means(figures),
        "max": {name: float(figures[name].max()) for name in (KL_RT, KL_TR, TV)},
    }
    sequences, start = [], 0
    for b, count in enumerate(per_row):
        if count:
            part = {name: v[start : start + count] for name, v in figures.items()}
            sequences.append({"batch": b, "positions": int(count), "mean": _means(part)})
        start += count
    return {"schema": SCHEMA, "available": True, "case": case, "sequences": sequences}


def case_mean(section: Any, name: str) -> float | None:
    """The case's mean of figure ``name`` from a stored ``full_vocab`` section (None: the
    section is missing, unavailable or malformed)."""
    if not isinstance(section, Mapping) or section.get("available") is not True:
        return None
    value = ((section.get("case") or {}).get("mean") or {}).get(name)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def unavailable(reason: str) -> dict[str, Any]:
    """The figures' section when the rows are missing on a side or cannot be compared."""
    return {"schema": SCHEMA, "available": False, "reason": reason}


def full_vocab_figures(
    rollout: torch.Tensor | None, training: torch.Tensor | None, active_mask: torch.Tensor
) -> dict[str, Any]:
    """The ``full_vocab`` section of a comparison, from each side's rows of the active tokens
    of ``active_mask`` (None: that side kept no rows; the section then says so)."""
    if rollout is None or training is None:
        missing = [n for n, rows in (("rollout", rollout), ("training", training)) if rows is None]
        return unavailable(f"no full-vocabulary rows from the {' and '.join(missing)} side")
    active = active_mask.bool()
    count = int(active.sum())
    if rollout.shape[:1] != (count,):
        return unavailable(f"{tuple(rollout.shape)} rollout rows for {count} active positions")
    try:
        return summarize(position_figures(rollout, training), active)
    except RowsError as exc:
        return unavailable(str(exc))
