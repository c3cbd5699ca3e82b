"""Campaign 7, symlink races: writes go through directory descriptors, never paths.

An attempt directory swapped for a symlink right after its creation, a symlink planted at
the torchrun launcher's launch.json and at report.html: nothing is ever written outside
the output root (files written outside: 0).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest
import torch

from xconf.artifacts import safe_io
from xconf.artifacts.layout import PAYLOAD_FILES
from xconf.artifacts.store import ExperimentStore
from xconf.errors import ArtifactError

CASE = "c-0123456789abcdef"


def _publish(store: ExperimentStore) -> Any:
    documents = {name: {"case_id": CASE} for name in PAYLOAD_FILES if name.endswith(".json")}
    tensors = {
        name: {"x": torch.zeros(2, 3)} for name in PAYLOAD_FILES if name.endswith(".safetensors")
    }
    return store.publish_attempt(CASE, "k" * 64, documents, tensors, "pass")


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_attempt_dir_swapped_for_a_symlink_after_creation_receives_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    store = ExperimentStore(tmp_path / "out", "exp-race")
    store.case_dir(CASE)
    real_mkdir = os.mkdir
    swapped: list[Path] = []

    def mkdir_then_swap(path: Any, *args: Any, **kwargs: Any) -> None:
        real_mkdir(path, *args, **kwargs)
        name = Path(os.fspath(path))
        if swapped or not re.fullmatch(r"a-\d+", name.name):
            return
        dir_fd = kwargs.get("dir_fd")
        parent = Path(os.readlink(f"/proc/self/fd/{dir_fd}")) if dir_fd is not None else None
        made = (parent / name) if parent is not None else name
        os.rename(made, made.with_name(made.name + ".moved"))  # the attacker's swap
        made.symlink_to(outside, target_is_directory=True)
        swapped.append(made)

    monkeypatch.setattr(safe_io.os, "mkdir", mkdir_then_swap)
    with pytest.raises(ArtifactError) as info:
        _publish(store)
    monkeypatch.undo()
    assert swapped, "the race was never staged"
    assert info.value.code == "artifacts.not_a_directory"
    assert _tree(outside) == []  # files written outside the root: 0


def test_attempt_dir_swapped_after_it_was_opened_receives_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Swapped after the open: the writes follow the descriptor into the real directory."""
    outside = tmp_path / "outside"
    outside.mkdir()
    store = ExperimentStore(tmp_path / "out", "exp-race")
    real_allocate = safe_io.allocate_attempt_dir

    def allocate_then_swap(case_dir: Any) -> Any:
        attempt_id, attempt = real_allocate(case_dir)
        os.rename(attempt.path, attempt.path.with_name(attempt_id + ".moved"))
        attempt.path.symlink_to(outside, target_is_directory=True)
        return attempt_id, attempt

    from xconf.artifacts import store as store_module

    monkeypatch.setattr(store_module, "allocate_attempt_dir", allocate_then_swap)
    published = _publish(store)
    assert _tree(outside) == []
    moved = published.path.with_name(published.attempt_id + ".moved")
    assert sorted(p.name for p in moved.iterdir()) == sorted([*PAYLOAD_FILES, "COMPLETE"])


def test_planted_report_html_symlink_is_replaced_not_followed(tmp_path: Path) -> None:
    from xconf.report.writer import write_text

    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "report.html").symlink_to(victim)
    write_text(tmp_path / "run" / "report.html", "<html></html>")
    assert victim.read_text() == "precious"
    assert not (tmp_path / "run" / "report.html").is_symlink()
    assert (tmp_path / "run" / "report.html").read_text() == "<html></html>"


def _noop() -> int:
    return 7


@pytest.mark.slow
def test_planted_launch_json_symlink_is_replaced_not_followed(tmp_path: Path) -> None:
    from xconf.launchers.world import WorldSettings, launch_world

    victim = tmp_path / "victim.json"
    victim.write_text("precious")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "launch.json").symlink_to(victim)
    value, _ = launch_world(1, f"{__name__}:_noop", {}, WorldSettings(), run_dir)
    assert value == 7
    assert victim.read_text() == "precious"  # files written outside the root: 0
    assert not (run_dir / "launch.json").is_symlink()
    assert '"status": "completed"' in (run_dir / "launch.json").read_text()


@pytest.fixture(scope="module")
def sealed_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small sealed S0 run (cpu-smoke): the report's input."""
    from tests.reliability.relhelpers import RUN_FLAGS, cli, write_experiment

    base = tmp_path_factory.mktemp("race-run")
    code = cli("run", write_experiment(base), *RUN_FLAGS, "--output-root", base / "out")
    assert code == 1  # the mini S0 fails some cases on purpose
    return base / "out" / "rel-s0"


def _swap_while_building(monkeypatch: pytest.MonkeyPatch, module: Any, victim: Path) -> Path:
    """While the report is built (after the writer started), move ``victim`` aside and put a
    symlink to ``outside`` in its place: the attacker's swap. Returns ``outside``."""
    outside = victim.parent / "outside"
    outside.mkdir()
    real_build = module.build_report

    def build_then_swap(*args: Any, **kwargs: Any) -> Any:
        data = real_build(*args, **kwargs)
        os.rename(victim, victim.with_name(victim.name + ".moved"))
        victim.symlink_to(outside, target_is_directory=True)
        return data

    monkeypatch.setattr(module, "build_report", build_then_swap)
    return outside


def test_run_dir_swapped_for_a_symlink_mid_report_receives_nothing(
    sealed_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """report.html's directory (the run dir) swapped while the report is built: the report
    follows the descriptor opened before, into the real directory."""
    import shutil

    from xconf.report import writer

    run = tmp_path / "out" / "rel-s0"
    shutil.copytree(sealed_run, run, symlinks=True)
    outside = _swap_while_building(monkeypatch, writer, run)
    written = writer.write_report(run)
    monkeypatch.undo()
    assert written.path == run / "report.html"
    assert _tree(outside) == []  # files written outside the root: 0
    assert (run.with_name("rel-s0.moved") / "report.html").read_text().startswith("<!DOCTYPE")


def test_report_output_dir_swapped_for_a_symlink_mid_write_receives_nothing(
    sealed_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`xconf report RUN_DIR -o DIR/r.html` with DIR swapped while the report is built."""
    from xconf.report import build
    from xconf.report.cli import main_report

    reports = tmp_path / "reports"
    reports.mkdir()
    outside = _swap_while_building(monkeypatch, build, reports)
    code = main_report([str(sealed_run), "-o", str(reports / "r.html"), "--quiet"])
    monkeypatch.undo()
    assert code == 0
    assert _tree(outside) == []  # files written outside the root: 0
    assert (tmp_path / "reports.moved" / "r.html").read_text().startswith("<!DOCTYPE")


def test_report_into_a_symlinked_run_dir_is_refused(sealed_run: Path, tmp_path: Path) -> None:
    """The run directory named is itself a symlink: refused (the loader's rule), no write."""
    from xconf.report.cli import main_report

    link = tmp_path / "link"
    link.symlink_to(sealed_run, target_is_directory=True)
    before = sorted(p.name for p in sealed_run.iterdir())
    assert main_report([str(link), "--quiet"]) == 2
    assert sorted(p.name for p in sealed_run.iterdir()) == before
