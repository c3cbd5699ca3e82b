"""The rollout-vs-training figures verl logs, under verl's names, as verl computes them.

The one owner of these figures: ``xconf judge``, every scored case and the in-loop API take
them from here. The stable entry point is :func:`verl_figures`::

    from xconf.rollout_correction import Correction, verl_figures

    figures = verl_figures(rollout_log_probs, old_log_probs, response_mask)
    # {"rollout_corr/kl": ..., "rollout_corr/k3_kl": ..., ...,
    #  "training/rollout_probs_diff_max": ..., "training/rollout_actor_probs_pearson_corr": ...}
    figures = verl_figures(r, t, m, correction=Correction(rollout_is="token"))
    # ... plus "rollout_corr/rollout_is_mean", "rollout_corr/rollout_is_eff_sample_size", ...

Tensors are [B, T] (rollout log-probs, training log-probs, the response mask); nothing is
copied to another dtype or device, so the numbers are the ones verl puts on the user's
dashboard (float32 rounding, float32 overflow and all). :func:`exact_figures` gives the same
definitions in float64 under the same names. :data:`FIGURES` says what each figure is and its
space (nats or probability). None of them ever votes on a verdict.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from xconf.rollout_correction.catalog import FIGURES, Figure
from xconf.rollout_correction.offpolicy import (
    DEBUG,
    EPS,
    OFFPOLICY,
    SAFETY_BOUND,
    exact,
    verl_debug,
    verl_offpolicy,
)
from xconf.rollout_correction.weights import (
    Correction,
    CorrectionError,
    check_correction,
    correction_figures,
)

__all__ = [
    "DEBUG",
    "EPS",
    "FIGURES",
    "METRICS",
    "OFFPOLICY",
    "PREFIX",
    "SAFETY_BOUND",
    "SCHEMA",
    "Correction",
    "CorrectionError",
    "Figure",
    "exact_figures",
    "rollout_correction",
    "verl_figures",
]

PREFIX = "rollout_corr/"
SCHEMA = "xconf.rollout_correction.v2"
METRICS = OFFPOLICY  # the 13 rollout_corr/ off-policy figures (short names): report columns


def _check(rollout: torch.Tensor, training: torch.Tensor, mask: torch.Tensor) -> str | None:
    if rollout.dim() != 2 or rollout.shape != training.shape or rollout.shape != mask.shape:
        return "shapes differ"
    if not bool(mask.bool().any()):
        return "no active token"
    return None


def verl_figures(
    rollout_log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    correction: Correction | None = None,
) -> dict[str, float]:
    """Every figure verl 0.9.1 logs for these tensors, flat, under verl's full names.

    ``rollout_corr/<name>`` for the 13 off-policy figures (:data:`OFFPOLICY`, nats or
    perplexity), the 5 ``training/rollout_probs_diff_*`` / Pearson figures (:data:`DEBUG`,
    **probability** space) and, when ``correction`` configures IS or RS, verl's
    ``rollout_corr/rollout_is_*`` / ``rollout_corr/rollout_rs_*`` figures. Values are Python
    floats and may be ``inf`` or NaN exactly where verl's are. With no active token only the
    debug figures come back (valid 0, the rest NaN), as verl reports them; verl raises for
    the others. Raises :class:`ValueError` when the shapes differ and
    :class:`CorrectionError` for IS/RS settings verl would refuse.
    """
    problem = _check(rollout_log_probs, old_log_probs, response_mask)
    if problem == "shapes differ":
        raise ValueError(
            f"rollout {tuple(rollout_log_probs.shape)}, training {tuple(old_log_probs.shape)} "
            f"and mask {tuple(response_mask.shape)} must be the same [B, T]"
        )
    with torch.no_grad():
        out: dict[str, float] = {}
        if problem is None:
            if correction is not None and correction.configured:
                check_correction(correction)
                figures = correction_figures(
                    rollout_log_probs, old_log_probs, response_mask, correction
                )
                out.update({PREFIX + k: v for k, v in figures.items()})
            offpolicy = verl_offpolicy(rollout_log_probs, old_log_probs, response_mask)
            out.update({PREFIX + k: v for k, v in offpolicy.items()})
        out.update(verl_debug(rollout_log_probs, old_log_probs, response_mask))
    return out


def exact_figures(
    rollout_log_probs: torch.Tensor, old_log_probs: torch.Tensor, response_mask: torch.Tensor
) -> dict[str, float]:
    """The off-policy and debug figures in float64 (exact counts, non-empty rows only),
    under the same names as :func:`verl_figures`; empty when no token is active."""
    if _check(rollout_log_probs, old_log_probs, response_mask) is not None:
        return {}
    with torch.no_grad():
        offpolicy, debug = exact(rollout_log_probs, old_log_probs, response_mask)
    return {**{PREFIX + k: v for k, v in offpolicy.items()}, **debug}


def _finite(values: dict[str, float], non_finite: list[str], where: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in values.items():
        if math.isfinite(value):
            out[name] = value
        else:
            out[name] = None
            non_finite.append(f"{where}.{name}")
    return out


def rollout_correction(
    rollout: torch.Tensor,
    training: torch.Tensor,
    mask: torch.Tensor,
    *,
    correction: Correction | None = None,
) -> dict[str, Any]:
    """The ``rollout_correction`` section of ``comparison.json``.

    ``metrics`` holds verl's 13 ``rollout_corr/`` figures by short name (as the dashboard
    shows them), ``exact`` their float64 values, ``probability`` verl's probability-space
    debug figures and ``probability_exact`` theirs in float64, ``weights`` the IS/RS figures
    a ``correction`` configures. JSON holds no inf or NaN: such a value is null, and its
    place is named in ``non_finite``.
    """
    dtype = str(torch.promote_types(rollout.dtype, training.dtype)).removeprefix("torch.")
    doc: dict[str, Any] = {
        "schema": SCHEMA,
        "dtype": dtype,
        "correction": correction.to_dict() if correction is not None else None,
        "metrics": None,
        "exact": None,
        "probability": None,
        "probability_exact": None,
        "weights": {},
        "non_finite": [],
        "reason": _check(rollout, training, mask),
    }
    if doc["reason"] is not None:
        return doc
    verl = verl_figures(rollout, training, mask, correction=correction)
    exact = exact_figures(rollout, training, mask)
    flags: list[str] = []
    short = len(PREFIX)
    doc["metrics"] = _finite({k: verl[PREFIX + k] for k in OFFPOLICY}, flags, "metrics")
    doc["exact"] = _finite({k: exact[PREFIX + k] for k in OFFPOLICY}, flags, "exact")
    doc["probability"] = _finite({k: verl[k] for k in DEBUG}, flags, "probability")
    doc["probability_exact"] = _finite({k: exact[k] for k in DEBUG}, flags, "probability_exact")
    weights = {
        k[short:]: v for k, v in verl.items() if k.startswith(PREFIX) and k[short:] not in METRICS
    }
    doc["weights"] = _finite(weights, flags, "weights")
    doc["non_finite"] = flags
    return doc
