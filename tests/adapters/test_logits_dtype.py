"""``training.logits_dtype`` and ``rollout.logits_dtype`` (the lm_head in float32 on a bfloat16
side) on a checkpoint made with transformers' own classes (tests/adapters/archs.py).

The training scorer's float32 head gives exactly the logprobs of the projection written here
by hand (float32 casts of the hidden states and the weight, then float32 log-softmax),
changes no weight, and reads back what its head returned; vLLM's ``head_dtype`` override reads
back from what the engine's workers built. Where the knob cannot apply it is ``unsupported``
with the reason, and on a float32 model it is the model's own head (``applied_as`` ``model``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.adapters.archs import random_batch, write_checkpoint
from tests.adapters.conftest import needs_hf, needs_vllm
from xconf.operators.catalog import Side

pytestmark = needs_hf


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_checkpoint("llama", tmp_path_factory.mktemp("head") / "llama")


def _batch() -> Any:
    return random_batch(1, ((5, 6), (9, 6)))


def _scorer(path: Path, **kw: Any) -> Any:
    from xconf.adapters.hf.model import TrainingScorerConfig
    from xconf.adapters.hf.scorer import HFTrainingScorer

    return HFTrainingScorer(TrainingScorerConfig(model_path=str(path), **kw))


def _by_hand(hidden: list[Any], batch: Any) -> Any:
    """The float32 projection written here of the hidden states the head was given (one
    sample per forward), then the float32 log-softmax and the frozen token's entry."""
    import torch
    import torch.nn.functional as F

    width = max(s.length for s in batch.samples)
    out = torch.zeros((len(batch.samples), width), dtype=torch.float32)
    for r, (s, (states, weight)) in enumerate(zip(batch.samples, hidden, strict=True)):
        ids = torch.tensor(s.token_ids)
        logp = F.linear(states[0, :-1].float(), weight.float()).log_softmax(dim=-1)
        out[r, : s.length - 1] = logp.gather(-1, ids[1:, None]).squeeze(-1)
    return out


def test_a_float32_head_is_the_float32_projection_and_reads_back(llama: Path) -> None:
    import torch

    from xconf.adapters.hf.handlers import TRAINING
    from xconf.adapters.hf.readonly import state_digest
    from xconf.knobs import TRAINING_LOGITS_DTYPE
    from xconf.runtime.protocol import knob_readback

    batch = _batch()
    active = torch.tensor(batch.layout()["active_mask"], dtype=torch.bool)
    plain = _scorer(llama, compute_dtype="bfloat16")
    head32 = _scorer(llama, compute_dtype="bfloat16", logits_dtype="float32")
    assert state_digest(head32.model) == state_digest(plain.model)  # no weight changed
    assert knob_readback(TRAINING, "training", head32.live())[TRAINING_LOGITS_DTYPE.path] is None
    head = head32.model.get_output_embeddings()
    given: list[Any] = []
    hook = head.register_forward_hook(lambda m, i, o: given.append((i[0], m.weight)))
    score = head32.score(batch, 1)  # one sample per forward: no padding
    hook.remove()
    assert score.digest_before == score.digest_after
    assert given[0][0].dtype == torch.bfloat16
    assert torch.equal(score.logprobs[active], _by_hand(given, batch)[active])
    model_head = plain.score(batch, 1).logprobs
    assert not torch.equal(model_head[active], score.logprobs[active])  # bfloat16 logits
    assert knob_readback(TRAINING, "training", head32.live())[TRAINING_LOGITS_DTYPE.path] == (
        "float32"
    )
    assert knob_readback(TRAINING, "training", plain.live())[TRAINING_LOGITS_DTYPE.path] == (
        "model"
    )


def _request(path: str, side: Side, value: str, **knobs: Any) -> Any:
    from xconf.knobs import KNOBS
    from xconf.runtime.protocol import KnobRequest, RuntimeView

    base = {
        "rollout.dtype": "bfloat16",
        "training.compute_dtype": "bfloat16",
        "training.sharding": "unsharded",
    }
    knobs = {**base, **{k.replace("__", "."): v for k, v in knobs.items()}}
    return KnobRequest(KNOBS[path], side, value, knobs, RuntimeView("vllm-hf", "cpu", None, "vllm"))


@pytest.mark.parametrize(
    ("knobs", "status", "materialized", "named"),
    [
        ({}, "applied", "float32", "F.linear"),
        ({"training__compute_dtype": "float32"}, "applied", "model", "already"),
        ({"training__align__logits": "vllm"}, "unsupported", None, "logits arm"),
        ({"training__align__all": "vllm"}, "unsupported", None, "logits arm"),
        ({"training__sharding": "fsdp"}, "unsupported", None, "unsharded"),
    ],
)
def test_the_training_knob_applies_or_says_why_not(knobs, status, materialized, named) -> None:
    from xconf.adapters.hf.handlers import TRAINING
    from xconf.knobs import TRAINING_LOGITS_DTYPE

    path = TRAINING_LOGITS_DTYPE.path
    app = TRAINING[path].materialize(_request(path, "training", "float32", **knobs))
    assert (app.status, app.materialized) == (status, materialized), app
    assert named in app.evidence


@needs_vllm
def test_the_logits_arm_does_not_mirror_a_float32_rollout_head() -> None:
    from xconf.adapters.hf.align.handlers import support
    from xconf.knobs import TRAINING_ALIGN

    assert support(_request(TRAINING_ALIGN["logits"].path, "training", "vllm"), "logits") is None
    float32_head = _request(
        TRAINING_ALIGN["logits"].path, "training", "vllm", rollout__logits_dtype="float32"
    )
    assert "rollout.logits_dtype=float32" in str(support(float32_head, "logits"))


@needs_vllm
@pytest.mark.slow
def test_vllm_builds_a_float32_head_and_reads_it_back(llama: Path) -> None:
    from xconf.adapters.vllm.engine import RolloutEngineConfig, VllmRolloutEngine
    from xconf.adapters.vllm.handlers import HANDLERS
    from xconf.adapters.vllm.scorer import score_frozen
    from xconf.knobs import ROLLOUT_LOGITS_DTYPE
    from xconf.runtime.protocol import knob_readback

    cfg = RolloutEngineConfig(model_path=str(llama), dtype="bfloat16", logits_dtype="float32")
    with VllmRolloutEngine(cfg) as engine:
        score_frozen(engine, _batch(), "decode", 2)
        live = engine.live()
    assert live.workers is not None
    assert {w["head_dtype"] for w in live.workers} == {"float32"}
    assert knob_readback(HANDLERS, "rollout", live)[ROLLOUT_LOGITS_DTYPE.path] == "float32"
    app = HANDLERS[ROLLOUT_LOGITS_DTYPE.path].materialize(
        _request(ROLLOUT_LOGITS_DTYPE.path, "rollout", "float32")
    )
    assert (app.status, app.materialized) == ("applied", "float32")
    assert "head_dtype" in app.evidence


def test_a_temperature_divides_the_trainer_s_logits_and_reads_back(llama: Path) -> None:
    """``training.temperature=T``: the logprobs are the float32 log-softmax of the logits the
    head returned divided by T (as verl's actor divides them), bitwise; no weight changes;
    the divisor reads back from the forwards that ran (1.0 binds nothing)."""
    import torch

    from xconf.adapters.hf.handlers import TRAINING
    from xconf.adapters.hf.readonly import state_digest
    from xconf.knobs import TRAINING_TEMPERATURE
    from xconf.runtime.protocol import knob_readback

    batch = _batch()
    active = torch.tensor(batch.layout()["active_mask"], dtype=torch.bool)
    plain, hot = _scorer(llama), _scorer(llama, temperature=0.5)
    assert state_digest(hot.model) == state_digest(plain.model)
    assert knob_readback(TRAINING, "training", hot.live())[TRAINING_TEMPERATURE.path] is None
    logits: list[Any] = []
    hook = plain.model.get_output_embeddings().register_forward_hook(
        lambda m, i, o: logits.append(o)
    )
    raw = plain.score(batch, 1).logprobs  # one sample per forward: no padding
    hook.remove()
    score = hot.score(batch, 1)
    assert score.digest_before == score.digest_after
    width = max(s.length for s in batch.samples)
    by_hand = torch.zeros((len(batch.samples), width), dtype=torch.float32)
    for r, (s, z) in enumerate(zip(batch.samples, logits, strict=True)):
        logp = (z[0, :-1].float() / 0.5).log_softmax(dim=-1)
        ids = torch.tensor(s.token_ids)
        by_hand[r, : s.length - 1] = logp.gather(-1, ids[1:, None]).squeeze(-1)
    assert torch.equal(score.logprobs[active], by_hand[active])
    assert not torch.equal(raw[active], score.logprobs[active])
    assert knob_readback(TRAINING, "training", hot.live())[TRAINING_TEMPERATURE.path] == 0.5
    assert knob_readback(TRAINING, "training", plain.live())[TRAINING_TEMPERATURE.path] == 1.0


@pytest.mark.parametrize("raw", [0, -1.0, float("nan"), float("inf"), 1000.0, True, "hot"])
def test_a_temperature_that_is_no_positive_number_is_refused(raw: object) -> None:
    from xconf.knobs import KNOBS, TRAINING_TEMPERATURE, KnobValueError, normalize_value

    with pytest.raises(KnobValueError):
        normalize_value(KNOBS[TRAINING_TEMPERATURE.path], raw)


def test_a_temperature_reads_as_a_float_and_is_unsupported_on_fsdp() -> None:
    from xconf.adapters.hf.handlers import TRAINING
    from xconf.knobs import KNOBS, TRAINING_TEMPERATURE, normalize_value

    spec = KNOBS[TRAINING_TEMPERATURE.path]
    assert normalize_value(spec, 1) == 1.0 and isinstance(normalize_value(spec, 1), float)
    handler = TRAINING[spec.path]
    ok = handler.materialize(_request(spec.path, "training", 0.7))  # type: ignore[arg-type]
    assert ok.status == "applied" and "divided by 0.7" in ok.evidence
    fsdp = handler.materialize(
        _request(spec.path, "training", 0.7, training__sharding="fsdp")  # type: ignore[arg-type]
    )
    assert fsdp.status == "unsupported" and "unsharded" in fsdp.evidence
