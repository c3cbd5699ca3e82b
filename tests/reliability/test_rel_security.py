"""Security: no pickle is ever loaded, nothing escapes the output root, no symlink is followed.

* Malicious pickles (whose unpickling would create a marker file) are planted as extra
  `.pt` files in attempts, cases and the experiment dir, and as a payload re-sealed with a
  matching digest (a forged but consistent seal). Resume, verify and plan never unpickle
  them: torch.load / pickle loaders fail the test if called, and the marker never appears.
* Symlinks planted inside the experiment directory (at cases/<case>, cases, an attempt,
  plan.jsonl, experiment.json, .lock) pointing outside the root are never written through:
  the run either fails with a coded error or writes elsewhere inside the root.
"""

from __future__ import annotations

import builtins
import hashlib
import json
import pickle
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.reliability.relhelpers import (
    RUN_FLAGS,
    cli,
    cli_output,
    report,
    snapshot,
)
from xconf.artifacts.store import ExperimentStore
from xconf.errors import ArtifactError
from xconf.verify import EXIT_DAMAGED, verify_run

EXP = "rel-s0"


class _Bomb:
    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self) -> tuple[Any, ...]:
        return (builtins.open, (self.marker, "w"))


def test_malicious_pickles_are_never_loaded(
    pristine: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    experiment, source = pristine
    root = tmp_path / "root"
    shutil.copytree(source, root, symlinks=True)
    marker = tmp_path / "PWNED"
    bomb = pickle.dumps(_Bomb(marker))
    exp = root / EXP
    cases = sorted((exp / "cases").iterdir())
    planted = [exp / "token_diffs.pt", exp / "cases" / "score_rollout.pt"]
    for case in cases:
        planted += [case / "a-0001" / "score_rollout.pt", case / "score_training.pt"]
    for path in planted:
        path.write_bytes(bomb)
    # a forged payload: token_diffs.safetensors replaced by torch.save bytes, COMPLETE re-sealed
    forged = cases[0] / "a-0001"
    (forged / "score_rollout.pt").unlink()
    torch.save({"x": _Bomb(marker)}, forged / "token_diffs.safetensors")
    seal = json.loads((forged / "COMPLETE").read_text())
    digest = hashlib.sha256((forged / "token_diffs.safetensors").read_bytes()).hexdigest()
    seal["files"]["token_diffs.safetensors"] = digest
    (forged / "COMPLETE").write_text(json.dumps(seal))
    assert not marker.exists()

    calls: list[str] = []

    def forbidden(name: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            calls.append(name)
            raise AssertionError(f"{name} was called on an artifact")

        return call

    monkeypatch.setattr(torch, "load", forbidden("torch.load"))
    monkeypatch.setattr(pickle, "load", forbidden("pickle.load"))
    monkeypatch.setattr(pickle, "loads", forbidden("pickle.loads"))
    monkeypatch.setattr(pickle, "Unpickler", forbidden("pickle.Unpickler"))

    verdict = verify_run(exp)
    damaged = {
        (f.case_id, f.attempt_id): f.reason for f in verdict.findings if f.status == "damaged"
    }
    assert damaged[(cases[0].name, "a-0001")].startswith("unreadable payload")  # type: ignore[union-attr]
    assert verdict.exit_code == EXIT_DAMAGED
    assert cli("verify", exp) == EXIT_DAMAGED
    assert cli("run", experiment, *RUN_FLAGS, "--output-root", root) == 1
    assert cli("plan", experiment, "--output-root", root) == 0
    assert calls == [] and not marker.exists()
    report(
        "pickle",
        f"{len(planted) + 1} malicious pickles planted, 0 loaded",
        {"planted": len(planted) + 1},
    )


def _outside_target(tmp_path: Path) -> Path:
    target = tmp_path / "outside"
    target.mkdir()
    (target / "keep.txt").write_text("outside the root\n")
    return target


@pytest.mark.parametrize(
    "where",
    ["case", "cases", "attempt", "plan.jsonl", "experiment.json", ".lock", "experiment"],
)
def test_symlinks_are_never_followed_when_writing(
    pristine: tuple[Path, Path], tmp_path: Path, where: str
) -> None:
    experiment, source = pristine
    root = tmp_path / "root"
    shutil.copytree(source, root, symlinks=True)
    exp = root / EXP
    outside = _outside_target(tmp_path)
    case = sorted((exp / "cases").iterdir())[0]
    if where == "case":
        shutil.rmtree(case)
        case.symlink_to(outside, target_is_directory=True)
    elif where == "cases":
        shutil.rmtree(exp / "cases")
        (exp / "cases").symlink_to(outside, target_is_directory=True)
    elif where == "attempt":
        shutil.copytree(case / "a-0001", outside / "a-0002")  # a valid-looking attempt
        (case / "a-0002").symlink_to(outside / "a-0002", target_is_directory=True)
    elif where == "experiment":
        shutil.rmtree(exp)
        exp.symlink_to(outside, target_is_directory=True)
    else:
        shutil.copyfile(exp / where, outside / where)
        (exp / where).unlink()
        (exp / where).symlink_to(outside / where)
    before = snapshot(outside)
    # --no-resume: every case is scored and published again, so every path gets written
    code, out = cli_output("run", experiment, *RUN_FLAGS, "--no-resume", "--output-root", root)
    assert "Traceback" not in out
    assert snapshot(outside) == before, f"written through the {where} symlink"
    if code == 2:
        assert "xconf: error [artifacts." in out, out
    else:  # wrote elsewhere, inside the root, and the run completed
        assert code == 1, out
        assert where == "attempt"
        assert (case / "a-0003" / "COMPLETE").is_file()
        found = {(f.case_id, f.attempt_id): f.status for f in verify_run(exp).findings}
        # a damaged attempt with a valid later one is history: shown, superseded
        assert found[(case.name, "a-0002")] == "superseded"


@pytest.mark.parametrize("bad", ["../escape", "..", "a/b", "/abs", "x" * 200, "", "a\x00b"])
def test_unsafe_ids_never_reach_the_filesystem(tmp_path: Path, bad: str) -> None:
    root = tmp_path / "root"
    with pytest.raises(ArtifactError) as error:
        ExperimentStore(root, bad)
    assert error.value.code == "artifacts.unsafe_id"
    store = ExperimentStore(root, "ok")
    with pytest.raises(ArtifactError):
        store.case_dir(bad)
    assert not any(tmp_path.rglob("escape")) and not (tmp_path.parent / "escape").exists()


def test_the_run_log_is_never_appended_through_a_symlink(tmp_path: Path) -> None:
    """``xconf.log`` grows by appends (every run that had third-party output): a symlink
    planted there is replaced by the log itself; the file it pointed at is never touched."""
    import io

    from xconf.run_output import RUN_LOG, _append_log

    run = tmp_path / "run"
    run.mkdir()
    outside = tmp_path / "outside.txt"
    outside.write_bytes(b"precious\n")
    (run / RUN_LOG).symlink_to(outside)
    _append_log(run / RUN_LOG, io.BytesIO(b"engine line 1\n"), "T1")
    _append_log(run / RUN_LOG, io.BytesIO(b"engine line 2\n"), "T2")
    assert outside.read_bytes() == b"precious\n"
    log = run / RUN_LOG
    assert not log.is_symlink()
    text = log.read_text()
    assert text.count("== xconf: third-party output") == 2
    assert "engine line 1" in text and text.index("engine line 1") < text.index("engine line 2")
