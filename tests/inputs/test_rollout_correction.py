"""verl's rollout-correction metrics against values worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch

from xconf.rollout_correction import EPS, METRICS, rollout_correction


def test_hand_worked_two_sequences() -> None:
    # Row 0: two active tokens; row 1: one active token, one padded (-inf must not leak).
    r = torch.tensor([[-1.0, -2.0], [-0.5, float("-inf")]])
    t = torch.tensor([[-1.5, -2.0], [-0.25, 0.0]])
    m = torch.tensor([[1, 1], [1, 0]])
    out = rollout_correction(r, t, m)
    got = out["metrics"]
    assert out["non_finite"] == []
    n = 3 + EPS
    # kl = mean(r - t) over 3 tokens: (0.5 + 0 - 0.25) / 3
    assert got["kl"] == pytest.approx(0.25 / n, rel=1e-12)
    # k3 with d = t - r: d = -0.5, 0, 0.25
    k3 = (math.exp(-0.5) + 0.5 - 1) + 0 + (math.exp(0.25) - 0.25 - 1)
    assert got["k3_kl"] == pytest.approx(k3 / n, rel=1e-12)
    mean_t = [-3.5 / (2 + EPS), -0.25 / (1 + EPS)]
    mean_r = [-3.0 / (2 + EPS), -0.5 / (1 + EPS)]
    assert got["training_ppl"] == pytest.approx(
        (math.exp(-mean_t[0]) + math.exp(-mean_t[1])) / 2, rel=1e-12
    )
    assert got["rollout_ppl"] == pytest.approx(
        (math.exp(-mean_r[0]) + math.exp(-mean_r[1])) / 2, rel=1e-12
    )
    diffs = [mean_r[0] - mean_t[0], mean_r[1] - mean_t[1]]  # 0.25, -0.25
    assert got["log_ppl_diff"] == pytest.approx(sum(diffs) / 2, abs=1e-12)
    assert got["log_ppl_abs_diff"] == pytest.approx(0.25, rel=1e-6)
    assert got["ppl_ratio"] == pytest.approx((math.exp(0.25) + math.exp(-0.25)) / 2, rel=1e-6)
    chi2_token = (math.exp(-1.0) + 1.0 + math.exp(0.5)) / n - 1.0
    assert got["chi2_token"] == pytest.approx(chi2_token, rel=1e-12)
    chi2_seq = (math.exp(2 * -0.5) + math.exp(2 * 0.25)) / 2 - 1.0
    assert got["chi2_seq"] == pytest.approx(chi2_seq, rel=1e-12)


def test_identical_sides_are_zero_and_ratio_one() -> None:
    r = torch.tensor([[-0.7, -1.3, -2.0]])
    got = rollout_correction(r, r.clone(), torch.ones(1, 3))["metrics"]
    assert got["kl"] == 0.0 and got["k3_kl"] == 0.0
    assert got["chi2_token"] == pytest.approx(0.0, abs=1e-7)
    assert got["chi2_seq"] == 0.0 and got["ppl_ratio"] == 1.0


def test_extreme_finite_values_never_crash_and_clamp_like_verl() -> None:
    big = torch.tensor([[-1e30, -3e38, -1.0]])
    out = rollout_correction(big, torch.zeros(1, 3), torch.ones(1, 3))
    # chi2 is clamped at +-20 (finite); k3 and ppl overflow: null and named, never NaN in JSON.
    assert out["metrics"]["chi2_token"] == pytest.approx(
        (2 * math.exp(40.0) + 1.0) / (3 + EPS) - 1.0, rel=1e-9
    )
    assert set(out["non_finite"]) >= {"k3_kl", "rollout_ppl"}
    for name in out["non_finite"]:
        assert out["metrics"][name] is None
    assert set(out["metrics"]) == set(METRICS)


def test_no_active_token_is_no_metrics() -> None:
    out = rollout_correction(torch.zeros(2, 2), torch.zeros(2, 2), torch.zeros(2, 2))
    assert out["metrics"] is None and out["reason"] == "no active token"
