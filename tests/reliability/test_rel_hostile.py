"""Campaign 6, hostile files and odd text (#13 items 2-6, #12 item 10).

Every reader opens only bounded regular files: a 1 KB COMPLETE of ``[``, a deeply nested
plan.jsonl line, a FIFO in place of plan.jsonl or experiment.json and a 1 GB sparse
COMPLETE each end as coded damage in verify, report and plan, in under 5 s and under
200 MB above the imports, with nothing escaping (no RecursionError, no hang). Each
command runs in a child, measured (tests/reliability/hostile_child.py).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.reliability.relhelpers import REPO, RUN_FLAGS, child_env, cli, report, write_experiment

EXP = "rel-s0"
LIMIT_S, LIMIT_MIB = 5.0, 200.0


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    base = tmp_path_factory.mktemp("hostile")
    experiment = write_experiment(base)
    root = base / "pristine"
    assert cli("run", experiment, *RUN_FLAGS, "--output-root", root) == 1
    return experiment, root


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
    "verify": {"FIFO experiment.json": 2, "nested plan.jsonl line": 0, "FIFO plan.jsonl": 1},
    "report": {"FIFO experiment.json": 2},
    "plan": {"FIFO experiment.json": 2, "FIFO plan.jsonl": 2},
}
DEFAULT = {"verify": 1, "report": 0, "plan": 0}


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
        for command in ("verify", "report", "plan"):
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
