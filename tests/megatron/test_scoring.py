"""The Megatron side at TP 1 against transformers on the same frozen tokens, read-only,
every knob read back from the live model; on checkpoints written by transformers' classes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.megatron.conftest import needs_megatron
from tests.megatron.inputs import BATCH, engine, identity, max_diff, score, threshold
from xconf.adapters.errors import ReadOnlyViolationError

pytestmark = needs_megatron


_HF: dict[tuple[str, str], torch.Tensor] = {}


def transformers_scores(root: Path, attention: str = "sdpa") -> torch.Tensor:
    key = (str(root), attention)
    if key not in _HF:
        from xconf.adapters.hf.model import TrainingScorerConfig
        from xconf.adapters.hf.scorer import HFTrainingScorer

        cfg = TrainingScorerConfig(model_path=str(root), attention_backend=attention)
        _HF[key] = HFTrainingScorer(cfg).score(BATCH, 2).logprobs
    return _HF[key]


@pytest.mark.parametrize("name", ["llama", "qwen2", "qwen3", "mistral", "qwen3-gqa"])
def test_megatron_agrees_with_transformers_within_the_float32_threshold(checkpoints, name) -> None:
    root = checkpoints(name)
    got = score(engine(root))
    assert max_diff(got, transformers_scores(root, "eager")) <= threshold()
    assert max_diff(got, transformers_scores(root, "sdpa")) <= threshold()


@pytest.mark.parametrize(
    "settings",
    [
        {"attention_backend": "sdpa"},
        {"remove_padding": True},
        {
            "bias_activation_fusion": True,
            "bias_dropout_fusion": True,
            "cross_entropy_loss_fusion": True,
        },
    ],
    ids=["sdpa", "packed", "fusions"],
)
def test_each_setting_scores_the_same_tokens_and_reads_back(checkpoints, settings) -> None:
    from xconf.adapters.megatron.handlers import HANDLERS
    from xconf.runtime.protocol import knob_readback

    root = checkpoints("llama-gqa")
    side = engine(root, **settings)
    got = score(side, size=3)
    assert max_diff(got, transformers_scores(root)) <= threshold()
    back = knob_readback(HANDLERS, "training", side.live())
    assert back["batch.size"] == 3 and back["training.tensor_parallel_size"] == 1
    assert back["training.attention_backend"] == settings.get("attention_backend", "eager")
    assert back["training.remove_padding"] is settings.get("remove_padding", False)
    for fusion in ("bias_activation_fusion", "bias_dropout_fusion", "cross_entropy_loss_fusion"):
        assert back[f"training.{fusion}"] is settings.get(fusion, False), fusion
    assert back["training.sequence_parallel"] is False
    assert side.live().request_sizes == (3, 1)


def test_the_engine_scores_the_identity_and_reports_through_its_handlers(checkpoints) -> None:
    """The Engine protocol: the identity's own tensors in, its echo out; every knob value the
    engine reports is its handler's reading of the live state; reset_state forgets the call."""
    from xconf.adapters.megatron.handlers import HANDLERS
    from xconf.runtime.protocol import knob_readback
    from xconf.side_scoring import frozen_inputs

    side = engine(checkpoints("qwen3"))
    result = side.score(frozen_inputs(identity()), identity(), 2, None)
    assert result.identity_digest == identity().digest()
    assert max_diff(result.logprobs, transformers_scores(checkpoints("qwen3"))) <= threshold()
    back = dict(side.readback())
    knobs = knob_readback(HANDLERS, "training", side.live())
    assert {k: back[k] for k in knobs} == knobs
    assert back["training.weights_verified"] == len(list(side.model.parameters()))
    assert back["training.vocab_layout"].shard_bounds == ((0, 384),)
    assert back["training.cross_entropy"] == "unfused"
    side.reset_state()
    assert side.live().request_sizes == () and side.live().cross_entropy is None


def test_operators_get_the_vocabulary_rows_and_agree(checkpoints) -> None:
    """xconf's reference and vocab-parallel operators on the Megatron side's logits agree with
    Megatron's own cross entropy (the native path) within the threshold."""
    from xconf.operators.dispatch import DispatchedOperator
    from xconf.ops.logprob.descriptors import descriptors as vocab_parallel
    from xconf.ops.logprob.selected import VocabParallelSelectedLogprob
    from xconf.ops.reference import ReferenceSelectedLogprob
    from xconf.ops.reference import descriptors as reference

    side = engine(checkpoints("qwen3"))
    native = score(side)
    for impl, descriptor in (
        (ReferenceSelectedLogprob(), reference()[1]),
        (VocabParallelSelectedLogprob(impl="eager"), vocab_parallel()[0]),
    ):
        got = score(side, op=DispatchedOperator(impl, descriptor, "training"))
        assert max_diff(got, native) <= threshold(), descriptor.backend_id
        assert side.live().cross_entropy == "operator"


def test_scoring_changes_nothing_and_a_change_is_caught(checkpoints) -> None:
    side = engine(checkpoints("llama"))
    side.model.train()
    score(side)
    assert side.model.training and all(m.training for m in side.model.modules())
    assert all(p.grad is None for p in side.model.parameters())
    param = next(side.model.parameters())

    def mutate(*_: Any) -> None:  # a hook that writes into a parameter during the forward
        param.data.add_(1.0)

    handle = side.model.decoder.register_forward_hook(mutate)
    try:
        with pytest.raises(ReadOnlyViolationError) as info:
            score(side)
    finally:
        handle.remove()
    assert info.value.code == "parameters_changed"
    assert side.model.training  # the mode is restored even when the guard raises


def test_bfloat16_compute_is_read_back_and_drifts(checkpoints) -> None:
    from xconf.adapters.megatron.handlers import HANDLERS
    from xconf.runtime.protocol import knob_readback

    root = checkpoints("llama")
    side = engine(root, compute_dtype="bfloat16")
    got = score(side)
    assert knob_readback(HANDLERS, "training", side.live())["training.compute_dtype"] == "bfloat16"
    assert max_diff(got, transformers_scores(root)) > 1e-3
