"""`xconf.judge_batch`: the verdict and figures of `xconf judge` on the same tensors, from the
tensors a training step already has; `StepJudge` seals a failing step as judge does."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

import xconf
from xconf.inloop import InloopError, StepJudge, figures


def _step(drift: float, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    rollout = -torch.rand((6, 16), generator=g) * 4
    training = rollout + torch.randn((6, 16), generator=g) * drift
    mask = torch.ones((6, 16), dtype=torch.int64)
    mask[1, 9:] = 0  # a short response
    mask[4] = 0  # a fully masked row
    return {"rollout_log_probs": rollout, "old_log_probs": training, "response_mask": mask}


def _same(a: dict[str, float], b: dict[str, float]) -> bool:
    return a.keys() == b.keys() and all(
        (math.isnan(a[k]) and math.isnan(b[k])) or a[k] == b[k] for k in a
    )


@pytest.mark.parametrize(
    ("drift", "dtypes", "stored", "is_flags", "result"),
    [
        (1e-3, ("float32", "float32"), torch.float32, [], "fail"),
        (1e-3, ("bfloat16", "float32"), torch.float32, [], "pass"),
        (0.0, ("float32", "float32"), torch.float32, [], "pass"),
        # bfloat16 tensors: judged in float32, verl's figures in bfloat16 (as verl logs them)
        (1e-2, ("bfloat16", "bfloat16"), torch.bfloat16, [], "pass"),
        (1e-3, ("float32", "float32"), torch.float64, ["--rollout-is", "token"], "fail"),
    ],
)
def test_figures_equal_judges_on_the_same_tensors(
    xconf_cli: Any,
    tmp_path: Path,
    drift: float,
    dtypes: tuple[str, str],
    stored: torch.dtype,
    is_flags: list[str],
    result: str,
) -> None:
    from xconf.rollout_correction import Correction

    tensors = {k: v.to(stored) if v.is_floating_point() else v for k, v in _step(drift).items()}
    correction = Correction(rollout_is="token") if is_flags else None
    verdict = xconf.judge_batch(
        *tensors.values(),
        rollout_dtype=dtypes[0],
        training_dtype=dtypes[1],
        correction=correction,
    )
    assert verdict.result == result and verdict.passed == (result == "pass")
    dump = tmp_path / "step.safetensors"
    save_file(tensors, str(dump))
    code, _, err = xconf_cli(
        "judge", dump, "--rollout-dtype", dtypes[0], "--training-dtype", dtypes[1],
        *is_flags, "--output-root", tmp_path / "out",
    )  # fmt: skip
    assert code == (0 if result == "pass" else 1), err
    (attempt,) = (tmp_path / "out" / "judge" / "cases" / "step").iterdir()
    judged = json.loads((attempt / "comparison.json").read_text())
    assert judged["result"] == verdict.result
    assert _same(figures(judged), verdict.figures), (figures(judged), verdict.figures)
    assert verdict.figures["xconf/active_tokens"] == 6 * 16 - 7 - 16
    assert "xconf/rollout_corr/k3_kl" in verdict.figures
    assert "xconf/training/rollout_probs_diff_max" in verdict.figures  # probability space
    assert ("xconf/rollout_corr/rollout_is_mean" in verdict.figures) == bool(is_flags)
    assert all(k.startswith("xconf/") for k in verdict.figures)


def test_any_float_dtype_and_the_contract_threshold() -> None:
    tensors = _step(1e-3)
    as_bf16 = [t.to(torch.bfloat16) if t.is_floating_point() else t for t in tensors.values()]
    verdict = xconf.judge_batch(*as_bf16, rollout_dtype="bfloat16", training_dtype="bfloat16")
    assert verdict.figures["xconf/threshold"] == 5e-2  # the contract's, never the caller's
    single = xconf.judge_batch(
        tensors["rollout_log_probs"][0],
        tensors["old_log_probs"][0],
        tensors["response_mask"][0],
        rollout_dtype="float32",
        training_dtype="float32",
    )  # one sequence, [T]
    assert single.figures["xconf/active_tokens"] == 16
    empty = xconf.judge_batch(
        tensors["rollout_log_probs"],
        tensors["old_log_probs"],
        torch.zeros((6, 16)),
        rollout_dtype="float32",
        training_dtype="float32",
    )
    assert empty.result == "zero_active_tokens" and empty.figures["xconf/pass"] == 0.0
    broken = dict(tensors)
    broken["old_log_probs"] = tensors["old_log_probs"].clone()
    broken["old_log_probs"][0, 0] = math.inf
    bad = xconf.judge_batch(*broken.values(), rollout_dtype="float32", training_dtype="float32")
    assert bad.result == "invalid_artifact"


@pytest.mark.parametrize(
    ("change", "code"),
    [
        ({"old_log_probs": torch.zeros((6, 15))}, "inloop.shape_mismatch"),
        ({"response_mask": torch.full((6, 16), 2)}, "inloop.bad_mask"),
        ({"rollout_log_probs": torch.zeros((6, 16), dtype=torch.int64)}, "inloop.not_float"),
        ({"rollout_log_probs": torch.zeros((2, 6, 16))}, "inloop.bad_shape"),
        ({"dtype": "fp8"}, "judge.unknown_dtype"),
        ({"correction": "rollout_is=tokens"}, "judge.bad_correction"),
    ],
)
def test_bad_tensors_are_coded_errors(change: dict[str, Any], code: str) -> None:
    from xconf.errors import XconfError
    from xconf.rollout_correction import Correction

    tensors: dict[str, Any] = {**_step(0.0), **change}
    dtype = tensors.pop("dtype", "float32")
    correction = Correction(rollout_is="tokens") if tensors.pop("correction", None) else None
    with pytest.raises(XconfError) as info:
        xconf.judge_batch(
            *tensors.values(),
            rollout_dtype=dtype,
            training_dtype="float32",
            correction=correction,
        )
    assert info.value.code == code


def test_step_judge_seals_failing_and_every_nth_step(xconf_cli: Any, tmp_path: Path) -> None:
    from xconf.adapters.frozen_dump import replay_command

    judge = StepJudge(tmp_path, run="grpo", every=10, on_failure=True)
    prompts = torch.arange(6 * 3).reshape(6, 3) + 5
    responses = torch.arange(6 * 16).reshape(6, 16) + 100
    attention = torch.cat([torch.ones((6, 3)), _step(0.0)["response_mask"]], dim=1).long()
    tokens: dict[str, Any] = {
        "input_ids": torch.cat([prompts, responses], dim=1),
        "responses": responses,
        "attention_mask": attention,
    }
    quiet = judge(3, *_step(0.0).values(), rollout_dtype="float32", training_dtype="float32")
    assert quiet.passed and quiet.dump is None  # a passing step between checkpoints: no dump
    due = judge(10, *_step(0.0).values(), rollout_dtype="float32", training_dtype="float32")
    assert due.passed and due.dump == str(tmp_path / "grpo-step-00000010")
    failed = judge(
        11, *_step(1e-3).values(), rollout_dtype="float32", training_dtype="float32", **tokens
    )
    assert failed.result == "fail" and failed.dump == str(tmp_path / "grpo-step-00000011")
    (attempt,) = (Path(failed.dump) / "cases" / "step-00000011").iterdir()
    sealed = json.loads((attempt / "comparison.json").read_text())
    assert _same(figures(sealed), failed.figures)  # sealed by judge: the same figures
    assert xconf_cli("verify", failed.dump)[0] == 0
    dump = tmp_path / "grpo-dumps" / "step-00000011.safetensors"
    assert replay_command(str(dump)) is not None  # its token ids make it replayable
    with pytest.raises(InloopError):
        judge(12, *_step(1e-3).values(), rollout_dtype="float32", training_dtype="float32",
              labels=responses)  # fmt: skip


def test_full_logits_give_the_full_vocabulary_figures_and_never_vote() -> None:
    from tests import full_vocab_reference as referee

    step: dict[str, Any] = _step(0.0, seed=3)
    g = torch.Generator().manual_seed(4)
    rollout_logits = torch.randn((6, 16, 32), generator=g)
    training_logits = rollout_logits + 0.1 * torch.randn((6, 16, 32), generator=g)
    plain = xconf.judge_batch(**step, rollout_dtype="float32", training_dtype="float32")
    full = xconf.judge_batch(
        **step,
        rollout_dtype="float32",
        training_dtype="float32",
        rollout_logits=rollout_logits,
        training_logits=training_logits,
    )
    assert full.result == plain.result == "pass"
    mask = step["response_mask"].bool()
    want = referee.figures(rollout_logits[mask].numpy(), training_logits[mask].numpy())
    case = full.document["full_vocab"]["case"]["mean"]
    for name, values in want.items():
        assert case[name] == pytest.approx(float(values.mean()), rel=1e-12)
        assert full.figures[f"xconf/full_vocab/{name}_mean"] == case[name]
    assert plain.document["full_vocab"]["available"] is False  # no rows given: said so
    assert not any(k.startswith("xconf/full_vocab/") for k in plain.figures)
    with pytest.raises(InloopError) as one_side:
        xconf.judge_batch(
            **step, rollout_dtype="float32", training_dtype="float32", rollout_logits=rollout_logits
        )
    assert one_side.value.code == "inloop.logits_missing"
    with pytest.raises(InloopError) as shape:
        xconf.judge_batch(
            **step,
            rollout_dtype="float32",
            training_dtype="float32",
            rollout_logits=rollout_logits[:, :8],
            training_logits=training_logits[:, :8],
        )
    assert shape.value.code == "inloop.bad_shape"
