"""The transformers training scorer: teacher-forced, read-only, knobs read back."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.adapters.conftest import needs_hf
from xconf.adapters.errors import ReadOnlyViolationError, ScoringError, UnsupportedKnobError
from xconf.adapters.frozen import FrozenBatch, FrozenSample
from xconf.adapters.hf.handlers import TRAINING as HANDLERS
from xconf.adapters.hf.model import TrainingScorerConfig
from xconf.adapters.hf.scorer import HFTrainingScorer, native_selected_logprob
from xconf.runtime.protocol import knob_readback

pytestmark = needs_hf


@pytest.fixture(scope="module")
def batch() -> FrozenBatch:
    return FrozenBatch(
        (
            FrozenSample((5, 6, 7), (8, 9, 10, 11)),
            FrozenSample((12, 13), (14, 15, 16)),
            FrozenSample((20, 21, 22, 23), (24, 25)),
        ),
        pad_token_id=0,
    )


def _scorer(record: Any, **kw: Any) -> HFTrainingScorer:
    return HFTrainingScorer(TrainingScorerConfig(model_path=record.path, **kw))


def test_scores_are_teacher_forced_and_batch_invariant(model_record, batch) -> None:
    scorer = _scorer(model_record)
    one = scorer.score(batch, 1).logprobs
    three = scorer.score(batch, 3).logprobs
    active = torch.tensor(batch.layout()["active_mask"], dtype=torch.bool)
    assert float((one - three).abs()[active].max()) <= 1e-5
    # the same selected logprob by hand, sample 0 position 2 predicts token 8
    ids = torch.tensor([batch.samples[0].token_ids])
    with torch.no_grad():
        lp = scorer.model(ids, use_cache=False).logits.float().log_softmax(-1)
    assert abs(float(lp[0, 2, 8]) - float(one[0, 2])) <= 1e-6
    assert scorer.last_request_size == 3 and scorer.request_sizes == [3]


def test_read_only_mode_restored_and_no_grads(model_record, batch) -> None:
    scorer = _scorer(model_record)
    scorer.model.train()
    result = scorer.score(batch, 2)
    assert scorer.model.training is True
    assert result.mode_restored
    assert result.digest_before == result.digest_after
    assert all(p.grad is None for p in scorer.model.parameters())


def test_operator_that_mutates_the_model_is_caught(model_record, batch) -> None:
    scorer = _scorer(model_record)
    param = next(scorer.model.parameters())

    def bad_op(logits, targets, active):
        param.data.add_(1.0)
        return native_selected_logprob(logits, targets, active)

    with pytest.raises(ReadOnlyViolationError):
        scorer.score(batch, 3, bad_op)


def test_injected_operator_gets_rows_targets_and_active_mask(model_record, batch) -> None:
    seen: dict[str, Any] = {}

    def op(logits, targets, active):
        seen.update(shape=tuple(logits.shape), targets=targets.clone(), active=active.clone())
        return native_selected_logprob(logits, targets, active)

    scorer = _scorer(model_record)
    out = scorer.score(batch, 3, op).logprobs
    native = scorer.score(batch, 3).logprobs
    assert torch.equal(out, native)
    n = sum(s.length - 1 for s in batch.samples)
    assert seen["shape"] == (n, 512) and seen["targets"].shape == (n,)
    assert int(seen["active"].sum()) == sum(len(s.response_ids) for s in batch.samples)


def test_operator_must_return_float32(model_record, batch) -> None:
    scorer = _scorer(model_record)
    with pytest.raises(ScoringError):
        scorer.score(batch, 3, lambda lg, t, a: native_selected_logprob(lg, t, a).double())


@pytest.mark.parametrize(("backend", "dtype"), [("eager", "float32"), ("sdpa", "bfloat16")])
def test_readback_attention_and_dtype(model_record, batch, backend: str, dtype: str) -> None:
    scorer = _scorer(model_record, attention_backend=backend, compute_dtype=dtype)
    scorer.score(batch, 2)
    back = knob_readback(HANDLERS, "training", scorer.live())  # each knob by its handler
    assert back["training.attention_backend"] == backend
    assert back["training.compute_dtype"] == dtype
    assert back["training.sharding"] == "unsharded"
    assert back["batch.size"] == 2


def test_bf16_training_drifts_from_fp32(model_record, batch) -> None:
    fp32 = _scorer(model_record).score(batch, 3).logprobs
    bf16 = _scorer(model_record, compute_dtype="bfloat16").score(batch, 3).logprobs
    active = torch.tensor(batch.layout()["active_mask"], dtype=torch.bool)
    assert float((fp32 - bf16).abs()[active].max()) > 1e-3


def test_flash_attention_unsupported_on_cpu(model_record) -> None:
    with pytest.raises(UnsupportedKnobError) as err:
        _scorer(model_record, attention_backend="flash_attention_2")
    assert err.value.path == "training.attention_backend"


def test_fsdp_needs_a_process_group(model_record) -> None:
    with pytest.raises(UnsupportedKnobError) as err:
        _scorer(model_record, sharding="fsdp")
    assert err.value.code == "process_group_missing"
