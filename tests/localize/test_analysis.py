"""The divergence rule: a case against the baseline's floor; the baseline against its own
repeats, so a failing float32 baseline can name where its two engines part."""

from __future__ import annotations

from xconf.localize.analysis import Difference, TapResult, first_divergence
from xconf.localize.names import Tap


def _row(layer: int, cross: float, of_baseline: bool) -> TapResult:
    return TapResult(Tap("mlp", layer), Difference(cross, cross), cross, 0.0, 0.0, of_baseline)


def test_a_baseline_is_judged_against_its_repeats_not_against_itself() -> None:
    crosses = (2e-7, 5e-7, 3e-6, 8e-6)  # the cross-engine difference grows with depth
    as_case = [_row(i, c, of_baseline=False) for i, c in enumerate(crosses)]
    assert first_divergence(as_case) is None  # its own cross difference is its floor
    as_baseline = [_row(i, c, of_baseline=True) for i, c in enumerate(crosses)]
    first = first_divergence(as_baseline)
    assert first is not None and first.tap.layer == 2  # the first above 10 x 1e-7
    assert [r.floor for r in as_baseline] == [0.0] * 4
