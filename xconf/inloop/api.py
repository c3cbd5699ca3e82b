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

The tensors go through judge's own verdict (:func:`xconf.judge.seal.verdict`) as an
in-memory dump: judged in float64 when a side is float64, else float32; verl's figures in
the tensors' own dtype, as verl computes them. Tensors may live on any device: they are
detached and copied to the CPU once.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from xconf.errors import XconfError

if TYPE_CHECKING:
    from xconf.rollout_correction import Correction

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
# (``probability`` holds verl's full names, ``training/rollout_probs_diff_*``.)
VERL_SECTIONS = (("metrics", "rollout_corr/"), ("weights", "rollout_corr/"), ("probability", ""))
# The in-loop caller's tensors are its own: there is no file, so the dump's "digest" (judge's
# read-only evidence, the same before and after) is this recorded fact.
IN_LOOP = "in-loop: tensors given by the caller"


class InloopError(XconfError):
    """Tensors that cannot be judged (shape, dtype, unknown dtype name), or anything else
    that went wrong in the in-loop API: the only exception it raises (a judge or correction
    error keeps its own code), so a training loop catches one type."""


@contextmanager
def inloop_errors(where: str) -> Iterator[None]:
    """Every failure inside the in-loop API as an :class:`InloopError`: a coded error keeps
    its code and path, anything else (a tensor library's own error on an odd tensor, an
    ``OSError``) is ``inloop.failed`` naming ``where``. A context manager, and a decorator
    of every entry point (``@inloop_errors("seal_step")``)."""
    try:
        yield
    except InloopError:
        raise
    except XconfError as exc:
        raise InloopError(exc.code, exc.message, exc.path) from exc
    except Exception as exc:
        raise InloopError("inloop.failed", f"{type(exc).__name__}: {exc}", where) from exc


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


def host_tensor(value: Any, name: str) -> torch.Tensor:
    """A dense, contiguous CPU copy of ``value`` in its own dtype: the figures are computed
    on the very layout a sealed step's dump holds (a strided view's reductions would sum in
    another order). Sparse, nested, quantized and meta tensors are coded refusals."""
    if not isinstance(value, torch.Tensor):
        try:
            value = torch.as_tensor(value)
        except (TypeError, ValueError, RuntimeError) as exc:
            raise InloopError("inloop.not_a_tensor", f"{name}: {exc}", name) from exc
    if value.is_nested or value.layout != torch.strided or value.is_quantized:
        layout = "nested" if value.is_nested else str(value.layout).removeprefix("torch.")
        layout = "quantized" if value.is_quantized else layout
        raise InloopError(
            "inloop.not_dense", f"{name} is a {layout} tensor; pass a dense one", name
        )
    if value.is_meta:
        raise InloopError("inloop.no_data", f"{name} is a meta tensor: it holds no values", name)
    return value.detach().cpu().contiguous()


def _tensor(value: Any, name: str) -> torch.Tensor:
    tensor = host_tensor(value, name)
    if tensor.dim() == 1:
        tensor = tensor.unsqueeze(0)
    if tensor.dim() != 2:
        raise InloopError(
            "inloop.bad_shape", f"{name} must be [B, T], got {tuple(tensor.shape)}", name
        )
    return tensor


def check_tensors(
    rollout_log_probs: Any, old_log_probs: Any, response_mask: Any
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """CPU [B, T] tensors: the logprobs in their own float dtype, the mask as bool."""
    from xconf.judge.dumps import FLOATS

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
        if t.dtype not in FLOATS:
            raise InloopError("inloop.not_float", f"{name} holds {t.dtype}, not logprobs", name)
    if mask.is_complex() or bool(((mask != 0) & (mask != 1)).any()):
        raise InloopError("inloop.bad_mask", "mask entries must be 0 or 1", "response_mask")
    return rollout, training, mask.bool()


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
    vocab = document.get("full_vocab")
    if isinstance(vocab, Mapping) and vocab.get("available"):
        case = vocab.get("case") or {}
        for stat in ("mean", "max"):
            for name, value in (case.get(stat) or {}).items():
                out[f"{PREFIX}full_vocab/{name}_{stat}"] = _number(value)
    return out


def in_memory_case(
    rollout: torch.Tensor,
    training: torch.Tensor,
    mask: torch.Tensor,
    rollout_dtype: str,
    training_dtype: str,
    correction: Correction | None = None,
) -> Any:
    """Checked tensors as judge's case record (a dump that is not a file), the dtypes
    checked by judge (``judge.unknown_dtype``)."""
    from xconf.judge.dumps import Dump, Keys
    from xconf.judge.seal import resolve_dtypes

    dump = Dump(
        name="inloop",
        path=IN_LOOP,
        sha256=IN_LOOP,
        size=0,
        rollout=rollout,
        training=training,
        mask=mask,
        responses=None,
        source_dtypes=(
            ("rollout", str(rollout.dtype).removeprefix("torch.")),
            ("training", str(training.dtype).removeprefix("torch.")),
        ),
        declared=(),
        keys=Keys(),
        ragged=False,
    )
    return resolve_dtypes(dump, None, rollout_dtype, training_dtype, correction)


@inloop_errors("judge_batch")
def judge_batch(
    rollout_log_probs: Any,
    old_log_probs: Any,
    response_mask: Any,
    *,
    rollout_dtype: str,
    training_dtype: str,
    correction: Correction | None = None,
    rollout_logits: Any = None,
    training_logits: Any = None,
) -> BatchVerdict:
    """Judge one step's [B, T] logprobs by the contract's threshold for the two dtypes.

    ``rollout_dtype`` / ``training_dtype``: the dtypes the two engines computed in (they
    pick the threshold; the tensors' own dtype may differ, e.g. float32 copies of bfloat16
    scores). ``correction``: verl's IS/RS settings (``xconf.rollout_correction.Correction``)
    for its importance-weight figures. Bad tensors raise :class:`InloopError`, a dtype the
    contract does not know ``judge.unknown_dtype``, bad IS/RS settings their correction
    code, all as :class:`InloopError`; the verdict itself never raises: non-finite active scores are
    ``invalid_artifact``, an empty mask ``zero_active_tokens``. Whatever goes wrong is an
    :class:`InloopError` (a judge or correction error keeps its code).

    ``rollout_logits`` / ``training_logits``: both sides' full-vocabulary rows ([B, T, V]
    logits or log-probabilities, aligned with the mask), for the full-vocabulary figures
    (``document["full_vocab"]``, logged as ``xconf/full_vocab/...``: KL both ways, total
    variation, top-1/top-10 overlap, argmax agreement); they never change the verdict.
    """
    from xconf.judge.seal import verdict

    rollout, training, mask = check_tensors(rollout_log_probs, old_log_probs, response_mask)
    if correction is not None:  # checked now: inside the verdict a bad one would only be noted
        from xconf.rollout_correction import check_correction

        check_correction(correction)  # its code, as judge raises it
    vocab = _vocab_rows(rollout_logits, training_logits, mask)
    case = in_memory_case(rollout, training, mask, rollout_dtype, training_dtype, correction)
    _, _, comparison = verdict(case)
    document = comparison.to_dict()
    if vocab is not None and comparison.result in ("pass", "fail"):
        from xconf.full_vocab import full_vocab_figures

        document["full_vocab"] = full_vocab_figures(*vocab, mask)
    return BatchVerdict(comparison.result, figures(document), document)


def _vocab_rows(
    rollout_logits: Any, training_logits: Any, mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Both sides' rows of the active tokens ([active, V] each), or None when none given."""
    if rollout_logits is None and training_logits is None:
        return None
    picked = []
    for name, value in (("rollout_logits", rollout_logits), ("training_logits", training_logits)):
        if value is None:
            raise InloopError("inloop.logits_missing", "full logits need both sides' rows", name)
        rows = host_tensor(value, name)
        if rows.ndim != 3 or tuple(rows.shape[:2]) != tuple(mask.shape):
            raise InloopError(
                "inloop.bad_shape",
                f"{name} has shape {tuple(rows.shape)}, expected [B, T, V] with "
                f"[B, T] = {tuple(mask.shape)}",
                name,
            )
        if not rows.is_floating_point():
            raise InloopError("inloop.not_float", f"{name} holds {rows.dtype}, not logits", name)
        picked.append(rows[mask])
    if picked[0].shape[-1] != picked[1].shape[-1]:
        raise InloopError(
            "inloop.bad_shape",
            f"the two sides' vocabularies differ ({picked[0].shape[-1]} and "
            f"{picked[1].shape[-1]} columns)",
            "training_logits",
        )
    return picked[0], picked[1]
