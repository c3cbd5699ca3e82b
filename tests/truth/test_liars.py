"""Each misbehaving runtime is wrong on exactly one case; that case ends honest, never pass."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.core.runs import attempt_doc, only, run_doc
from tests.truth import liars
from xconf.artifacts.store import read_tensors
from xconf.report.build import build_report

S0_INTERVENTIONS: dict[str, list[Any]] = {
    "batch__size": [1],
    "rollout__enable_prefix_caching": [True],
    "rollout__enforce_eager": [False],
    "training__attention_backend": ["eager"],
    "rollout__dtype": ["bfloat16"],
}
HONEST = {  # what the unmodified cpu-smoke gives every case of this plan
    "baseline": "pass",
    "batch.size=1": "pass",
    "rollout.enable_prefix_caching=True": "pass",
    "rollout.enforce_eager=False": "pass",
    "training.attention_backend=eager": "pass",
    "rollout.dtype=bfloat16": "fail",  # bf16 rollout honestly drifts past 5e-2
}


def _run(s0_doc, tmp_path: Path, adapter, **changes):
    doc = only(copy.deepcopy(s0_doc), **S0_INTERVENTIONS)
    doc.update(changes)
    return run_doc(doc, tmp_path, adapter=adapter)


def _results(summary) -> dict[str, str]:
    return {r.label: r.result for r in summary.records}


def _only_changed(summary, label: str, result: str) -> None:
    assert _results(summary) == {**HONEST, label: result}


def test_the_plan_passes_on_the_honest_runtime(s0_doc, tmp_path) -> None:
    summary = _run(s0_doc, tmp_path, liars.SameAsCpuSmoke())
    assert _results(summary) == HONEST
    assert all(r.intervention_applied for r in summary.records)
    derived = attempt_doc(summary, "baseline", "actual.json")["derived"]
    for side in ("rollout", "training"):  # the synthetic head as built: 97 columns, one shard
        layout = derived[side][f"{side}.vocab_layout"]
        assert (layout["padded_vocab_size"], layout["shard_bounds"]) == (97, [[0, 97]]), layout


def test_ignored_declared_knob_is_an_error_naming_it_under_strict(s0_doc, tmp_path) -> None:
    summary = _run(s0_doc, tmp_path, liars.IgnoresEager())
    _only_changed(summary, "rollout.enforce_eager=False", "error")
    error = attempt_doc(summary, "rollout.enforce_eager=False", "comparison.json")["error"]
    assert error["code"] == "runtime.strict_refused"
    assert error["path"] == "rollout:rollout.enforce_eager"


def test_ignored_declared_knob_without_strict_is_marked_and_unranked(s0_doc, tmp_path) -> None:
    summary = _run(s0_doc, tmp_path, liars.IgnoresEager(), strict_fallback=False)
    _only_changed(summary, "rollout.enforce_eager=False", "pass")
    applied = {r.label: r.intervention_applied for r in summary.records}
    assert applied == {label: label != "rollout.enforce_eager=False" for label in HONEST}
    doc = attempt_doc(summary, "rollout.enforce_eager=False", "comparison.json")
    assert doc["intervention"]["applied"] is False
    assert doc["intervention"]["not_applied"][0]["path"] == "rollout.enforce_eager"
    report = build_report(summary.experiment_dir)
    ranked = {k.knob for k in report.knob_ranking}
    assert "rollout.enforce_eager" not in ranked and "batch.size" in ranked
    case = next(c for c in report.cases if c.changed == (("rollout.enforce_eager", False),))
    assert case.intervention_applied is False
    assert report.to_json_dict()["cases"][0].keys() >= {"intervention_applied"}


def test_strict_run_never_reuses_a_non_strict_pass(s0_doc, tmp_path) -> None:
    _run(s0_doc, tmp_path, liars.IgnoresEager(), strict_fallback=False)
    summary = _run(s0_doc, tmp_path, liars.IgnoresEager())
    assert not any(r.reused for r in summary.records)
    _only_changed(summary, "rollout.enforce_eager=False", "error")


def test_another_runtime_target_is_rescored(s0_doc, tmp_path) -> None:
    from xconf.adapters.cpu_smoke.adapter import CpuSmokeRuntime

    first = _run(s0_doc, tmp_path, CpuSmokeRuntime())
    again = _run(s0_doc, tmp_path, CpuSmokeRuntime())
    other = _run(s0_doc, tmp_path, liars.SameAsCpuSmoke())
    options = _run(s0_doc, tmp_path, CpuSmokeRuntime(hidden_size=32, seed=0, vocab_size=97))
    assert not any(r.reused for r in first.records)
    assert all(r.reused for r in again.records)
    assert not any(r.reused for r in other.records)
    assert all(r.reused for r in options.records)  # the same options spelled out: same key
    actual = attempt_doc(other, "baseline", "actual.json")
    assert actual["provenance"]["runtime"]["target"].endswith("liars:SameAsCpuSmoke")
    engines = actual["provenance"]["engines"]
    assert engines["torch"] == torch.__version__
    assert set(engines) >= {"vllm", "transformers", "torch", "native_kernel"}


def test_in_place_mutation_of_frozen_inputs_is_invalid_identity(s0_doc, tmp_path) -> None:
    summary = _run(s0_doc, tmp_path, liars.MutatesInputs())
    _only_changed(summary, "training.attention_backend=eager", "invalid_identity")
    error = attempt_doc(summary, "training.attention_backend=eager", "comparison.json")["error"]
    assert error["code"] == "identity.inputs_mutated"
    assert error["path"] == "training:token_ids"
    # what the refused side returned is the finding: its score file keeps it
    record = next(r for r in summary.records if r.label == "training.attention_backend=eager")
    attempt = Path(summary.experiment_dir, "cases", record.case_id, record.attempt_id)
    assert set(read_tensors(attempt / "score_training.safetensors")) >= {"logprobs", "token_ids"}


@pytest.mark.parametrize("extreme", [-1e4, float(torch.finfo(torch.float32).min)])
def test_finite_extreme_score_is_an_honest_fail(s0_doc, tmp_path, extreme) -> None:
    summary = _run(s0_doc, tmp_path, liars.ExtremeScore(extreme=extreme))
    _only_changed(summary, "rollout.enable_prefix_caching=True", "fail")
    record = next(r for r in summary.records if r.result == "fail")
    assert record.mismatches == 1
    path = Path(summary.experiment_dir) / "cases" / record.case_id / record.attempt_id
    text = (path / "comparison.json").read_text("utf-8")
    assert "Infinity" not in text and "NaN" not in text
    doc = json.loads(text)
    if extreme == -1e4:  # exp(+1e4) overflows: the diagnostic is null and flagged
        assert doc["approx_kl"] is None and "approx_kl" in doc["non_finite"]
    assert math.isfinite(doc["diff"]["max"])
    rerun = _run(s0_doc, tmp_path, liars.ExtremeScore(extreme=extreme))
    assert all(r.reused for r in rerun.records)  # the verdict is sealed, not a crash loop
    build_report(summary.experiment_dir)  # the report reads it too


def test_identity_violation_raised_by_an_adapter_is_invalid_identity(s0_doc, tmp_path) -> None:
    summary = _run(s0_doc, tmp_path, liars.DivergedDecoding())
    _only_changed(summary, "rollout.dtype=bfloat16", "invalid_identity")
    doc = attempt_doc(summary, "rollout.dtype=bfloat16", "comparison.json")
    assert doc["error"]["code"] == "identity.forced_decoding_diverged"
    assert "frozen token is 7" in doc["identity"]["violations"][0]
    actual = attempt_doc(summary, "rollout.dtype=bfloat16", "actual.json")
    assert actual["sides"]["rollout"] and actual["sides"]["training"]  # never empty
    assert {a["status"] for a in actual["sides"]["rollout"]} == {"error"}


@pytest.mark.parametrize("strict", [True, False])
def test_a_knob_whose_readback_raises_is_an_error_with_the_reason(s0_doc, tmp_path, strict) -> None:
    summary = _run(s0_doc, tmp_path, liars.ReadbackRaises(), strict_fallback=strict)
    label = "training.attention_backend=eager"
    _only_changed(summary, label, "error")  # with or without strict execution
    actual = attempt_doc(summary, label, "actual.json")
    rows = {a["path"]: a for a in actual["sides"]["training"]}
    assert rows.keys() >= {"batch.size", "training.compute_dtype", "training.attention_backend"}
    for path, row in rows.items():
        if path == "logp.backend":  # the operator the session bound, not read from the engine
            continue
        assert row["status"] == "error" and row["actual"] is None, row
        assert "readback failed: RuntimeError: the engine's state went away" in row["evidence"]
    assert {a["status"] for a in actual["sides"]["rollout"]} == {"applied"}  # read back fine
    error = attempt_doc(summary, label, "comparison.json")["error"]
    assert error["path"].startswith("training:") and "readback failed" in error["message"]
