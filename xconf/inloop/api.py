"""Judge a training step's own tensors inside the loop: the verdict and figures to log.

::

    import xconf

    verdict = xconf.judge_batch(
        batch["rollout_log_probs"], batch["old_log_probs"], batch["response_mask"],
        rollout_dtype="bfloat16", training_dtype="float32",
    )
    metrics.update(verdict.figures)  # {"xconf/pass": 1.0, "xconf/mismatches": 0.0, ...}

The verdict is :func:`xconf.comparison.compare`, the function ``xconf judge`` and every
scored case use: every active token is judged by ``abs(training - rollout) > threshold``
with the threshold the shipped contract gives for the two dtypes, never a caller's value.
The figures are the comparison document's own numbers (judge writes the same document to
``comparison.json``), under stable ``xconf/...`` names (:data:`CORE_FIGURES`, plus verl's
rollout-correction figures as ``xconf/<verl name>``); none of them votes.

Tensors may live on any device and in any float dtype: they are detached and copied to the
CPU once. The two sides are judged in their common dtype (as judge judges a dump).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from xconf.errors import XconfError

PREFIX = "xconf/"
# Stable figure names -> where the comparison document holds them.
CORE_FIGURES: dict[str, tuple[str, ...]] = {
    "active_tokens": ("active_tokens",),
    "mismatches": ("mismatches",),
    "mismatch_ratio": ("mismatch_ratio",),
    "threshold": ("threshold",),
    "abs_diff_mean": ("diff", "mean"),
    "abs_diff_p50": ("diff", "p50"),
    "abs_diff_p90": ("diff", "p90"),
    "abs_diff_p99": ("diff", "p99"),
    "abs_diff_max": ("diff", "max"),
}
# verl's figures inside the document's rollout_correction section, and their logged prefix.
VERL_SECTIONS = (("metrics", "rollout_corr/"), ("weights", "rollout_corr/"), ("probability", ""))
# The in-loop caller's tensors are its own: no scorer ran, so the read-only evidence is the
# same recorded fact on both sides (as judge records a dump's digest before and after).
_EVIDENCE = "in-loop: tensors given by the caller"


class InloopError(XconfError):
    """Tensors that cannot be judged (shape, dtype, unknown dtype name)."""


@dataclass(frozen=True)
class BatchVerdict:
    """One step's verdict: ``result`` by the contract's fixed threshold, and its figures."""

    result: str  # pass | fail | zero_active_tokens | invalid_artifact
    figures: dict[str, float]
    document: dict[str, Any] = field(repr=False)
    dump: str | None = None  # the sealed dump's attempt directory, when one was written

    @property
    def passed(self) -> bool:
        return self.result == "pass"


def _tensor(value: Any, name: str) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        try:
            value = torch.as_tensor(value)
        except (TypeError, ValueError, RuntimeError) as exc:
            raise InloopError("inloop.not_a_tensor", f"{name}: {exc}", name) from exc
    tensor = value.detach()
    if tensor.dim() == 1:
        tensor = tensor.unsqueeze(0)
    if tensor.dim() != 2:
        raise InloopError(
            "inloop.bad_shape", f"{name} must be [B, T], got {tuple(tensor.shape)}", name
        )
    return tensor.cpu()


def check_tensors(
    rollout_log_probs: Any, old_log_probs: Any, response_mask: Any
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """CPU [B, T] tensors: both sides in their common float dtype, the mask as bool."""
    rollout = _tensor(rollout_log_probs, "rollout_log_probs")
    training = _tensor(old_log_probs, "old_log_probs")
    mask = _tensor(response_mask, "response_mask")
    for name, t in (("old_log_probs", training), ("response_mask", mask)):
        if t.shape != rollout.shape:
            raise InloopError(
                "inloop.shape_mismatch",
                f"{name} is {tuple(t.shape)}, rollout_log_probs {tuple(rollout.shape)}",
                name,
            )
    for name, t in (("rollout_log_probs", rollout), ("old_log_probs", training)):
        if not t.is_floating_point():
            raise InloopError("inloop.not_float", f"{name} holds {t.dtype}, not logprobs", name)
    if bool(((mask != 0) & (mask != 1)).any()):
        raise InloopError("inloop.bad_mask", "mask entries must be 0 or 1", "response_mask")
    common = torch.promote_types(rollout.dtype, training.dtype)
    return rollout.to(common), training.to(common), mask.bool()


def _threshold(rollout_dtype: str, training_dtype: str) -> Any:
    from xconf.contract.loader import load_contract

    contract = load_contract()
    for side, value in (("rollout_dtype", rollout_dtype), ("training_dtype", training_dtype)):
        if value not in contract.thresholds:
            raise InloopError(
                "inloop.unknown_dtype",
                f"{side} {value!r}; the contract knows {sorted(contract.thresholds)}",
                side,
            )
    return contract, contract.threshold_for(rollout_dtype, training_dtype)


def _at(document: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    node: Any = document
    for key in path:
        if not isinstance(node, Mapping):
            return None
        node = node.get(key)
    return node


def _number(value: Any) -> float:
    """A figure for a logger: null (not finite, or not computed) is NaN, never a made-up 0."""
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, int | float):
        return float(value)
    return math.nan


def figures(document: Mapping[str, Any]) -> dict[str, float]:
    """A comparison document's numbers under their stable ``xconf/...`` names.

    The same function reads ``comparison.json`` of ``xconf judge``: that is how the test
    shows the in-loop figures are judge's."""
    result = document.get("result")
    out = {f"{PREFIX}pass": float(result == "pass"), f"{PREFIX}fail": float(result == "fail")}
    out.update({PREFIX + name: _number(_at(document, path)) for name, path in CORE_FIGURES.items()})
    correction = document.get("rollout_correction")
    if isinstance(correction, Mapping):
        for section, prefix in VERL_SECTIONS:
            values = correction.get(section)
            if isinstance(values, Mapping):
                for name, value in values.items():
                    out[f"{PREFIX}{prefix}{name}"] = _number(value)
    return out


def judge_batch(
    rollout_log_probs: Any,
    old_log_probs: Any,
    response_mask: Any,
    *,
    rollout_dtype: str,
    training_dtype: str,
) -> BatchVerdict:
    """Judge one step's [B, T] logprobs by the contract's threshold for the two dtypes.

    ``rollout_dtype`` / ``training_dtype``: the dtypes the two engines computed in (they
    pick the threshold; the tensors' own dtype may differ, e.g. float32 copies of bfloat16
    scores). Bad tensors raise :class:`InloopError` (coded); the verdict itself never
    raises: non-finite active scores are ``invalid_artifact``, an empty mask
    ``zero_active_tokens``.
    """
    from xconf.comparison import compare
    from xconf.runtime.protocol import FrozenInputs, ReadOnlyEvidence, SideScore

    rollout, training, mask = check_tensors(rollout_log_probs, old_log_probs, response_mask)
    contract, threshold = _threshold(rollout_dtype, training_dtype)
    ids = torch.zeros(mask.shape, dtype=torch.int64)  # no token ids: the caller's rows
    inputs = FrozenInputs(ids, ids, mask, mask, ids)
    evidence = ReadOnlyEvidence(_EVIDENCE, _EVIDENCE, True, False, False)
    sides = [SideScore(lp, ids, ids, mask, evidence, _EVIDENCE) for lp in (rollout, training)]
    outcome = compare(inputs, _EVIDENCE, sides[0], sides[1], threshold, contract)
    document = dict(outcome.document)
    document.update(rollout_dtype=rollout_dtype, training_dtype=training_dtype)
    return BatchVerdict(outcome.result, figures(document), document)
