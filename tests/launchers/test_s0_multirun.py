"""The S0 experiment swept through the torchrun and Slurm launchers, as users run it."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests import commands

REPO = Path(__file__).resolve().parents[2]
SMOKE = ["+experiment=cpu_smoke", "allow_smoke_operators=true", "interventions=[]"]
SHARDING = "training.sharding=unsharded,fsdp"  # fsdp: a case whose topology needs 2 ranks


def xconf_run(
    cwd: Path, *overrides: str, multirun: bool = True
) -> subprocess.CompletedProcess[str]:
    return commands.xconf_run(cwd, *(["-m"] if multirun else []), *overrides)


def case_dirs(root: Path, experiment: str = "cpu-smoke") -> dict[str, Path]:
    """case id -> its newest attempt directory."""
    found = {}
    for case in sorted((root / experiment / "cases").iterdir()):
        found[case.name] = sorted(case.iterdir())[-1]
    return found


def verdicts(root: Path) -> dict[str, dict]:
    return {c: json.loads((a / "comparison.json").read_text()) for c, a in case_dirs(root).items()}


def assert_bitwise_equal(left: Path, right: Path) -> None:
    for name in (
        "score_rollout.safetensors",
        "score_training.safetensors",
        "token_diffs.safetensors",
    ):
        a, b = load_file(str(left / name)), load_file(str(right / name))
        assert a.keys() == b.keys()
        for key in a:
            assert a[key].dtype == b[key].dtype
            bits_a, bits_b = (
                a[key].reshape(-1).view(torch.uint8),
                b[key].reshape(-1).view(torch.uint8),
            )
            assert torch.equal(bits_a, bits_b), (name, key)


@pytest.mark.slow
def test_torchrun_runs_two_real_ranks_and_matches_the_in_process_run(tmp_path: Path) -> None:
    swept = xconf_run(
        tmp_path,
        *SMOKE,
        "hydra/launcher=torchrun",
        SHARDING,
        f"output_root={tmp_path / 'torchrun'}",
        f"hydra.sweep.dir={tmp_path / 'mr'}",
    )
    assert swept.returncode == 1, swept.stdout[-3000:] + swept.stderr[-3000:]
    results = verdicts(tmp_path / "torchrun")
    assert sorted(v["result"] for v in results.values()) == ["error", "pass"]
    # The fsdp case ran on two real processes (cpu-smoke then refuses fsdp, truthfully).
    launches = [json.loads(p.read_text()) for p in (tmp_path / "mr").glob("*/launch.json")]
    assert sorted(launch["world_size"] for launch in launches) == [1, 2]
    assert list((tmp_path / "mr").glob("*/*rank1.log"))
    refused = next(v for v in results.values() if v["result"] == "error")
    assert refused["error"]["code"] == "runtime.strict_refused"
    assert "training.sharding" in refused["reason"]
    # Where the topology allows one process, the artifacts equal the in-process run's.
    single = xconf_run(tmp_path, *SMOKE, f"output_root={tmp_path / 'inproc'}", multirun=False)
    assert single.returncode == 0, single.stderr[-3000:]
    ((case_id, in_process),) = case_dirs(tmp_path / "inproc").items()
    assert_bitwise_equal(case_dirs(tmp_path / "torchrun")[case_id], in_process)


@pytest.mark.slow
def test_slurm_runs_one_and_two_task_jobs_and_a_dead_job_is_a_failed_case(
    slurm_cluster: Path, tmp_path: Path
) -> None:
    swept = xconf_run(
        tmp_path,
        *SMOKE,
        "hydra/launcher=xconf_submitit_slurm",
        "hydra.launcher.timeout_min=5",
        "runtime._target_=tests.sweeper.failing_runtime:ExitingRuntime",
        "+runtime.exit_on_batch_size=3",
        SHARDING,
        "batch.size=2,3",
        f"output_root={tmp_path / 'out'}",
        f"hydra.sweep.dir={tmp_path / 'mr'}",
    )
    assert swept.returncode == 1, swept.stdout[-3000:] + swept.stderr[-3000:]
    results = verdicts(tmp_path / "out")
    assert sorted(v["result"] for v in results.values()) == ["error", "pass"]
    # The dead job (batch.size=3) came back as a failed case, not a hung or crashed sweep.
    assert "batch.size=3: job failed" in swept.stdout
    tasks = sorted(
        int(json.loads(p.read_text())["num_tasks"])
        for p in (tmp_path / "mr").rglob("slurm_tasks.json")
    )
    assert tasks in ([], [1, 2])  # recorded when the launcher writes it
