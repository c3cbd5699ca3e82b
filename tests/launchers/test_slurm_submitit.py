"""hydra/launcher=submitit_slurm on the real local cluster: ranks per Slurm task, a dead job.

Each test runs the tiny app in tests/launchers/apps as a Hydra multirun in a subprocess
(as a user would), bounded by a wall-clock timeout.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from xconf.launchers.submitit_resources import group_jobs

APP = Path(__file__).parent / "apps" / "slurm_app.py"
REPO = Path(__file__).resolve().parents[2]
RUN_BOUND_S = 300


def _multirun(
    sweep_dir: Path, overrides: list[str], launcher: str = "submitit_slurm"
) -> subprocess.CompletedProcess[str]:
    path = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path}
    cmd = [
        sys.executable,
        str(APP),
        "-m",
        f"hydra/launcher={launcher}",
        f"hydra.sweep.dir={sweep_dir}",
        "hydra.launcher.timeout_min=5",
        *overrides,
    ]
    return subprocess.run(
        cmd, capture_output=True, text=True, timeout=RUN_BOUND_S, env=env, cwd=sweep_dir.parent
    )


def _results(sweep_dir: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(sweep_dir.glob("*/result.json"))]


@pytest.mark.slow
def test_one_and_two_tasks_per_job(slurm_cluster: Path, tmp_path: Path) -> None:
    configs = [{"rollout": {"tensor_parallel_size": tp}} for tp in (1, 2)]
    overrides = [[f"rollout.tensor_parallel_size={tp}"] for tp in (1, 2)]
    groups = group_jobs(overrides, configs)
    assert [g.world_size for g in groups] == [1, 2]
    for group in groups:
        sweep_dir = tmp_path / f"world{group.world_size}"
        proc = _multirun(
            sweep_dir, [*group.launcher_overrides(), *group.job_overrides[0], "value=1,3"]
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        results = _results(sweep_dir)
        assert [r["world"] for r in results] == [group.world_size] * 2
        # all_reduce over world ranks of value: sum = value * world.
        world = group.world_size
        assert sorted(r["sum"] for r in results) == [1.0 * world, 3.0 * world]
        # Slurm accounting saw every job complete (the record lags the result file briefly).
        ids = ",".join(r["job_id"] for r in results)
        assert _sacct_states(ids) == {"COMPLETED"}


def _sacct_states(ids: str, bound_s: float = 30.0) -> set[str]:
    deadline = time.monotonic() + bound_s
    while True:
        out = subprocess.run(
            ["sacct", "-n", "-X", "-P", "-o", "State", "-j", ids],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout.split()
        states = set(out)
        if not states & {"RUNNING", "COMPLETING", "PENDING"} or time.monotonic() > deadline:
            return states
        time.sleep(1)


@pytest.mark.slow
def test_dead_job_fails_bounded(slurm_cluster: Path, tmp_path: Path) -> None:
    sweep_dir = tmp_path / "dead"
    start = time.monotonic()
    proc = _multirun(sweep_dir, ["hydra.launcher.tasks_per_node=1", "die=true"])
    elapsed = time.monotonic() - start
    assert proc.returncode != 0
    # submitit reads the job's FAILED state from sacct instead of waiting for a result.
    assert "UncompletedJobError" in proc.stderr and "FAILED" in proc.stderr, proc.stderr[-3000:]
    assert elapsed < RUN_BOUND_S
    assert _results(sweep_dir) == []


@pytest.mark.slow
def test_tolerant_launcher_keeps_other_jobs(slurm_cluster: Path, tmp_path: Path) -> None:
    """xconf_submitit_slurm: the dead job is a FAILED JobReturn; its batch-mate still returns."""
    sweep_dir = tmp_path / "tolerant"
    proc = _multirun(
        sweep_dir,
        ["hydra.launcher.tasks_per_node=1", "die=true,false", "value=4"],
        launcher="xconf_submitit_slurm",
    )
    # Hydra's basic sweeper re-raises the first failed JobReturn once all jobs are back.
    assert proc.returncode != 0
    assert "launch.submitit.job_failed" in proc.stderr, proc.stderr[-3000:]
    assert [r["sum"] for r in _results(sweep_dir)] == [4.0]
