"""The loader: seals verified file by file, newest valid attempt chosen, bad dirs refused."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest
from report_fixtures import case_id_for

from xconf.errors import XconfError
from xconf.report.errors import ReportError
from xconf.report.loader import load_run, verify_seal


def _attempt(run_dir: Path, changed: dict, attempt: str = "a-0001") -> Path:
    return run_dir / "cases" / case_id_for(changed) / attempt


def test_every_planned_case_is_loaded_in_plan_order(run_dir: Path) -> None:
    run = load_run(run_dir)
    assert run.experiment_id == "exp-report"
    assert [c.case_id for c in run.cases] == [r.case_id for r in run.plan]
    assert run.problems == ()


def test_sound_attempt_is_verified(run_dir: Path) -> None:
    seal = verify_seal(_attempt(run_dir, {}), "exp-report", case_id_for({}))
    assert seal.verified and seal.problems == ()
    assert seal.sealed_result == "pass"


def test_newest_valid_attempt_is_chosen_and_tampered_one_is_marked(run_dir: Path) -> None:
    run = load_run(run_dir)
    case = next(c for c in run.cases if c.case_id == case_id_for({"rollout.enforce_eager": False}))
    assert [a.attempt_id for a in case.attempts] == ["a-0001", "a-0002"]
    assert case.chosen is not None and case.chosen.attempt_id == "a-0001"
    tampered = case.attempts[1].seal
    assert not tampered.verified
    assert tampered.problems == ("comparison.json does not match its seal",)


def test_unsealed_attempt_is_never_chosen(run_dir: Path) -> None:
    run = load_run(run_dir)
    case = next(
        c for c in run.cases if c.case_id == case_id_for({"rollout.enable_prefix_caching": True})
    )
    assert case.chosen is None and case.payload is None
    assert "no COMPLETE seal" in case.attempts[0].seal.problems[0]


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        ("extra", "unexpected entries ['notes.txt']"),
        ("missing", "actual.json is missing"),
        ("symlink", "actual.json is not a regular file"),
        ("directory", "actual.json is not a regular file"),
        ("wrong_case", "COMPLETE case_id is 'c-0000000000000000'"),
        ("garbage", "COMPLETE is malformed"),
        ("foreign", "sealed file notes.txt is not a payload"),
    ],
)
def test_broken_seals_are_named(run_dir: Path, damage: str, expected: str) -> None:
    attempt = _attempt(run_dir, {})
    seal_path = attempt / "COMPLETE"
    if damage == "extra":
        (attempt / "notes.txt").write_text("hello")
    elif damage == "missing":
        (attempt / "actual.json").unlink()
    elif damage == "symlink":
        target = attempt.parent / "elsewhere.json"
        os.replace(attempt / "actual.json", target)
        (attempt / "actual.json").symlink_to(target)
    elif damage == "directory":
        (attempt / "actual.json").unlink()
        (attempt / "actual.json").mkdir()
    elif damage == "foreign":
        (attempt / "notes.txt").write_text("hello")
        seal = json.loads(seal_path.read_text())
        seal["files"]["notes.txt"] = hashlib.sha256(b"hello").hexdigest()
        seal_path.write_text(json.dumps(seal))
    elif damage == "wrong_case":
        seal = json.loads(seal_path.read_text())
        seal["case_id"] = "c-0000000000000000"
        seal_path.write_text(json.dumps(seal))
    else:
        seal_path.write_text("{not json")
    seal = verify_seal(attempt, "exp-report", case_id_for({}))
    assert not seal.verified
    assert any(p.startswith(expected) for p in seal.problems), seal.problems


def test_a_symlinked_attempt_directory_is_not_followed(run_dir: Path, tmp_path: Path) -> None:
    case_dir = _attempt(run_dir, {}).parent
    os.replace(case_dir / "a-0001", tmp_path / "outside")
    (case_dir / "a-0001").symlink_to(tmp_path / "outside")
    case = next(c for c in load_run(run_dir).cases if c.case_id == case_id_for({}))
    assert case.chosen is None
    assert case.attempts[0].seal.problems == ("attempt is not a real directory",)


def test_unsafe_case_directories_are_ignored(run_dir: Path) -> None:
    (run_dir / "cases" / "-bad").mkdir()
    run = load_run(run_dir)
    assert any("cases/-bad" in p for p in run.problems)
    assert all(c.case_id != "-bad" for c in run.cases)


@pytest.mark.parametrize("kind", ["missing", "file", "no_header", "symlink"])
def test_bad_run_dir_is_a_coded_error(tmp_path: Path, run_dir: Path, kind: str) -> None:
    target = tmp_path / "target"
    if kind == "file":
        target.write_text("x")
    elif kind == "no_header":
        target.mkdir()
    elif kind == "symlink":
        target.symlink_to(run_dir)
    with pytest.raises(ReportError) as info:
        load_run(target)
    assert isinstance(info.value, XconfError)
    assert info.value.code == "report.bad_run_dir"
    assert info.value.path == str(target)


def test_unparsable_header_is_a_coded_error(run_dir: Path) -> None:
    (run_dir / "experiment.json").write_text("[1, 2")
    with pytest.raises(ReportError) as info:
        load_run(run_dir)
    assert info.value.code == "report.bad_header"


def test_token_diffs_are_read_with_the_selected_token_ids(run_dir: Path) -> None:
    case = next(c for c in load_run(run_dir).cases if c.case_id == case_id_for({}))
    assert case.payload is not None and case.payload.token_diffs is not None
    diffs = case.payload.token_diffs
    assert diffs.threshold == float(np.float32(1e-5))  # stored at the verdict's float32
    assert diffs.abs_diff.shape == (2, 24)
    assert diffs.token_ids is not None and int(diffs.token_ids[0, 0]) == 4  # selected = ids + 1


def test_an_output_root_is_refused_with_the_runs_it_holds(run_dir: Path) -> None:
    with pytest.raises(ReportError) as info:
        load_run(run_dir.parent)
    assert info.value.code == "report.bad_run_dir"
    assert "it holds the runs exp-report: pass one of them" in info.value.message
