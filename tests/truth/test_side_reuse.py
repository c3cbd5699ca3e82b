"""A side configured alike in two cases is scored once per run, and the reuse is evidence.

On the cpu-smoke runtime: a training-only case takes the baseline's rollout scores and a
rollout-only case the baseline's training scores; everything a verdict rests on stays
bitwise what a run without reuse gives; ``xconf verify`` re-derives every reuse from the
attempts themselves, so a reuse record pointing elsewhere, or a source changed, is damage;
resume and reuse compose.
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.core.runs import only, run_doc
from tests.truth.forgery import edit_json, reseal
from xconf.artifacts.layout import sha256_file
from xconf.artifacts.store import read_tensors
from xconf.case_record import RunSummary
from xconf.verify import verify_run

PLAN: dict[str, list[Any]] = {
    "rollout__dtype": ["bf16"],
    "training__compute_dtype": ["bf16"],
    "batch__size": [1],  # both sides': no reuse
    "logp__backend": ["xconf.reference_logp"],  # both sides' operator: no reuse
}
ROLLOUT_ONLY, TRAINING_ONLY = "rollout.dtype=bfloat16", "training.compute_dtype=bfloat16"
FILES = (
    "comparison.json",
    "score_rollout.safetensors",
    "score_training.safetensors",
    "token_diffs.safetensors",
)


def _attempt(summary: RunSummary, label: str) -> Path:
    record = next(r for r in summary.records if r.label == label)
    return Path(summary.experiment_dir, "cases", record.case_id, record.attempt_id)


def _actual(summary: RunSummary, label: str) -> dict[str, Any]:
    return json.loads((_attempt(summary, label) / "actual.json").read_text())


@pytest.fixture(scope="module")
def runs(_s0_cached: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Any:
    out = tmp_path_factory.mktemp("reuse")
    doc = only(copy.deepcopy(_s0_cached), **PLAN)
    reusing = run_doc(copy.deepcopy(doc), out / "with")
    scoring = run_doc(copy.deepcopy(doc), out / "without", reuse_sides=False)
    return reusing, scoring


def test_reuse_changes_no_verdict_token_diff_or_score_file(runs: Any) -> None:
    reusing, scoring = runs
    assert (reusing.sides_reused, scoring.sides_reused) == (2, 0)
    assert reusing.engines_built + reusing.engines_reused == 2 * len(reusing.records) - 2
    for a, b in zip(reusing.records, scoring.records, strict=True):
        assert (a.case_id, a.result, a.attempt_id) == (b.case_id, b.result, b.attempt_id)
        for name in FILES:
            one = (_attempt(reusing, a.label) / name).read_bytes()
            other = (_attempt(scoring, b.label) / name).read_bytes()
            assert one == other, (a.label, name)
    assert verify_run(Path(reusing.experiment_dir)).exit_code == 0
    assert verify_run(Path(scoring.experiment_dir)).exit_code == 0


def test_the_reusing_case_names_its_source(runs: Any) -> None:
    reusing, scoring = runs
    baseline = _attempt(reusing, "baseline")
    for label, side in ((TRAINING_ONLY, "rollout"), (ROLLOUT_ONLY, "training")):
        record = _actual(reusing, label)["reused_sides"]
        assert set(record) == {side}, (label, record)
        source = record[side]
        assert (source["case_id"], source["attempt_id"]) == (baseline.parent.name, baseline.name)
        assert source["score_sha256"] == sha256_file(baseline / f"score_{side}.safetensors")
        # the side's records are the source's own, as a rescore would read them back
        for field in ("sides", "readback", "derived", "scored_tokens_checked_from"):
            assert _actual(reusing, label)[field][side] == _actual(reusing, "baseline")[field][side]
    for label in ("baseline", "batch.size=1", "logp.backend=xconf.reference_logp"):
        assert "reused_sides" not in _actual(reusing, label), label
    assert all("reused_sides" not in _actual(scoring, r.label) for r in scoring.records)


def _copy(summary: RunSummary, tmp_path: Path) -> tuple[Path, Path, Path]:
    run = tmp_path / Path(summary.experiment_dir).name
    shutil.copytree(summary.experiment_dir, run)
    experiment = Path(summary.experiment_dir)
    baseline = run / _attempt(summary, "baseline").relative_to(experiment)
    reusing = run / _attempt(summary, TRAINING_ONLY).relative_to(experiment)
    return run, baseline, reusing


def _damage(run: Path, attempt: Path) -> str:
    findings = verify_run(run).findings
    finding = next(f for f in findings if (f.case_id, f.attempt_id) == attempt.parts[-2:])
    assert finding.status == "damaged", finding
    return str(finding.reason)


def test_a_reuse_record_pointing_to_another_attempt_is_damage(runs: Any, tmp_path: Path) -> None:
    run, _, reusing = _copy(runs[0], tmp_path)
    other = next(r for r in runs[0].records if r.label == "batch.size=1")

    def elsewhere(actual: dict[str, Any]) -> None:
        actual["reused_sides"]["rollout"]["case_id"] = other.case_id

    edit_json(reusing, "actual.json", elsewhere)
    assert "another side key" in _damage(run, reusing)


def test_a_forged_side_key_or_digest_is_damage(runs: Any, tmp_path: Path) -> None:
    run, _, reusing = _copy(runs[0], tmp_path)
    edit_json(reusing, "actual.json", lambda a: a["reused_sides"]["rollout"].update(side_key="0"))
    assert "side_key is not the key" in _damage(run, reusing)
    run, _, reusing = _copy(runs[0], tmp_path / "2")
    edit_json(
        reusing, "actual.json", lambda a: a["reused_sides"]["rollout"].update(score_sha256="0")
    )
    assert "score_sha256 is not the source's sealed" in _damage(run, reusing)


def test_a_changed_or_missing_source_is_damage(runs: Any, tmp_path: Path) -> None:
    run, baseline, reusing = _copy(runs[0], tmp_path)
    name = "score_rollout.safetensors"
    tensors = read_tensors(baseline / name)
    from safetensors.torch import save

    tensors["logprobs"] = tensors["logprobs"] - 1.0  # resealed: the source's seal still holds
    reseal(baseline, name, save(tensors))
    assert "score_sha256 is not the source's sealed" in _damage(run, reusing)
    # and a forger who also rewrites the reusing attempt's record still holds other bytes
    digest = sha256_file(baseline / name)
    edit_json(
        reusing, "actual.json", lambda a: a["reused_sides"]["rollout"].update(score_sha256=digest)
    )
    assert "bitwise" in _damage(run, reusing)
    shutil.rmtree(baseline)
    assert "does not exist" in _damage(run, reusing)


def test_a_source_that_reused_the_side_itself_is_no_source(runs: Any, tmp_path: Path) -> None:
    run, baseline, reusing = _copy(runs[0], tmp_path)
    record = json.loads((reusing / "actual.json").read_text())["reused_sides"]["rollout"]

    def claims_reuse(actual: dict[str, Any]) -> None:
        actual["reused_sides"] = {"rollout": record}

    edit_json(baseline, "actual.json", claims_reuse)  # the baseline now says it took them
    assert "reused that side itself" in _damage(run, reusing)


def test_resume_reuses_reusing_attempts_and_rescores_when_the_source_breaks(
    _s0_cached: dict[str, Any], tmp_path: Path
) -> None:
    doc = only(copy.deepcopy(_s0_cached), **PLAN)
    first = run_doc(copy.deepcopy(doc), tmp_path)
    again = run_doc(copy.deepcopy(doc), tmp_path)
    assert all(r.reused for r in again.records) and again.sides_reused == 0
    baseline = _attempt(first, "baseline")
    # the baseline's training scores break (a stray write): its seal no longer holds
    name = "score_training.safetensors"
    (baseline / name).write_bytes((baseline / name).read_bytes()[:-4] + b"\0\0\0\0")
    third = run_doc(copy.deepcopy(doc), tmp_path)
    by_label = {r.label: r for r in third.records}
    assert not by_label["baseline"].reused and by_label["baseline"].attempt_id == "a-0002"
    # the two cases that took a side from the broken attempt are scored again, taking it
    # from the baseline's new attempt; the others resume
    for label, side in ((ROLLOUT_ONLY, "training"), (TRAINING_ONLY, "rollout")):
        assert not by_label[label].reused, label
        actual = _actual(third, label)
        assert actual["reused_sides"][side]["attempt_id"] == "a-0002"
        assert "source attempt" in actual["resume"]["damaged_attempts"][0]["reason"]
    assert by_label["batch.size=1"].reused and by_label["logp.backend=xconf.reference_logp"].reused
    for a, b in zip(first.records, third.records, strict=True):
        if a.label == "baseline":
            continue  # its first attempt is the broken one
        for file in FILES[1:]:
            one = read_tensors(_attempt(first, a.label) / file)
            other = read_tensors(_attempt(third, b.label) / file)
            assert one.keys() == other.keys()
            assert all(one[k].numpy().tobytes() == other[k].numpy().tobytes() for k in one)
    report = verify_run(Path(third.experiment_dir))
    latest = {f.case_id: f for f in report.findings if f.status != "superseded"}
    assert all(f.status == "valid" for f in latest.values()), latest


def _docs(attempt: Path) -> dict[str, Any]:
    names = ("requested.json", "materialized.json", "identity.json", "actual.json")
    return {name: json.loads((attempt / name).read_text()) for name in names}


@pytest.mark.parametrize(
    "edit",
    [
        lambda d: d["requested.json"]["knobs"].update({"batch.size": 3}),  # request sizes
        lambda d: d["requested.json"]["knobs"].update({"unknown.knob": 1}),  # counts for both
        lambda d: d["requested.json"]["operators"]["rollout"].update(options=[["x", 1]]),
        lambda d: d["requested.json"].update(strict_execution=False),
        lambda d: d["identity.json"].update(sha256="0" * 64),
        lambda d: d["identity.json"].update(scoring_mode="prefill"),
        lambda d: d["materialized.json"]["sides"]["rollout"].update(dtype="bfloat16"),
        lambda d: d["materialized.json"]["sides"]["training"]["fingerprints"].update(process="0"),
        lambda d: d["materialized.json"]["scorers"].update(rollout="other"),
        lambda d: d["materialized.json"].update(runtime_kind="other"),
        lambda d: d["actual.json"]["environment"].update(torch="0"),
        lambda d: d["actual.json"]["provenance"]["inputs"].update(token_ids_sha256="0"),
    ],
)
def test_everything_that_decides_a_sides_scores_is_in_its_key(runs: Any, edit: Any) -> None:
    from xconf.runtime.side_reuse import side_key

    docs = _docs(_attempt(runs[0], "baseline"))
    before = side_key(docs, "rollout")
    assert before is not None
    edit(docs)
    assert side_key(docs, "rollout") != before


def test_what_only_the_other_side_owns_is_not_in_the_key(runs: Any) -> None:
    from xconf.runtime.side_reuse import side_key

    docs = _docs(_attempt(runs[0], "baseline"))
    before = side_key(docs, "rollout")
    docs["requested.json"]["knobs"]["training.compute_dtype"] = "bfloat16"
    docs["materialized.json"]["sides"]["training"]["dtype"] = "bfloat16"
    docs["requested.json"]["changed"] = {"training.compute_dtype": "bfloat16"}
    assert side_key(docs, "rollout") == before
    del docs["actual.json"]["environment"]  # a record without a field: no key, never equal
    assert side_key(docs, "rollout") is None
