"""Paired runner: verdicts through the real pipeline, execution keys, resume at library level."""

from __future__ import annotations

from pathlib import Path

import torch

from tests.core.runs import attempt_doc, only, run_doc
from xconf import session
from xconf.adapters.cpu_smoke import engines
from xconf.adapters.cpu_smoke.adapter import CpuSmokeRuntime
from xconf.case_record import CaseRecord, RunStep
from xconf.operators.capability import BackendCapability
from xconf.operators.catalog import SELECTED_LOGPROB, OperatorDescriptor
from xconf.ops.reference import ReferenceSelectedLogprob


class NanOnTraining:
    """A deliberately broken operator: NaN on every active training token."""

    def __init__(self, side: str) -> None:
        self.side = side

    def __call__(self, logits, targets, active):
        selected = ReferenceSelectedLogprob()(logits, targets, active)
        if self.side == "training":
            return torch.where(active.bool(), torch.full_like(selected, float("nan")), selected)
        return selected


def _with_nan_operator(monkeypatch) -> None:
    original = session.make_catalog

    def make_catalog(allow_smoke_operators: bool):
        catalog = original(allow_smoke_operators)
        catalog.register(
            OperatorDescriptor(
                semantic_operation=SELECTED_LOGPROB,
                backend_id="test.nan_logp",
                factory=f"{__name__}:NanOnTraining",
                version="1",
                capabilities=(BackendCapability(platform="cpu", tier="reference"),),
                factory_takes_side=True,
            )
        )
        return catalog

    monkeypatch.setattr(session, "make_catalog", make_catalog)


def test_offset_fails_and_references_pass(s0_doc, tmp_path) -> None:
    doc = only(
        s0_doc,
        logp__backend=[
            "xconf.reference_logp",
            "smoke_only.logp_reference",
            "smoke_only.logp_offset",
        ],
    )
    summary = run_doc(doc, tmp_path)
    results = {r.label: r.result for r in summary.records}
    assert results == {
        "baseline": "pass",
        "logp.backend=xconf.reference_logp": "pass",
        "logp.backend=smoke_only.logp_reference": "pass",
        "logp.backend=smoke_only.logp_offset": "fail",
    }
    offset = next(r for r in summary.records if r.result == "fail")
    assert offset.mismatches == offset.active_tokens == 40
    assert offset.max_abs_diff is not None
    assert abs(offset.max_abs_diff - 0.25) < 1e-4  # offset plus the path's own drift


def test_non_finite_active_scores_are_invalid_artifact(s0_doc, tmp_path, monkeypatch) -> None:
    _with_nan_operator(monkeypatch)
    (_, record) = run_doc(only(s0_doc, logp__backend=["test.nan_logp"]), tmp_path).records
    assert record.result == "invalid_artifact"
    assert record.reason is not None and "non-finite" in record.reason


def test_zero_active_tokens_through_the_runner(s0_doc, tmp_path) -> None:
    mask = s0_doc["identity"]["active_mask"]
    s0_doc["identity"]["active_mask"] = [[0] * len(row) for row in mask]
    (record,) = run_doc(only(s0_doc), tmp_path).records
    assert record.result == "zero_active_tokens"
    assert record.active_tokens == 0


def test_training_kv_cache_is_invalid_identity(s0_doc, tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(engines.TrainingEngine, "_uses_kv_cache", lambda self: True)
    summary = run_doc(only(s0_doc), tmp_path)
    assert summary.records[0].result == "invalid_identity"
    doc = attempt_doc(summary, "baseline", "comparison.json")
    assert doc["identity"]["violations"] == [
        "training scorer used a KV cache, which the identity forbids "
        "(cache_metadata.training_kv_cache is not 'allowed')"
    ]


def test_training_kv_cache_is_valid_where_the_identity_allows_it(
    s0_doc, tmp_path, monkeypatch
) -> None:
    """The decode scoring mode's KV cache is the identity's to allow (docs/arms.md)."""
    monkeypatch.setattr(engines.TrainingEngine, "_uses_kv_cache", lambda self: True)
    s0_doc["identity"]["cache_metadata"] = {"training_kv_cache": "allowed"}
    (record,) = run_doc(only(s0_doc), tmp_path).records
    assert record.result == "pass", record


def test_state_change_is_invalid_identity(s0_doc, tmp_path, monkeypatch) -> None:
    def mutating(self, token_ids, position_ids):
        self.model.norm_eps.add_(1e-3)  # a scorer that touches a buffer
        return self.model.forward_full(token_ids, position_ids, self.attention)

    monkeypatch.setattr(engines.TrainingEngine, "_logits", mutating)
    (record,) = run_doc(only(s0_doc), tmp_path).records
    assert record.result == "invalid_identity"
    assert record.reason is not None
    assert "changed its parameters or buffers" in record.reason


def test_rerun_reuses_and_no_resume_scores_again(s0_doc, tmp_path) -> None:
    doc = only(s0_doc, batch__size=[1])
    first = run_doc(doc, tmp_path)
    again = run_doc(doc, tmp_path)
    assert [r.reused for r in again.records] == [True, True]
    assert (again.engines_built, again.engines_reused) == (0, 0)
    fresh = run_doc(doc, tmp_path, resume=False)
    assert [r.attempt_id for r in fresh.records] == ["a-0002", "a-0002"]
    assert [r.result for r in fresh.records] == [r.result for r in first.records]


class _OtherVersion(CpuSmokeRuntime):
    version = "2"

    def environment(self):
        return {**super().environment(), "runtime": "cpu-smoke/2"}


def test_changed_environment_is_not_reused(s0_doc, tmp_path) -> None:
    doc = only(s0_doc)
    first = run_doc(doc, tmp_path)
    second = run_doc(doc, tmp_path, adapter=_OtherVersion())
    assert not second.records[0].reused
    assert second.records[0].attempt_id == "a-0002"
    third = run_doc(doc, tmp_path)  # the older, matching attempt is still valid
    assert third.records[0].reused and third.records[0].attempt_id == "a-0001"
    assert first.records[0].case_id == second.records[0].case_id  # readback never renames a case


def test_an_attempt_sealed_on_another_cpu_is_not_reused(s0_doc, tmp_path, monkeypatch) -> None:
    from xconf import runner
    from xconf.runtime.machine import this_machine

    doc = only(s0_doc)
    first = run_doc(doc, tmp_path)
    here = attempt_doc(first, "baseline", "actual.json")["environment"]
    assert {k: here[k] for k in ("cpu", "cpu_isa")} == {
        k: this_machine()[k] for k in ("cpu", "cpu_isa")
    }
    # The same run on a CPU without avx512_bf16 (other bfloat16 kernels): scored again.
    other = {**this_machine(), "cpu_isa": "avx2 avx512f"}
    monkeypatch.setattr(runner, "this_machine", lambda: dict(other))
    second = run_doc(doc, tmp_path)
    assert not second.records[0].reused and second.records[0].attempt_id == "a-0002"
    recorded = attempt_doc(second, "baseline", "actual.json")["environment"]
    assert recorded["cpu_isa"] == "avx2 avx512f"
    monkeypatch.undo()
    third = run_doc(doc, tmp_path)  # back on this machine: its own attempt resumes
    assert third.records[0].reused and third.records[0].attempt_id == "a-0001"


def test_a_run_reports_its_steps_between_cases(s0_doc, tmp_path) -> None:
    from xconf.adapters.cpu_smoke.adapter import CpuSmokeRuntime
    from xconf.config.strict import parse_experiment

    events: list[object] = []
    prepared = session.prepare(
        parse_experiment(only(s0_doc, rollout__dtype=["bf16"])),
        output_root=tmp_path,
        allow_smoke_operators=True,
        device="cpu",
    )
    summary = session.run_prepared(
        prepared, CpuSmokeRuntime(), resume=True, on_case=events.append, on_step=events.append
    )
    steps = [e for e in events if isinstance(e, RunStep)]
    assert steps[0].kind == "identity" and events.index(steps[0]) == 0
    assert [e for e in events if isinstance(e, CaseRecord)] == summary.records
    built = [s for s in steps if s.kind == "engine"]
    assert len(built) == summary.engines_built == 3  # two for the baseline, one for bf16
    assert [(events.index(s), s.what) for s in built] == [
        (1, "rollout engine built for baseline"),
        (2, "training engine built for baseline"),
        (4, "rollout engine built for rollout.dtype=bfloat16"),  # after the baseline's record
    ]
    assert all(s.seconds >= 0 for s in steps)


def test_records_keep_plan_order_and_summary_counts(s0_doc, tmp_path) -> None:
    doc = only(s0_doc, rollout__dtype=["bf16"], batch__size=[1])
    summary = run_doc(doc, tmp_path)
    assert [r.label for r in summary.records] == [
        "baseline",
        "rollout.dtype=bfloat16",
        "batch.size=1",
    ]
    # Every side is scored on an engine or taken from a side the run scored alike: the
    # bfloat16 rollout case's training side is the baseline's (batch.size is both sides').
    sides = summary.engines_built + summary.engines_reused + summary.sides_reused
    assert sides == 2 * len(summary.records) and summary.sides_reused == 1
    assert Path(summary.experiment_dir) == tmp_path / "cpu-smoke-json"
    assert summary.seconds["total"] > 0


def test_each_scored_case_gets_its_own_operator_session(s0_doc, tmp_path, monkeypatch) -> None:
    from xconf import side_scoring

    sessions = []
    real = side_scoring.OperatorSession

    def counting(*args, **kwargs):
        sessions.append(real(*args, **kwargs))
        return sessions[-1]

    monkeypatch.setattr(side_scoring, "OperatorSession", counting)
    run_doc(only(s0_doc, logp__backend=["xconf.reference_logp"], batch__size=[1]), tmp_path)
    assert len(sessions) == 3
    assert [len(s.provenance()) for s in sessions] == [2, 2, 2]
    assert len({id(s) for s in sessions}) == 3


def test_catalog_changed_after_planning_is_a_stale_binding(s0_doc, tmp_path) -> None:
    from xconf.config.strict import parse_experiment
    from xconf.operators.catalog import SELECTED_LOGPROB as OP

    doc = only(s0_doc, logp__backend=["xconf.reference_logp"])
    prepared = session.prepare(
        parse_experiment(doc), output_root=tmp_path, allow_smoke_operators=False, device="cpu"
    )
    ref = prepared.catalog.get(OP, "xconf.reference_logp")
    assert ref is not None
    from dataclasses import replace

    prepared.catalog.register(replace(ref, version="2"), replace=True)
    summary = session.run_prepared(prepared, CpuSmokeRuntime(), resume=True)
    assert [r.result for r in summary.records] == ["pass", "error"]
    comparison = attempt_doc(summary, "logp.backend=xconf.reference_logp", "comparison.json")
    assert comparison["error"]["code"] == "operator.stale_binding"
