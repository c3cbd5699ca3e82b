"""Per-tap relative differences, the noise floor, and the first tap above it.

The noise floor of a tap is the largest of three differences measured on the *baseline*
case, which the run judged at the reference settings:

- ``baseline_cross``: the baseline's rollout side against its training side (what two
  different engines disagree by at the baseline settings, e.g. vLLM's fused kernels
  against transformers' in float32),
- ``rollout_repeat`` and ``training_repeat``: each baseline side scored twice (run-to-run
  nondeterminism; zero on a deterministic CPU path).

Localizing the baseline itself asks where the two engines start to disagree at the
reference settings (a float32 baseline that fails, as a real checkpoint's can): its own
cross difference is what is measured, so its floor is only the two repeat differences.

A tap of the case *diverges* when its rollout-vs-training relative difference exceeds
``FACTOR`` times its floor; a floor below ``MIN_FLOOR`` counts as ``MIN_FLOOR``, so that two
bitwise-equal baseline sides do not make every rounding-level difference a divergence.
The relative difference of a tap is ``||rollout - training||_2 / ||training||_2`` over every
position ``0 .. T-2`` of every frozen sample, computed in float64.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from xconf.localize.capture import Rows
from xconf.localize.errors import LocalizeError
from xconf.localize.names import Tap

FACTOR = 10.0
MIN_FLOOR = 1e-7  # about float32's unit roundoff (5.96e-8), rounded up


@dataclass(frozen=True)
class Difference:
    relative: float
    max_abs: float


@dataclass(frozen=True)
class TapResult:
    tap: Tap
    case: Difference
    baseline_cross: float
    rollout_repeat: float
    training_repeat: float
    of_baseline: bool = False  # the case is the baseline: its cross difference is measured

    @property
    def floor(self) -> float:
        repeats = max(self.rollout_repeat, self.training_repeat)
        return repeats if self.of_baseline else max(self.baseline_cross, repeats)

    @property
    def ratio(self) -> float:
        return self.case.relative / max(self.floor, MIN_FLOOR)

    @property
    def above(self) -> bool:
        return self.ratio > FACTOR


def difference(a: Sequence[Any], b: Sequence[Any], key: str) -> Difference:
    """Relative L2 difference of ``a`` against ``b`` (per-sample row tensors) and max |a-b|."""
    num = den = 0.0
    worst = 0.0
    for x, y in zip(a, b, strict=True):
        if x.shape != y.shape:
            raise LocalizeError(
                "localize.shape_mismatch",
                f"tap {key}: the sides captured shapes {tuple(x.shape)} and {tuple(y.shape)}",
                f"localize.{key}",
            )
        d = (x.double() - y.double()).reshape(-1)
        num += float((d * d).sum())
        den += float((y.double().reshape(-1) ** 2).sum())
        if d.numel():
            worst = max(worst, float(d.abs().max()))
    if not (math.isfinite(num) and math.isfinite(den)):
        raise LocalizeError(
            "localize.non_finite", f"tap {key} holds non-finite activations", f"localize.{key}"
        )
    return Difference(math.sqrt(num) / max(math.sqrt(den), 1e-300), worst)


def analyse(
    taps: Sequence[Tap],
    baseline_rollout: tuple[Rows, Rows],
    baseline_training: tuple[Rows, Rows],
    case_rollout: Rows,
    case_training: Rows,
    of_baseline: bool = False,
) -> tuple[TapResult, ...]:
    out = []
    for tap in taps:
        k = tap.key
        out.append(
            TapResult(
                tap=tap,
                case=difference(case_rollout[k], case_training[k], k),
                baseline_cross=difference(
                    baseline_rollout[0][k], baseline_training[0][k], k
                ).relative,
                rollout_repeat=difference(
                    baseline_rollout[1][k], baseline_rollout[0][k], k
                ).relative,
                training_repeat=difference(
                    baseline_training[1][k], baseline_training[0][k], k
                ).relative,
                of_baseline=of_baseline,
            )
        )
    return tuple(out)


def first_divergence(results: Sequence[TapResult]) -> TapResult | None:
    """The first tap, in execution order, whose difference rises above its floor."""
    return next((r for r in results if r.above), None)


def verdict_line(first: TapResult | None) -> str:
    if first is None:
        return f"first divergence: none (no tap exceeds {FACTOR:g}x its noise floor)"
    return f"first divergence: {first.tap.label}"
