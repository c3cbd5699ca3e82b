"""ReportData: verdict order, attribution, diagnostics, materialization, provenance, JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from report_fixtures import case_id_for

from xconf.report.build import build_report
from xconf.report.model import ReportData
from xconf.report.writer import render

OFFSET = case_id_for({"logp.backend": "smoke_only.logp_offset"})
BF16 = case_id_for({"rollout.dtype": "bfloat16"})
TAMPERED_ONLY = case_id_for({"training.attention_backend": "eager"})
RETRIED = case_id_for({"rollout.enforce_eager": False})


@pytest.fixture
def data(run_dir: Path) -> ReportData:
    return build_report(run_dir)


def _case(data: ReportData, case_id: str):
    return next(c for c in data.cases if c.case_id == case_id)


def test_baseline_first_then_failures_worst_first_then_the_rest(data: ReportData) -> None:
    results = [c.result for c in data.cases]
    assert data.cases[0].is_baseline and data.cases[0].result == "pass"
    assert [c.case_id for c in data.cases[1:3]] == [OFFSET, BF16]  # 100% before 6.8%
    assert results[3:] == [
        "invalid_artifact",
        "invalid_artifact",
        "error",
        "zero_active_tokens",
        "pass",
    ]
    assert data.failures[0].case_id == OFFSET
    assert data.counts["fail"] == 2 and data.counts["pass"] == 2


def test_failing_case_numbers_and_threshold_line(data: ReportData) -> None:
    offset = _case(data, OFFSET)
    assert (offset.active_tokens, offset.mismatches, offset.mismatch_ratio) == (44, 44, 1.0)
    assert offset.threshold == 1e-5 and offset.threshold_dtype == "float32"
    assert offset.histogram is not None
    assert offset.histogram.threshold_line == 1e-5
    assert offset.histogram.above_threshold == 44
    assert offset.recomputed.startswith("agrees (44 mismatches")
    bf16 = _case(data, BF16)
    assert bf16.threshold == 5e-2 and bf16.threshold_rule == "less_precise_dtype"
    assert bf16.histogram is not None and bf16.histogram.above_threshold == 3 == bf16.mismatches
    edges = bf16.histogram.edges
    assert edges[0] <= 5e-2 <= edges[-1]
    assert sum(bf16.histogram.counts) + bf16.histogram.zero_count == 44


def test_worst_tokens_of_failures_are_sorted_with_both_logprobs(data: ReportData) -> None:
    worst = _case(data, BF16).worst_tokens
    assert len(worst) == 10
    assert [round(t.abs_diff or 0, 2) for t in worst[:3]] == [0.21, 0.08, 0.06]
    first = worst[0]
    assert (first.batch, first.position, first.mismatch) == (0, 5, True)
    assert first.rollout_logprob is not None and first.training_logprob is not None
    assert abs(abs(first.training_logprob - first.rollout_logprob) - 0.21) < 1e-5
    assert first.token_id == 9 and first.text is None  # selected ids; no local tokenizer
    assert _case(data, case_id_for({})).worst_tokens == ()  # passes list none


def test_worst_tokens_are_decoded_with_a_local_tokenizer(tmp_path: Path) -> None:
    from report_fixtures import standard_specs, write_run

    vocab = tmp_path / "tok"
    vocab.mkdir()
    (vocab / "vocab.json").write_text(json.dumps({f"tok{i}": i for i in range(64)}))
    run = write_run(tmp_path / "out", "exp-tok", standard_specs(), tokenizer_id=str(vocab))
    worst = _case(build_report(run), BF16).worst_tokens
    assert worst[0].text == "tok9"


def test_broken_attempts_never_lend_their_numbers(data: ReportData) -> None:
    tampered = _case(data, TAMPERED_ONLY)
    assert tampered.result == "invalid_artifact"
    assert tampered.mismatches is None and tampered.histogram is None
    assert "comparison.json does not match its seal" in (tampered.reason or "")
    retried = _case(data, RETRIED)
    assert retried.result == "pass" and retried.attempt_id == "a-0001"
    assert [(a.attempt_id, a.seal_verified, a.chosen) for a in retried.attempts] == [
        ("a-0001", True, True),
        ("a-0002", False, False),
    ]


def test_error_and_zero_active_cases(data: ReportData) -> None:
    error = _case(data, case_id_for({"training.sharding": "fsdp"}))
    assert error.result == "error"
    assert error.reason == "[runtime.engine_failed] engine construction failed at rollout"
    assert error.mismatches is None and error.histogram is None and error.problems == ()
    zero = _case(data, case_id_for({"batch.size": 8}))
    assert zero.result == "zero_active_tokens" and zero.active_tokens == 0
    assert zero.histogram is None


def test_attribution_sets_each_intervention_beside_the_baseline(data: ReportData) -> None:
    baseline = data.baseline
    assert baseline is not None and baseline.diff.max is not None
    rows = {a.case_id: a for a in data.attribution}
    assert set(rows) == {c.case_id for c in data.cases if not c.is_baseline}
    offset = rows[OFFSET]
    assert offset.baseline_max_abs_diff == baseline.diff.max
    assert offset.baseline_mismatch_ratio == 0.0 and offset.mismatch_ratio == 1.0
    assert offset.log10_shift is not None and offset.log10_shift > 3
    ranking = [k.knob for k in data.knob_ranking]
    # Ranked by the rise in mean |diff| (bfloat16's ~1.6e-2 over the offset's 1e-3), not by
    # mismatches, which follow each case's own threshold.
    assert ranking[:3] == ["rollout.dtype", "logp.backend", "rollout.enforce_eager"]
    assert data.knob_ranking[0].worst_case_id == BF16


def test_materialization_rows_join_the_three_stages(data: ReportData) -> None:
    rows = _case(data, BF16).materialization
    assert len(rows) == 20  # ten knobs on each side
    dtype = next(r for r in rows if r.side == "rollout" and r.path == "rollout.dtype")
    assert (dtype.requested, dtype.materialized, dtype.actual) == ("bfloat16",) * 3
    assert dtype.status == "applied" and dtype.lifecycle == "engine_construction"
    assert dtype.evidence == "engine readback: bfloat16"


def test_contract_and_provenance(data: ReportData) -> None:
    assert len(data.contracts) == 1
    contract = data.contracts[0]
    assert contract.version == "2026.11.0" and contract.sha256 and len(contract.sha256) == 64
    assert ("bfloat16", 0.05) in contract.thresholds and ("float32", 1e-05) in contract.thresholds
    assert data.experiment_id == "exp-report" and data.baseline_case_id == case_id_for({})
    unverified = [
        (c.case_id, a.attempt_id) for c in data.cases for a in c.attempts if not a.seal_verified
    ]
    assert len(unverified) == 3


def test_json_form_is_plain_data_with_the_same_content(data: ReportData) -> None:
    document = json.loads(render(data, "json"))
    assert document["schema"] == "xconf.report.v1"
    cases = document["cases"]
    assert cases[0]["is_baseline"] and cases[1]["case_id"] == OFFSET
    assert cases[1]["histogram"]["threshold_line"] == 1e-5
    assert cases[1]["worst_tokens"][0]["mismatch"] is True
    assert document["knob_ranking"][0]["knob"] == "rollout.dtype"
    effect = document["knob_ranking"][0]["effect"]
    assert effect["delta_low"] > 0 and effect["sequences"] == 2 and effect["seed"] > 0
    assert document["headline"]["most_drift"] == "rollout.dtype"
    assert "NaN" not in render(data, "json")


def test_a_seal_that_disagrees_with_the_verdict_is_invalid(run_dir: Path) -> None:
    import hashlib

    attempt = run_dir / "cases" / OFFSET / "a-0001"
    comparison = json.loads((attempt / "comparison.json").read_text())
    comparison["result"] = "pass"  # resealed consistently, but the seal says fail
    (attempt / "comparison.json").write_text(json.dumps(comparison))
    seal = json.loads((attempt / "COMPLETE").read_text())
    seal["files"]["comparison.json"] = hashlib.sha256(
        (attempt / "comparison.json").read_bytes()
    ).hexdigest()
    (attempt / "COMPLETE").write_text(json.dumps(seal))
    case = _case(build_report(run_dir), OFFSET)
    assert case.result == "invalid_artifact"
    assert case.reason == (
        "no attempt has a verified seal "
        "(a-0001: COMPLETE seals result 'fail', comparison.json says 'pass')"
    )


def test_hub_cache_tokenizer_json_is_used_offline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from report_fixtures import standard_specs, write_run

    snapshot = tmp_path / "hub" / "models--org--tiny" / "snapshots" / "abc"
    snapshot.mkdir(parents=True)
    document = {
        "model": {"type": "WordLevel", "vocab": {f"w{i}": i for i in range(64)}},
        "added_tokens": [{"id": 9, "content": "<nine>"}],
    }
    (snapshot / "tokenizer.json").write_text(json.dumps(document))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    run = write_run(tmp_path / "out", "exp-hub", standard_specs(), tokenizer_id="org/tiny")
    worst = _case(build_report(run), BF16).worst_tokens
    assert worst[0].text in ("<nine>", "w9")  # the tokenizers library, or the JSON fallback


def test_pairwise_and_unplanned_cases(tmp_path: Path) -> None:
    import shutil

    import numpy as np
    from report_fixtures import CaseSpec, logprobs, write_run

    base = logprobs(1, 8, 0)
    active = np.ones(base.shape, dtype=bool)
    pair = {"rollout.dtype": "bfloat16", "batch.size": 4}
    specs = [
        CaseSpec({}, base, base, active, kind="baseline"),
        CaseSpec(pair, base, base + 0.2, active, rollout_dtype="bfloat16", kind="pairwise"),
        CaseSpec({"batch.size": 4}, base, base + 1e-7, active),
    ]
    run = write_run(tmp_path / "out", "exp-pair", specs)
    lines = (run / "plan.jsonl").read_text().splitlines()
    (run / "plan.jsonl").write_text("\n".join(lines[:2]) + "\n")  # the third is unplanned
    data = build_report(run)
    pairwise = _case(data, case_id_for(pair))
    assert pairwise.kind == "pairwise" and pairwise.label == "batch.size=4, rollout.dtype=bfloat16"
    unplanned = _case(data, case_id_for({"batch.size": 4}))
    assert unplanned.kind == "unplanned" and unplanned.label == "batch.size=4"
    assert any("has attempts but no plan.jsonl row" in p for p in data.problems)
    assert [k.knob for k in data.knob_ranking] == ["batch.size × rollout.dtype", "batch.size"]
    shutil.rmtree(run / "cases" / case_id_for({}))
    assert build_report(run).cases[0].result == "not_run"
