"""The cpu-smoke runtime: truthful statuses, read-only deterministic scoring, engine reuse."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.core.runs import attempt_doc, only, run_doc
from xconf.adapters.cpu_smoke import engines, side
from xconf.adapters.cpu_smoke.adapter import CpuSmokeRuntime
from xconf.config.strict import parse_experiment
from xconf.operators.catalog import Side
from xconf.runtime.materialization import materialize
from xconf.side_scoring import frozen_inputs


@pytest.mark.parametrize(
    ("path", "value", "status", "materialized"),
    [
        ("rollout.tensor_parallel_size", 1, "applied", 1),
        ("rollout.tensor_parallel_size", 2, "unsupported", None),
        ("rollout.context_parallel_size", 4, "unsupported", None),
        ("training.sharding", "unsharded", "applied", "unsharded"),
        ("training.sharding", "fsdp", "unsupported", None),
        ("training.attention_backend", "flash_attention_2", "unsupported", None),
        ("training.attention_backend", "native", "applied", "sdpa"),
        ("training.attention_backend", "eager", "applied", "eager"),
        ("rollout.dtype", "bfloat16", "applied", "bfloat16"),
        ("batch.size", 3, "applied", 3),
        # extended knobs: the synthetic engines have no code for them
        ("training.remove_padding", False, "unsupported", None),
        ("rollout.kv_cache_dtype", "auto", "unsupported", None),
    ],
)
def test_materialization_is_truthful(path, value, status, materialized) -> None:
    slot: Side = "training" if path.startswith("training") else "rollout"
    handlers = CpuSmokeRuntime().sides.handlers()[slot]
    record = materialize(handlers, CpuSmokeRuntime().view(), path, slot, value, {})
    assert (record.status, record.materialized, record.requested) == (status, materialized, value)
    assert record.evidence


def test_a_knob_the_runtime_has_no_code_for_is_unsupported(monkeypatch) -> None:
    """Every adapter once ended in a branch that reported any other knob as applied."""
    from xconf.knobs import KNOBS, KnobSpec
    from xconf.runtime import protocol

    novel = KnobSpec("rollout.novel_knob", "engine_construction", "bool", "rollout", "test")
    monkeypatch.setattr(protocol, "KNOBS", {**KNOBS, novel.path: novel})
    record = materialize(
        side.ROLLOUT.handlers, CpuSmokeRuntime().view(), novel.path, "rollout", True, {}
    )
    assert (record.status, record.materialized) == ("unsupported", None)
    assert "novel_knob" in record.evidence


UNSUPPORTED: dict[str, list[Any]] = {
    "rollout__tensor_parallel_size": [2],
    "rollout__context_parallel_size": [2],
    "training__sharding": ["fsdp"],
    "training__attention_backend": ["flash_attention_2"],
}


def test_unsupported_cases_end_as_coded_errors(s0_doc, tmp_path) -> None:
    summary = run_doc(only(s0_doc, **UNSUPPORTED), tmp_path)
    results = {r.label: r.result for r in summary.records}
    assert results.pop("baseline") == "pass"
    assert set(results.values()) == {"error"}
    for record in summary.records[1:]:
        comparison = attempt_doc(summary, record.label, "comparison.json")
        assert comparison["error"]["code"] == "runtime.strict_refused"
        path = record.label.split("=")[0]
        assert comparison["error"]["path"].endswith(path)
        assert "unsupported" in comparison["reason"]
    # error attempts are sealed for the record but never reused
    again = run_doc(s0_doc, tmp_path)
    assert [r.reused for r in again.records] == [True, False, False, False, False]
    assert {r.attempt_id for r in again.records[1:]} == {"a-0002"}


def test_engines_are_reused_only_when_fingerprints_match(s0_doc, tmp_path) -> None:
    summary = run_doc(only(s0_doc, batch__size=[1, 4]), tmp_path / "a")
    assert (summary.engines_built, summary.engines_reused) == (2, 4)
    summary = run_doc(only(s0_doc, rollout__dtype=["bf16"]), tmp_path / "b", reuse_sides=False)
    assert (summary.engines_built, summary.engines_reused) == (3, 1)
    # With side reuse (the default) the training engine is not even asked for: the bfloat16
    # rollout case takes the baseline's training scores.
    summary = run_doc(only(s0_doc, rollout__dtype=["bf16"]), tmp_path / "c")
    assert (summary.engines_built, summary.engines_reused, summary.sides_reused) == (3, 0, 1)


def test_scoring_is_read_only_and_deterministic(s0_doc) -> None:
    identity = parse_experiment(s0_doc).identity
    inputs = frozen_inputs(identity)
    runtime = CpuSmokeRuntime()
    rollout = engines.RolloutEngine(
        runtime.model_config,
        "float32",
        prefix_caching=True,
        eager=True,
        mode="decode",
        readback=side.ROLLOUT.readback,
    )
    training = engines.TrainingEngine(
        runtime.model_config, "float32", "sdpa", readback=side.TRAINING.readback
    )
    training.model.train()
    for engine in (rollout, training):
        first = engine.score(inputs, identity, 2, None)
        second = engine.score(inputs, identity, 3, None)
        assert first.evidence.state_digest_before == first.evidence.state_digest_after
        assert first.evidence.mode_restored and not first.evidence.generated_tokens
        assert first.logprobs.dtype == torch.float32
        assert first.logprobs.shape == inputs.token_ids.shape
        assert torch.equal(first.scored_token_ids, inputs.token_ids)
        assert engine.readback()["batch.size"] == 3
        assert torch.allclose(first.logprobs, second.logprobs, atol=1e-5)
    assert training.model.training  # mode restored
    assert training.score(inputs, identity, 2, None).evidence.used_kv_cache is False
    assert rollout.score(inputs, identity, 2, None).evidence.used_kv_cache is True
    assert rollout.prefix_hits > 0


def test_readback_fallback_is_refused_under_strict_execution(s0_doc, tmp_path, monkeypatch) -> None:
    original = engines.RolloutEngine.readback

    def lying(self):
        return {**original(self), "rollout.enforce_eager": not self.eager}

    monkeypatch.setattr(engines.RolloutEngine, "readback", lying)
    summary = run_doc(only(s0_doc), tmp_path / "strict")
    (record,) = summary.records
    assert record.result == "error"
    assert record.reason is not None and "fell back" in record.reason
    actual = attempt_doc(summary, "baseline", "actual.json")
    eager = next(k for k in actual["sides"]["rollout"] if k["path"] == "rollout.enforce_eager")
    assert (eager["status"], eager["requested"], eager["actual"]) == ("fallback", True, False)

    s0_doc["strict_fallback"] = False
    summary = run_doc(s0_doc, tmp_path / "lenient")
    assert summary.records[0].result == "pass"


def test_unobservable_critical_knob_is_refused(s0_doc, tmp_path, monkeypatch) -> None:
    original = engines.TrainingEngine.readback

    def partial(self):
        values = dict(original(self))
        del values["training.attention_backend"]
        return values

    monkeypatch.setattr(engines.TrainingEngine, "readback", partial)
    (record,) = run_doc(only(s0_doc), tmp_path).records
    assert record.result == "error"
    assert record.reason is not None
    assert "training:training.attention_backend" in record.reason
    assert "cannot observe" in record.reason
    assert "engine state does not expose it" in record.reason  # its evidence, on the terminal


def test_identity_checkpoint_mismatch_is_invalid_identity(s0_doc, tmp_path) -> None:
    s0_doc["identity"]["checkpoint_id"] = "another-model"
    summary = run_doc(only(s0_doc), tmp_path)
    assert summary.records[0].result == "invalid_identity"
    error = attempt_doc(summary, "baseline", "comparison.json")["error"]
    assert error["code"] == "runtime.checkpoint_mismatch"
    assert error["path"] == "identity.checkpoint_id"


def test_adapter_records_environment_and_scorers(s0_doc) -> None:
    runtime = CpuSmokeRuntime()
    env = dict(runtime.environment())
    assert env["runtime"] == "cpu-smoke/1"
    assert env["model"].startswith("synthetic-causal-v1")
    assert runtime.freeze_identity(parse_experiment(s0_doc).identity).num_samples == 4


def test_prefix_cached_engine_can_be_reused_for_the_same_tokens(s0_doc, tmp_path) -> None:
    s0_doc["baseline"]["rollout"]["enable_prefix_caching"] = True
    summary = run_doc(only(s0_doc, batch__size=[1, 4]), tmp_path)
    assert summary.engines_reused == 4
    assert [r.result for r in summary.records] == ["pass", "pass", "pass"]
