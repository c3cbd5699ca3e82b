"""Campaign 6, hostile files, verify's classification and text from the disk.

Every reader opens only bounded regular files: a 1 KB COMPLETE of ``[``, a deeply nested
plan.jsonl line, a FIFO in place of plan.jsonl or experiment.json and a 1 GB sparse
COMPLETE each end as coded damage in verify, report and plan, in under 5 s and under
200 MB above the imports, with nothing escaping (no RecursionError, no hang). Each
command runs in a child, measured (tests/reliability/hostile_child.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.reliability.relhelpers import (
    REPO,
    child_env,
    cli_output,
    report,
)
from xconf.artifacts.layout import PAYLOAD_FILES
from xconf.artifacts.store import ExperimentStore
from xconf.verify import EXIT_DAMAGED, EXIT_INCOMPLETE, EXIT_VALID, verify_run

EXP = "rel-s0"
LIMIT_S, LIMIT_MIB = 5.0, 200.0


def _first_attempt(exp: Path) -> Path:
    return sorted((exp / "cases").iterdir())[0] / "a-0001"


def _replace(path: Path, data: bytes) -> None:
    path.unlink()
    path.write_bytes(data)


def _fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


def _sparse(path: Path) -> None:
    path.unlink()
    with path.open("wb") as handle:
        handle.truncate(1 << 30)  # 1 GiB of holes: costs no disk, 1 GiB to anyone who reads it


def _nested_line(path: Path) -> None:
    with path.open("ab") as handle:  # valid JSON, 100 000 levels deep
        handle.write(b"[" * 100_000 + b"]" * 100_000 + b"\n")


HOSTILE: dict[str, Callable[[Path], None]] = {
    "COMPLETE of 1 KB '['": lambda exp: _replace(_first_attempt(exp) / "COMPLETE", b"[" * 1024),
    "1 GB sparse COMPLETE": lambda exp: _sparse(_first_attempt(exp) / "COMPLETE"),
    "nested plan.jsonl line": lambda exp: _nested_line(exp / "plan.jsonl"),
    "FIFO plan.jsonl": lambda exp: _fifo(exp / "plan.jsonl"),
    "FIFO experiment.json": lambda exp: _fifo(exp / "experiment.json"),
    "FIFO comparison.json": lambda exp: _fifo(_first_attempt(exp) / "comparison.json"),
}
# What each command must answer (exit code) for each hostile file.
EXPECTED = {
    # a line appended to the sealed plan breaks its seal: damage (verify 1), refused (plan 2)
    "verify": {"FIFO experiment.json": 2, "nested plan.jsonl line": 1, "FIFO plan.jsonl": 1},
    "report": {"FIFO experiment.json": 2},
    "plan": {"FIFO experiment.json": 2, "FIFO plan.jsonl": 2, "nested plan.jsonl line": 2},
    # the store's scan before a run scores: a damaged attempt is simply not reusable (1)
    "resume": {"nested plan.jsonl line": 0, "FIFO experiment.json": 0, "FIFO plan.jsonl": 2},
}
DEFAULT = {"verify": 1, "report": 0, "plan": 0, "resume": 1}


def _children(jobs: list[list[str]]) -> list[dict[str, Any]]:
    done = subprocess.run(
        [sys.executable, "-m", "tests.reliability.hostile_child", json.dumps(jobs)],
        env=child_env(),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,  # a reader blocked on a FIFO fails here instead of hanging the suite
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


@pytest.mark.slow
def test_hostile_files_are_coded_damage_fast_and_small(
    pristine: tuple[Path, Path], tmp_path: Path
) -> None:
    experiment, source = pristine
    jobs = []
    for index, (name, plant) in enumerate(HOSTILE.items()):
        root = tmp_path / f"h{index}"
        shutil.copytree(source, root, symlinks=True)
        plant(root / EXP)
        for command in ("verify", "report", "plan", "resume"):
            if command == "plan" and "experiment.json" not in name and "plan.jsonl" not in name:
                continue  # plan reads only the header and the plan
            jobs.append([name, command, str(root / EXP), str(experiment)])
    results = _children(jobs)
    assert len(results) == len(jobs)
    figures: dict[str, dict[str, Any]] = {}
    for got in results:
        name, command = got["name"], got["command"]
        where = f"{command} on {name}"
        assert got["escaped"] is None, (where, got["output"])
        assert "Traceback" not in got["output"], (where, got["output"])
        assert got["code"] == EXPECTED[command].get(name, DEFAULT[command]), (where, got)
        assert got["seconds"] < LIMIT_S, (where, got["seconds"])
        assert got["added_mib"] < LIMIT_MIB, (where, got["added_mib"])
        figures[where] = {k: got[k] for k in ("code", "seconds", "added_mib", "maxrss_mib")}
    worst = max(figures.values(), key=lambda f: f["added_mib"])
    slowest = max(figures.values(), key=lambda f: f["seconds"])
    report(
        "hostile",
        f"{len(figures)} hostile reads coded; slowest {slowest['seconds']}s, "
        f"most memory {worst['added_mib']} MiB above the imports",
        figures,
    )


# -- verify: history is not damage, error is not a verdict --------------------------------


def _copy(source: Path, tmp_path: Path) -> Path:
    root = tmp_path / "v"
    shutil.copytree(source, root, symlinks=True)
    return root / EXP


def _set_seal(attempt: Path, **fields: Any) -> None:
    """Rewrite COMPLETE (it is not sealed itself) with new fields or recomputed digests."""
    seal = json.loads((attempt / "COMPLETE").read_text())
    seal.update(fields)
    for name in seal["files"]:
        seal["files"][name] = hashlib.sha256((attempt / name).read_bytes()).hexdigest()
    (attempt / "COMPLETE").unlink()
    (attempt / "COMPLETE").write_text(json.dumps(seal))


def _later_copy(case: Path) -> Path:
    """a-0002: a valid copy of a-0001 (what a resume publishes after a rescoring)."""
    later = case / "a-0002"
    shutil.copytree(case / "a-0001", later)
    _set_seal(later, attempt_id="a-0002")
    return later


def _statuses(exp: Path) -> dict[tuple[str, str], str]:
    return {(f.case_id, f.attempt_id): f.status for f in verify_run(exp).findings}


def test_abandoned_partial_attempt_under_a_valid_later_one(
    pristine: tuple[Path, Path], tmp_path: Path
) -> None:
    exp = _copy(pristine[1], tmp_path)
    case = sorted((exp / "cases").iterdir())[0]
    _later_copy(case)
    shutil.rmtree(case / "a-0001")
    (case / "a-0001").mkdir()  # what a SIGTERM before sealing leaves
    assert _statuses(exp)[(case.name, "a-0001")] == "abandoned"
    code, out = cli_output("verify", exp)
    assert code == EXIT_VALID, out
    assert "abandoned" in out


def test_repaired_case_is_valid_with_a_note(pristine: tuple[Path, Path], tmp_path: Path) -> None:
    exp = _copy(pristine[1], tmp_path)
    case = sorted((exp / "cases").iterdir())[0]
    _later_copy(case)
    diffs = case / "a-0001" / "token_diffs.safetensors"
    data = bytearray(diffs.read_bytes())
    data[len(data) // 2] ^= 1
    diffs.unlink()
    diffs.write_bytes(bytes(data))
    report_ = verify_run(exp)
    finding = next(
        f for f in report_.findings if f.attempt_id == "a-0001" and f.case_id == case.name
    )
    assert finding.status == "superseded"
    assert "does not match its seal" in (finding.reason or "")
    assert "superseded by valid a-0002" in (finding.reason or "")
    assert report_.exit_code == EXIT_VALID
    # the damaged attempt newest, the valid one older: the case's current state is damage
    shutil.rmtree(case / "a-0002")
    assert verify_run(exp).exit_code == EXIT_DAMAGED


def test_a_case_with_only_error_attempts_is_incomplete(
    pristine: tuple[Path, Path], tmp_path: Path
) -> None:
    exp = _copy(pristine[1], tmp_path)
    case = sorted((exp / "cases").iterdir())[0]
    shutil.rmtree(case / "a-0001")
    documents = {name: {"case_id": case.name} for name in PAYLOAD_FILES if name.endswith(".json")}
    documents["comparison.json"] = {"case_id": case.name, "result": "error", "reason": "boom"}
    tensors: dict[str, dict[str, Any]] = {
        name: {} for name in PAYLOAD_FILES if name.endswith(".safetensors")
    }
    ExperimentStore(exp.parent, EXP).publish_attempt(
        case.name, "k" * 64, documents, tensors, "error"
    )
    report_ = verify_run(exp)
    assert report_.exit_code == EXIT_INCOMPLETE
    assert _statuses(exp)[(case.name, "-")] == "no_verdict"


def test_forged_diagnostics_are_recomputed(pristine: tuple[Path, Path], tmp_path: Path) -> None:
    exp = _copy(pristine[1], tmp_path)
    attempt = next(
        c / "a-0001"
        for c in sorted((exp / "cases").iterdir())
        if json.loads((c / "a-0001" / "comparison.json").read_text())["result"] == "fail"
    )
    comparison = json.loads((attempt / "comparison.json").read_text())
    caught = {}
    for key, forged in (
        ("approx_kl", comparison["approx_kl"] * 0.5),
        ("diff", {**comparison["diff"], "max": comparison["diff"]["max"] / 2}),
        ("worst_token", {**comparison["worst_token"], "position": 0}),
        ("drift_profile", comparison["drift_profile"][1:]),
    ):
        (attempt / "comparison.json").unlink()
        (attempt / "comparison.json").write_text(json.dumps({**comparison, key: forged}))
        _set_seal(attempt)
        finding = next(f for f in verify_run(exp).findings if f.attempt_id == "a-0001")
        assert finding.status == "damaged", key
        assert f"diagnostic {key!r}" in (finding.reason or ""), finding
        caught[key] = finding.reason
    report("diagnostics", f"{len(caught)}/4 forged diagnostics caught by recomputation", caught)


# -- markup: text from the disk is shown verbatim ----------------------------------------------


def test_directory_entries_print_verbatim(pristine: tuple[Path, Path], tmp_path: Path) -> None:
    exp = _copy(pristine[1], tmp_path)
    (exp / "cases" / "[link=x]c-1").mkdir()
    (exp / "cases" / "[b]c-2").mkdir()
    code, out = cli_output("verify", exp)
    assert code == EXIT_DAMAGED
    assert "[link=x]c-1" in out and "[b]c-2" in out, out


def test_hostile_localization_seal_is_ignored_not_raised(tmp_path: Path) -> None:
    """The report reads ``<run>/localize/...`` through the same seal helpers."""
    from xconf.artifacts.localization import latest

    attempt = tmp_path / "localize" / "c-0123456789abcdef" / "a-0001" / "a-0001"
    attempt.mkdir(parents=True)
    (attempt / "COMPLETE").write_bytes(b"[" * 5000)
    assert latest(tmp_path, "c-0123456789abcdef") is None
    (attempt / "COMPLETE").unlink()
    os.mkfifo(attempt / "COMPLETE")
    assert latest(tmp_path, "c-0123456789abcdef") is None
