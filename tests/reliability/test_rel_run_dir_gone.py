"""Campaign 3, faults: the run directory deleted while the run writes it. The run notices
before its next write and stops with a coded error naming the directory; it re-creates
nothing (before: nine cases were sealed in a re-created tree without experiment.json).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.reliability.relhelpers import write_experiment
from xconf.adapters.cpu_smoke.adapter import CpuSmokeRuntime
from xconf.errors import XconfError


class DeletingRuntime(CpuSmokeRuntime):
    """Deletes (or replaces) ``victim`` when the rollout engine of the bfloat16 case is built."""

    def __init__(self, victim: str, replace: bool = False, **options: Any) -> None:
        super().__init__(**options)
        self.victim = Path(victim)
        self.replace = replace

    def build_engine(self, binding: Any, case: Any) -> Any:
        bf16 = case.case.knob_dict().get("rollout.dtype") == "bfloat16"
        if binding.side == "rollout" and bf16 and self.victim.exists():
            shutil.rmtree(self.victim)
            if self.replace:
                self.victim.mkdir()
        return super().build_engine(binding, case)


@pytest.mark.parametrize("replace", [False, True], ids=["deleted", "replaced"])
def test_run_directory_deleted_mid_run_stops_with_a_coded_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], replace: bool
) -> None:
    from xconf.config.strict import load_experiment_file
    from xconf.session import Outcome, guarded, instantiate_runtime, prepare, run_prepared

    root = tmp_path / "root"
    run_dir = root / "rel-s0"
    spec = load_experiment_file(write_experiment(tmp_path / "in"))
    target = "tests.reliability.test_rel_run_dir_gone:DeletingRuntime"
    adapter = instantiate_runtime({"_target_": target, "victim": str(run_dir), "replace": replace})
    prepared = prepare(spec, output_root=root, allow_smoke_operators=True, device="cpu")

    def step() -> Outcome:
        run_prepared(prepared, adapter, resume=True)
        return Outcome(0)

    outcome = guarded(step)
    err = capsys.readouterr().err
    assert outcome.exit_code == 2, err
    assert isinstance(outcome.error, XconfError) and outcome.error.code == "artifacts.run_dir_gone"
    assert str(run_dir) in err and "Traceback" not in err
    # Nothing was re-created: no case directory without its experiment header.
    assert not (run_dir / "cases").exists()
    assert list(run_dir.iterdir()) == [] if replace else not run_dir.exists()
