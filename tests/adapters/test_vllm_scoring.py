"""vLLM rollout scoring on CPU against the transformers recomputation (float32 and bf16)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.adapters.conftest import needs_vllm
from xconf.adapters.frozen import FrozenBatch

pytestmark = [needs_vllm, pytest.mark.slow]
FP32_THRESHOLD = 1e-5  # the contract's float32 selected-logprob threshold


def _active(batch: FrozenBatch) -> torch.Tensor:
    return torch.tensor(batch.layout()["active_mask"], dtype=torch.bool)


@pytest.fixture(scope="module")
def hf_fp32(model_record: Any, frozen_batch: FrozenBatch) -> torch.Tensor:
    from xconf.adapters.hf.model import TrainingScorerConfig
    from xconf.adapters.hf.scorer import HFTrainingScorer

    scorer = HFTrainingScorer(TrainingScorerConfig(model_path=model_record.path))
    return scorer.score(frozen_batch, 4).logprobs


def test_baseline_rollout_is_seeded_and_frozen(vllm_results: dict[Any, Any]) -> None:
    batch = vllm_results["batch"]
    assert vllm_results["batch_again"] == batch
    assert len(batch.samples) == 4
    assert all(len(s.response_ids) == 12 for s in batch.samples)


def test_decode_and_prefill_agree_in_float32(vllm_results: dict[Any, Any], frozen_batch) -> None:
    active = _active(frozen_batch)
    decode = vllm_results[("float32", "decode", 4)]
    for key in (("float32", "decode", 1), ("float32", "prefill", 1), ("float32", "prefill", 4)):
        diff = (vllm_results[key] - decode).abs()[active]
        assert float(diff.max()) <= FP32_THRESHOLD, key


def test_float32_rollout_matches_hf_float32(vllm_results, frozen_batch, hf_fp32) -> None:
    active = _active(frozen_batch)
    for mode in ("decode", "prefill"):
        diff = (vllm_results[("float32", mode, 4)] - hf_fp32).abs()[active]
        assert int(active.sum()) == 48
        assert float(diff.max()) <= FP32_THRESHOLD, (mode, float(diff.max()))
        assert torch.isfinite(vllm_results[("float32", mode, 4)][active]).all()


def test_bfloat16_rollout_drifts_past_float32_threshold(
    vllm_results, frozen_batch, hf_fp32
) -> None:
    active = _active(frozen_batch)
    diff = (vllm_results[("bfloat16", "decode", 4)] - hf_fp32).abs()[active]
    assert float(diff.max()) > 1e-2  # measured ~0.09 on this model


def test_injected_operator_on_raw_logits_matches_native(vllm_results, frozen_batch) -> None:
    active = _active(frozen_batch)
    diff = (vllm_results[("logits", "decode", 4)] - vllm_results[("float32", "decode", 4)]).abs()
    assert float(diff[active].max()) <= FP32_THRESHOLD


@pytest.mark.parametrize("mode", ["decode", "prefill"])
def test_operator_rows_are_bitwise_the_engines_full_vocabulary_logprobs(
    vllm_results: dict[Any, Any], mode: str
) -> None:
    """The rows the engine keeps as tensors are, bit for bit, the ones vLLM hands out as
    per-token dicts of every vocabulary entry (the path the scorer took before)."""
    from xconf.ops.reference import ReferenceSelectedLogprob

    kept, scores = vllm_results[("rows_kept", mode)]
    dicts = vllm_results[("rows_dicts", mode)]
    assert len(kept) == len(dicts) == 4
    for ours, theirs in zip(kept, dicts, strict=True):
        assert ours.dtype == theirs.dtype == torch.float32
        assert ours.shape == theirs.shape and ours.shape[1] == 512, (ours.shape, theirs.shape)
        assert torch.equal(ours, theirs)
    # ... so the operator's scores are the ones the dict path gave, bit for bit.
    reference = ReferenceSelectedLogprob()
    for b, (sample, theirs) in enumerate(zip(vllm_results["batch"].samples, dicts, strict=True)):
        # decode scores the response tokens, prefill every token after the first
        first = len(sample.prompt_ids) - 1 if mode == "decode" else 0
        target = torch.tensor(sample.token_ids[first + 1 :])
        want = reference(theirs, target, torch.ones(len(target), dtype=torch.bool))
        assert torch.equal(scores[b, first : sample.length - 1], want), b


def test_readback_reports_the_live_engine(vllm_results: dict[Any, Any]) -> None:
    """Each knob read by its handler from the engine's live state (the side's readback)."""
    from xconf.adapters.vllm.side import VLLM

    states = vllm_results["readback_fp32"], vllm_results["readback_bf16"]
    fp32, bf16 = (dict[str, Any](VLLM.readback(state)) for state in states)
    assert fp32["rollout.dtype"] == "float32" and bf16["rollout.dtype"] == "bfloat16"
    assert fp32["rollout.enable_prefix_caching"] is False
    # Prefix caching reads as on only when the scored pass was served from the cache: the
    # hits come from the engine itself, never from the requested setting.
    assert bf16["rollout.prefix_cache_hits"] is not None
    assert bf16["rollout.enable_prefix_caching"] is (bf16["rollout.prefix_cache_hits"] > 0)
    assert fp32["rollout.enforce_eager"] is True
    # the lm_head in the compute dtype, as the engines' workers built it (no head_dtype override)
    assert fp32["rollout.logits_dtype"] == bf16["rollout.logits_dtype"] == "model"
    assert fp32["rollout.compilation_mode"] == "NONE"
    assert fp32["rollout.tensor_parallel_size"] == 1
    assert fp32["rollout.engine_logprobs_mode"] == "raw_logprobs"
    assert fp32["rollout.kv_cache_memory_bytes"] == 64 << 20
    workers = states[1].workers
    assert workers and workers[0]["param_dtypes"] == ["bfloat16"]
    assert workers[0]["tp_world_size"] == 1


def test_forced_decoding_refuses_divergence(model_record: Any, frozen_batch: FrozenBatch) -> None:
    """An engine that emits anything but the frozen tokens is an identity violation."""
    from xconf.adapters.errors import IdentityViolationError
    from xconf.adapters.vllm import scorer as vllm_scorer
    from xconf.adapters.vllm.engine import RolloutEngineConfig

    class FakeCompletion:
        token_ids = (0,) * 12
        logprobs = None

    class FakeOut:
        outputs = (FakeCompletion(),)

    class FakeLLM:
        def generate(self, prompts, params, use_tqdm=False):
            return [FakeOut() for _ in prompts]

    class FakeEngine:
        llm = FakeLLM()
        cfg = RolloutEngineConfig(model_path="fake")  # the sampling its requests ask with

        def note_request(self, n: int, cached_tokens: int = 0) -> None:
            return None

    with pytest.raises(IdentityViolationError):
        vllm_scorer._score_decode(FakeEngine(), list(frozen_batch.samples[:1]), None)  # type: ignore[arg-type]
