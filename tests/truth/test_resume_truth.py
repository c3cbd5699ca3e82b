"""Resume re-judges before reuse; the plan is sealed; one experiment id holds one plan."""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from tests.core.runs import only, run_doc
from xconf.errors import ArtifactError
from xconf.report.build import build_report
from xconf.verify import verify_run

OFFSET: dict[str, list[Any]] = {"logp__backend": ["smoke_only.logp_offset"], "batch__size": [1]}


def _doc(s0_doc):
    return only(copy.deepcopy(s0_doc), **OFFSET)


def _forge_pass(attempt: Path) -> None:
    """Turn a sealed fail into a pass and rewrite the seal so that it verifies."""
    comparison = json.loads((attempt / "comparison.json").read_text())
    comparison.update(result="pass", mismatches=0, mismatch_ratio=0.0)
    data = (json.dumps(comparison, sort_keys=True, indent=2) + "\n").encode()
    (attempt / "comparison.json").write_bytes(data)
    seal = json.loads((attempt / "COMPLETE").read_text())
    seal["result"] = "pass"
    seal["files"]["comparison.json"] = hashlib.sha256(data).hexdigest()
    (attempt / "COMPLETE").write_text(json.dumps(seal, sort_keys=True, indent=2) + "\n")


def test_a_forged_pass_with_a_rewritten_seal_is_rescored(s0_doc, tmp_path) -> None:
    first = run_doc(_doc(s0_doc), tmp_path)
    failed = next(r for r in first.records if r.result == "fail")
    attempt = Path(first.experiment_dir) / "cases" / failed.case_id / failed.attempt_id
    _forge_pass(attempt)
    again = run_doc(_doc(s0_doc), tmp_path)
    record = next(r for r in again.records if r.case_id == failed.case_id)
    assert (record.result, record.reused) == ("fail", False)
    assert all(r.reused for r in again.records if r.case_id != failed.case_id)
    new = attempt.parent / record.attempt_id
    damaged = json.loads((new / "actual.json").read_text())["resume"]["damaged_attempts"]
    assert damaged[0]["attempt_id"] == failed.attempt_id
    assert "recomputed" in damaged[0]["reason"]


def test_swapped_plan_rows_are_refused_by_run_verify_and_report(s0_doc, tmp_path) -> None:
    summary = run_doc(_doc(s0_doc), tmp_path)
    plan = Path(summary.experiment_dir) / "plan.jsonl"
    lines = plan.read_text().splitlines()
    plan.write_text("\n".join([lines[1], lines[0], *lines[2:]]) + "\n")
    with pytest.raises(ArtifactError) as info:
        run_doc(_doc(s0_doc), tmp_path)
    assert info.value.code == "artifacts.plan_seal"
    findings = verify_run(Path(summary.experiment_dir)).findings
    assert any(f.status == "damaged" and "plan seal" in (f.reason or "") for f in findings)
    assert any("plan seal" in p for p in build_report(summary.experiment_dir).problems)


def test_a_symlinked_plan_is_never_followed(s0_doc, tmp_path) -> None:
    summary = run_doc(_doc(s0_doc), tmp_path)
    plan = Path(summary.experiment_dir) / "plan.jsonl"
    elsewhere = tmp_path / "elsewhere.jsonl"
    elsewhere.write_bytes(plan.read_bytes())
    plan.unlink()
    plan.symlink_to(elsewhere)
    with pytest.raises(ArtifactError):
        run_doc(_doc(s0_doc), tmp_path)
    assert any("symlink" in p for p in build_report(summary.experiment_dir).problems)


def test_another_baseline_under_the_same_id_is_an_experiment_conflict(s0_doc, tmp_path) -> None:
    run_doc(_doc(s0_doc), tmp_path)
    other = _doc(s0_doc)
    other["baseline"]["rollout"]["enforce_eager"] = False
    with pytest.raises(ArtifactError) as info:
        run_doc(other, tmp_path)
    assert info.value.code == "artifacts.experiment_conflict"
    message = info.value.message
    assert "rollout.enforce_eager: True -> False" in message and "experiment_id" in message
    subset = only(copy.deepcopy(s0_doc), batch__size=[1])  # a part of the plan is no conflict
    assert all(r.reused for r in run_doc(subset, tmp_path).records)
