"""`xconf fix` on bad input, the plan extensions it seals, and the report's check of a fix.

A real cpu-smoke run (S0: `xconf run examples/cross_config_s0_cpu_smoke.json`) gives a run
directory with passing cases and failing ones. Bad input is a coded exit 2 that leaves the run
directory byte for byte as it was; a failing case the runtime has no arm for is refused
before anything is written. The plan extensions (cases added to a finished run) are sealed
like the plan: read with it, damaged when edited, never accepted from another run.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import S0_JSON, snapshot
from xconf.artifacts.plan_extension import EXTENSIONS_DIR
from xconf.artifacts.plan_seal import plan_seal_problem, sealed_rows
from xconf.errors import ArtifactError
from xconf.verify import open_run_dir, verify_run


@pytest.fixture(scope="module")
def s0_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from xconf.cli.main import main

    out = tmp_path_factory.mktemp("s0")
    argv = ["run", str(S0_JSON), "--runtime", "cpu-smoke", "--allow-smoke-operators"]
    assert main([*argv, "--output-root", str(out)]) == 1  # the smoke offset case fails
    return out / "cpu-smoke-json"


def _rows(run: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run / "plan.jsonl").read_text().splitlines()]


def _case(run: Path, label: str) -> str:
    for row in _rows(run):
        shown = ",".join(f"{k}={v}" for k, v in sorted(row["changed"].items())) or "baseline"
        if shown == label:
            return str(row["case_id"])
    raise AssertionError(label)


@pytest.fixture
def copy(s0_run: Path, tmp_path: Path) -> Path:
    target = tmp_path / "out" / s0_run.name
    shutil.copytree(s0_run, target)
    return target


@pytest.mark.parametrize(
    ("case", "code"),
    [
        ("c-0000000000000000", "fix.unknown_case"),
        ("baseline", "fix.case_not_failing"),
        # A failing case on a runtime without arms: every arm bound first, refused as a whole.
        ("rollout.dtype=bfloat16", "fix.arms_unsupported"),
    ],
)
def test_bad_input_is_coded_and_writes_nothing(
    copy: Path, case: str, code: str, xconf_cli: Any
) -> None:
    case_id = case if case.startswith("c-") else _case(copy, case)
    before = snapshot(copy)
    rc, out, err = xconf_cli("fix", copy, case_id)
    assert rc == 2 and f"[{code}]" in err, (rc, out, err)
    assert snapshot(copy) == before


def test_not_a_run_directory(tmp_path: Path, xconf_cli: Any) -> None:
    (tmp_path / "here").mkdir()
    rc, _, err = xconf_cli("fix", tmp_path / "here", "c-0000000000000000")
    assert rc == 2 and "[verify.bad_run_dir]" in err
    assert list((tmp_path / "here").iterdir()) == []


def _fix_row(run: Path, **changed: Any) -> dict[str, Any]:
    base = next(r for r in _rows(run) if r["kind"] == "baseline")
    knobs = {**base["knobs"], **{k.replace("__", "."): v for k, v in changed.items()}}
    return {
        "case_id": "c-00000000000f1x00",
        "index": 99,
        "kind": "fix",
        "changed": {k.replace("__", "."): v for k, v in changed.items()},
        "knobs": knobs,
        "operators": base["operators"],
    }


def test_a_plan_extension_is_read_with_the_plan(copy: Path) -> None:
    store = open_run_dir(copy)
    row = _fix_row(copy, batch__size=3)
    assert store.extend_plan([row]) == [row["case_id"]]
    assert store.extend_plan([row]) == []  # planned already: nothing sealed again
    assert len(list((copy / EXTENSIONS_DIR).iterdir())) == 1
    assert sealed_rows(copy)[row["case_id"]]["kind"] == "fix"
    assert plan_seal_problem(copy) is None
    report = verify_run(copy)  # planned, never run: incomplete, not damaged
    assert report.exit_code == 3
    assert any(f.case_id == row["case_id"] and f.status == "missing" for f in report.findings)


def test_a_row_that_misstates_its_changes_is_refused(copy: Path) -> None:
    row = _fix_row(copy, batch__size=3)
    row["changed"] = {}  # its knobs change batch.size from the baseline's
    with pytest.raises(ArtifactError) as info:
        open_run_dir(copy).extend_plan([row])
    assert info.value.code == "artifacts.experiment_conflict"
    assert not (copy / EXTENSIONS_DIR).exists()


def test_an_edited_extension_is_damage(copy: Path) -> None:
    open_run_dir(copy).extend_plan([_fix_row(copy, batch__size=3)])
    rows = next((copy / EXTENSIONS_DIR).iterdir()) / "plan.jsonl"
    rows.write_text(rows.read_text().replace('"batch.size": 3', '"batch.size": 5'))
    assert "does not match its seal" in (plan_seal_problem(copy) or "")
    with pytest.raises(ArtifactError):
        sealed_rows(copy)
    assert verify_run(copy).exit_code == 1


def test_an_extension_of_another_run_is_damage(copy: Path, tmp_path: Path) -> None:
    open_run_dir(copy).extend_plan([_fix_row(copy, batch__size=3)])
    other = tmp_path / "other" / copy.name
    shutil.copytree(copy, other)
    plan = other / "plan.jsonl"
    header = json.loads((other / "experiment.json").read_text())
    header["plan_sha256"] = "0" * 64  # as if the extension had been sealed over another plan
    (other / "experiment.json").write_text(json.dumps(header))
    assert plan_seal_problem(other) is not None
    assert plan.exists()


def test_an_unsealed_extension_counts_for_nothing(copy: Path) -> None:
    open_run_dir(copy).extend_plan([_fix_row(copy, batch__size=3)])
    (next((copy / EXTENSIONS_DIR).iterdir()) / "COMPLETE").unlink()
    assert "c-00000000000f1x00" not in sealed_rows(copy)
    assert plan_seal_problem(copy) is None


def test_the_report_shows_a_forged_fix_as_none(copy: Path) -> None:
    """A sealed fix record that names a failing case as its fix is not believed: the report
    reads that case's own sealed verdict."""
    from xconf.fix.service import publish
    from xconf.report.build import build_report
    from xconf.report.html import render_html

    failing = _case(copy, "rollout.dtype=bfloat16")
    attempt = sorted((copy / "cases" / failing).iterdir())[-1].name
    step = {"case_id": failing, "attempt_id": attempt, "label": "training.align.all=vllm"}
    document = {
        "schema": "xconf.fix.v1",
        "case_id": failing,
        "attempt_id": attempt,
        "label": "rollout.dtype=bfloat16",
        "start": {"tap": None, "kind": "rms_norm"},
        "steps": [step],
        "verified": step,
        "notes": [],
        "line": "verified fix: training.align.all=vllm (0 of 40 over the threshold; 40 bitwise)",
    }
    publish(copy, failing, attempt, document)
    data = build_report(copy)
    (fix,) = data.fixes
    assert fix["verified"] is False
    assert fix["line"].startswith("not a verified fix: the record names case")
    page = render_html(data)
    assert 'id="fix"' in page and 'data-fix-line="none"' in page and "<b>verified fix:" not in page
