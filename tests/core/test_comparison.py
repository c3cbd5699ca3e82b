"""Comparison: the strict `>` rule, the five results, identity checks and diagnostics."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from xconf.comparison import compare, error_outcome, identity_violations, recompute_result
from xconf.contract.loader import ResolvedThreshold, load_contract
from xconf.runtime.protocol import FrozenInputs, ReadOnlyEvidence, SideScore

DIGEST = "identity-digest"
CONTRACT = load_contract()
F32 = CONTRACT.threshold_for("float32", "float32")

TOKENS = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12]])
SELECTED = torch.tensor([[6, 7, 8, 1], [10, 11, 12, 2]])
ACTIVE = torch.tensor([[1, 1, 1, 0], [0, 1, 1, 1]], dtype=torch.bool)


def inputs(active: torch.Tensor = ACTIVE) -> FrozenInputs:
    return FrozenInputs(
        token_ids=TOKENS,
        selected_token_ids=SELECTED,
        active_mask=active,
        attention_mask=torch.ones_like(active),
        position_ids=torch.arange(4).expand(2, 4).clone(),
    )


def clean_evidence() -> ReadOnlyEvidence:
    return ReadOnlyEvidence("s0", "s0", True, False, False)


def score(logprobs: torch.Tensor, frozen: FrozenInputs | None = None, **changes) -> SideScore:
    frozen = frozen or inputs()
    base = SideScore(
        logprobs=logprobs,
        scored_token_ids=frozen.token_ids.clone(),
        scored_selected_ids=frozen.selected_token_ids.clone(),
        scored_active_mask=frozen.active_mask.clone(),
        evidence=clean_evidence(),
        identity_digest=DIGEST,
    )
    return replace(base, **changes)


def judge(rollout, training, frozen=None, threshold=F32):
    frozen = frozen or inputs()
    return compare(frozen, DIGEST, rollout, training, threshold, CONTRACT)


def base_logprobs() -> torch.Tensor:
    return torch.tensor([[-1.0, -2.0, -0.5, -3.0], [-0.25, -1.5, -4.0, -0.75]])


# -- the > rule --------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_difference_equal_to_threshold_is_not_a_mismatch(dtype: str) -> None:
    threshold = CONTRACT.threshold_for(dtype, dtype)
    thr32 = np.float32(threshold.value)
    rollout = torch.zeros(2, 4)
    training = torch.full((2, 4), float(-thr32))  # |training - rollout| == float32(threshold)
    assert bool((torch.abs(training - rollout)[ACTIVE] == torch.tensor(thr32)).all())
    outcome = judge(score(rollout), score(training), threshold=threshold)
    assert outcome.result == "pass"
    assert outcome.document["mismatches"] == 0
    assert recompute_result(outcome.token_diffs) == ("pass", 0)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_difference_just_above_threshold_is_a_mismatch(dtype: str) -> None:
    threshold = CONTRACT.threshold_for(dtype, dtype)
    above = np.nextafter(np.float32(threshold.value), np.float32(np.inf))
    rollout = torch.zeros(2, 4)
    training = torch.zeros(2, 4)
    training[0, 1] = float(-above)  # a log-probability is at most 0
    outcome = judge(score(rollout), score(training), threshold=threshold)
    assert outcome.result == "fail"
    assert outcome.document["mismatches"] == 1
    assert outcome.token_diffs["mismatch_mask"].tolist() == [[0, 1, 0, 0], [0, 0, 0, 0]]
    assert recompute_result(outcome.token_diffs) == ("fail", 1)


def test_identical_scores_pass_with_zero_diagnostics() -> None:
    lp = base_logprobs()
    outcome = judge(score(lp), score(lp.clone()))
    doc = outcome.document
    assert outcome.result == "pass"
    assert doc["active_tokens"] == 6
    assert doc["diff"] == {"mean": 0.0, "p50": 0.0, "p90": 0.0, "p99": 0.0, "max": 0.0}
    assert doc["approx_kl"] == 0.0
    assert doc["threshold"] == 1e-5 and doc["threshold_dtype"] == "float32"
    assert doc["contract"] == CONTRACT.identity()


def test_zero_active_tokens_is_never_a_pass() -> None:
    frozen = inputs(torch.zeros(2, 4, dtype=torch.bool))
    lp = base_logprobs()
    outcome = judge(score(lp, frozen), score(lp + 100.0, frozen), frozen=frozen)
    assert outcome.result == "zero_active_tokens"
    assert recompute_result(outcome.token_diffs) == ("zero_active_tokens", 0)


def test_inactive_non_finite_scores_do_not_matter() -> None:
    lp = base_logprobs()
    noisy = lp.clone()
    noisy[0, 3] = float("nan")  # inactive
    noisy[1, 0] = float("inf")  # inactive
    outcome = judge(score(lp), score(noisy))
    assert outcome.result == "pass"
    assert all(math.isfinite(v) for v in outcome.document["diff"].values())
    assert bool(torch.isfinite(outcome.token_diffs["training_logprobs"]).all())


# -- invalid artifacts -------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("side", ["rollout", "training"])
def test_non_finite_active_score_is_invalid_artifact(bad: float, side: str) -> None:
    lp = base_logprobs()
    broken = lp.clone()
    broken[1, 2] = bad  # active
    sides = {"rollout": score(lp), "training": score(lp.clone())}
    sides[side] = score(broken)
    outcome = judge(sides["rollout"], sides["training"])
    assert outcome.result == "invalid_artifact"
    assert side in outcome.document["reason"]


@pytest.mark.parametrize(
    ("rollout", "training", "needle"),
    [
        (torch.zeros(2, 4, dtype=torch.int64), torch.zeros(2, 4), "int64"),
        (torch.zeros(2, 4), torch.zeros(2, 4, dtype=torch.int32), "int32"),
        (torch.zeros(2, 3), torch.zeros(2, 4), "shape"),
        (torch.zeros(2, 4), torch.zeros(8), "shape"),
        (torch.zeros(2, 4), torch.zeros(2, 4, dtype=torch.bfloat16), "dtype"),
        (torch.zeros(2, 4, dtype=torch.float16), torch.zeros(2, 4), "dtype"),
    ],
    ids=["int-rollout", "int-training", "shape-rollout", "shape-flat", "dtype-bf16", "dtype-f16"],
)
def test_malformed_scores_are_invalid_artifact(rollout, training, needle: str) -> None:
    outcome = judge(score(rollout), score(training))
    assert outcome.result == "invalid_artifact"
    assert needle in outcome.document["reason"]
    assert outcome.token_diffs == {}


# -- identity --------------------------------------------------------------------------------


def _other_tokens() -> torch.Tensor:
    t = TOKENS.clone()
    t[0, 0] = 99
    return t


# SideScore field -> the value that breaks that field's identity check.
IDENTITY_BREAKS: dict[str, dict[str, Any]] = {
    "token_ids": {"scored_token_ids": _other_tokens()},
    "selected_ids": {"scored_selected_ids": SELECTED.flip(1)},
    "active_mask": {"scored_active_mask": ~ACTIVE},
    "identity_digest": {"identity_digest": "another-identity"},
    "state_digest": {"evidence": ReadOnlyEvidence("before", "after", True, False, False)},
    "mode_not_restored": {"evidence": ReadOnlyEvidence("s", "s", False, False, False)},
    "generated_tokens": {"evidence": ReadOnlyEvidence("s", "s", True, False, True)},
}


@pytest.mark.parametrize("side", ["rollout", "training"])
@pytest.mark.parametrize("brk", sorted(IDENTITY_BREAKS))
def test_identity_violations_are_invalid_identity(side: str, brk: str) -> None:
    lp = base_logprobs()
    sides = {"rollout": score(lp), "training": score(lp.clone())}
    sides[side] = score(sides[side].logprobs, **IDENTITY_BREAKS[brk])
    outcome = judge(sides["rollout"], sides["training"])
    assert outcome.result == "invalid_identity"
    assert outcome.document["identity"]["valid"] is False
    assert any(v.startswith(side) for v in outcome.document["identity"]["violations"])


def test_kv_cache_is_forbidden_on_the_training_side_only() -> None:
    lp = base_logprobs()
    cached = ReadOnlyEvidence("s", "s", True, True, False)
    assert judge(score(lp, evidence=cached), score(lp.clone())).result == "pass"
    outcome = judge(score(lp), score(lp.clone(), evidence=cached))
    assert outcome.result == "invalid_identity"
    assert "KV cache" in outcome.document["reason"]


def test_identity_is_checked_before_numerics() -> None:
    lp = base_logprobs()
    broken = lp.clone()
    broken[0, 0] = float("nan")
    outcome = judge(score(broken), score(lp, scored_token_ids=_other_tokens()))
    assert outcome.result == "invalid_identity"


def test_identity_violations_lists_every_problem() -> None:
    lp = base_logprobs()
    bad = score(
        lp,
        scored_token_ids=_other_tokens(),
        evidence=ReadOnlyEvidence("a", "b", False, True, True),
    )
    violations = identity_violations(inputs(), DIGEST, score(lp), bad)
    assert len(violations) == 5


# -- diagnostics -----------------------------------------------------------------------------


def test_diagnostics_match_hand_computed_values() -> None:
    rollout = base_logprobs()
    delta = torch.tensor([[1e-6, -3e-3, 0.2, 9.0], [9.0, 0.0, -0.05, 1e-4]])
    training = rollout + delta
    outcome = judge(score(rollout), score(training))
    doc = outcome.document

    active = ACTIVE.numpy()
    d = (training.double() - rollout.double()).numpy()  # close to delta, exact enough
    r32, t32 = rollout.numpy(), training.numpy()
    absdiff = np.abs(t32 - r32)[active].astype(np.float64)
    signed = (t32 - r32)[active].astype(np.float64)
    assert doc["active_tokens"] == 6
    assert doc["mismatches"] == 4  # 1e-6 and 0.0 are within 1e-5
    assert doc["mismatch_ratio"] == pytest.approx(4 / 6)
    assert doc["diff"]["mean"] == pytest.approx(absdiff.mean(), rel=1e-12)
    for key, q in (("p50", 50), ("p90", 90), ("p99", 99)):
        assert doc["diff"][key] == pytest.approx(np.percentile(absdiff, q), rel=1e-9)
    assert doc["diff"]["max"] == pytest.approx(0.2, rel=1e-5)
    assert doc["approx_kl"] == pytest.approx(np.mean(np.exp(signed) - signed - 1.0), rel=1e-9)
    assert np.allclose(signed, d[active], atol=1e-6)
    worst = doc["worst_token"]
    assert (worst["batch"], worst["position"], worst["token_id"]) == (0, 2, 8)
    assert worst["rollout_logprob"] == pytest.approx(-0.5)
    assert worst["training_logprob"] == pytest.approx(-0.3)
    profile = {p["position"]: p for p in doc["drift_profile"]}
    assert sorted(profile) == [0, 1, 2, 3]
    assert profile[0]["active"] == 1 and profile[3]["active"] == 1
    assert profile[1]["active"] == 2 and profile[2]["active"] == 2
    assert profile[1]["mean_abs_diff"] == pytest.approx((3e-3 + 0.0) / 2, rel=1e-4)
    assert profile[2]["max_abs_diff"] == pytest.approx(0.2, rel=1e-5)
    assert profile[3]["max_abs_diff"] == pytest.approx(1e-4, rel=1e-3)  # inactive 9.0 ignored


def test_worst_token_ignores_inactive_positions() -> None:
    rollout = torch.zeros(2, 4)
    training = torch.zeros(2, 4)
    training[0, 3] = 50.0  # inactive
    training[1, 1] = -0.5
    worst = judge(score(rollout), score(training)).document["worst_token"]
    assert (worst["batch"], worst["position"], worst["token_id"]) == (1, 1, 11)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.floats(min_value=-2e-5, max_value=2e-5, allow_nan=False),
        min_size=8,
        max_size=8,
    )
)
def test_result_depends_only_on_the_threshold_rule(deltas: list[float]) -> None:
    rollout = torch.full((2, 4), -1.0)
    training = rollout + torch.tensor(deltas, dtype=torch.float32).reshape(2, 4)
    outcome = judge(score(rollout), score(training))
    expected = bool((ACTIVE & (torch.abs(training - rollout) > F32.value)).any())
    assert outcome.result == ("fail" if expected else "pass")
    assert recompute_result(outcome.token_diffs)[0] == outcome.result


def test_diagnostics_never_change_the_result() -> None:
    # Large diagnostics (every active token sits exactly on the threshold) still pass.
    thr = float(np.float32(5e-2))
    threshold = CONTRACT.threshold_for("bfloat16", "bfloat16")
    rollout = torch.zeros(2, 4)
    training = torch.where(ACTIVE, torch.tensor(-thr), torch.tensor(7.0))
    doc = judge(score(rollout), score(training), threshold=threshold).document
    assert doc["result"] == "pass"
    assert doc["diff"]["max"] > 0 and doc["approx_kl"] > 0


def test_token_diffs_recompute_the_verdict_offline() -> None:
    rollout = base_logprobs()
    training = rollout + torch.tensor([[0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 2e-5, 0.0]])
    outcome = judge(score(rollout), score(training))
    td = outcome.token_diffs
    assert set(td) >= {"rollout_logprobs", "training_logprobs", "active_mask", "threshold"}
    # float32: the precision the verdict is computed in, so offline recomputes agree bitwise.
    assert td["threshold"].dtype == torch.float32
    assert float(td["threshold"]) == float(torch.tensor(1e-5, dtype=torch.float32))
    assert td["active_mask"].dtype == torch.uint8
    assert torch.equal(td["active_mask"].bool(), ACTIVE)
    assert recompute_result(td) == (outcome.result, outcome.document["mismatches"]) == ("fail", 2)


def test_error_outcome_carries_the_error() -> None:
    error = {"code": "runtime.strict_refused", "path": "rollout:x", "message": "refused"}
    outcome = error_outcome(F32, CONTRACT, error)
    assert outcome.result == "error"
    assert outcome.document["error"] == error
    assert outcome.token_diffs == {}


def test_mixed_dtype_threshold_is_recorded() -> None:
    threshold: ResolvedThreshold = CONTRACT.threshold_for("bfloat16", "float32")
    lp = base_logprobs()
    doc = judge(score(lp), score(lp + 0.04), threshold=threshold).document
    assert doc["result"] == "pass"
    assert (doc["threshold"], doc["threshold_dtype"], doc["threshold_rule"]) == (
        0.05,
        "bfloat16",
        "less_precise_dtype",
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_owned_scores_give_the_same_verdict_and_token_diffs_bit_for_bit(dtype) -> None:
    """``owned``: the stored sides reuse the scores' memory; every figure and tensor is the
    copying call's, and a call that does not own the scores never changes them."""
    from xconf.rollout_correction import Correction

    g = torch.Generator().manual_seed(7)
    b, t = 37, 53
    active = torch.rand(b, t, generator=g) > 0.3
    active[3] = False  # a row with no active token
    rollout = (-torch.rand(b, t, generator=g) * 6).to(dtype)
    training = (rollout.double() + torch.randn(b, t, generator=g).double() * 2e-2).to(dtype)
    rollout[~active] = float("-inf")  # padding as some dumps hold it
    training[~active] = float("nan")
    frozen = FrozenInputs(
        token_ids=torch.randint(0, 500, (b, t), generator=g),
        selected_token_ids=torch.randint(0, 500, (b, t), generator=g),
        active_mask=active,
        attention_mask=active,
        position_ids=torch.arange(t).expand(b, t),
    )
    threshold = CONTRACT.threshold_for("bfloat16", "bfloat16")
    correction = Correction(rollout_is="token", rollout_is_threshold=2.0)
    given = (rollout.clone(), training.clone())
    copied = compare(
        frozen,
        DIGEST,
        score(given[0], frozen),
        score(given[1], frozen),
        threshold,
        CONTRACT,
        correction=correction,
    )
    assert torch.equal(given[0], rollout) and given[1].isnan().equal(training.isnan())  # untouched
    owned = compare(
        frozen,
        DIGEST,
        score(rollout.clone(), frozen),
        score(training.clone(), frozen),
        threshold,
        CONTRACT,
        correction=correction,
        owned=True,
    )
    assert owned.document == copied.document and copied.document["result"] == "fail"
    assert copied.document["rollout_correction"]["metrics"]["kl"] is not None
    assert owned.token_diffs.keys() == copied.token_diffs.keys()
    for name, tensor in copied.token_diffs.items():
        mine = owned.token_diffs[name]
        assert mine.dtype == tensor.dtype and torch.equal(mine, tensor), name
