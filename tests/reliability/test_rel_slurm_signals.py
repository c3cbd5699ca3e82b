"""Ctrl-C and SIGTERM to a sweep on the real local Slurm cluster (``xconf_submitit_slurm``).

The sweep submits its two S0 cases as Slurm jobs and holds the baseline case in its job
(`HeldRuntime`). Once it is in flight the test signals `xconf-run`: it must cancel every job
it submitted (``sacct``: none left PENDING or RUNNING), exit 130 / 143 without a traceback or
a verdict for the held case, leave the store merely incomplete (`xconf verify` exit 3), and the
same command must then resume to a complete, valid run (checked after SIGTERM).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.launchers.conftest import slurm_cluster  # noqa: F401 (the fixture)
from tests.reliability.test_rel_signals import (
    STOP_BUDGET_S,
    expected_code,
    resumes_to_completion,
    verify_code,
)
from tests.reliability.test_rel_slurm_faults import BOUND_S, command, start

LIVE = ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "RESIZING", "SUSPENDED")


def submitted_jobs(sweep: Path) -> set[str]:
    """The Slurm job ids this sweep submitted: submitit keeps one folder per job under the
    sweep's ``.submitit`` (array tasks as ``<array>_<task>``)."""
    return {p.name.split("_")[0] for p in (sweep / ".submitit").iterdir() if p.is_dir()}


def job_states(jobs: set[str]) -> dict[str, str]:
    """``sacct`` state of every job and array task of ``jobs`` (steps left out)."""
    done = subprocess.run(
        ["sacct", "-n", "-X", "-P", "-o", "JobID,State", "-j", ",".join(sorted(jobs))],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    pairs = (line.split("|", 1) for line in done.stdout.splitlines() if "|" in line)
    return {job: state.split()[0] for job, state in pairs}


def in_queue(jobs: set[str]) -> list[str]:
    done = subprocess.run(
        ["squeue", "-h", "-o", "%i %T", "-j", ",".join(sorted(jobs))],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,  # squeue exits 1 for job ids it no longer knows: none queued
    )
    return [line for line in done.stdout.splitlines() if line.strip()]


def settled(jobs: set[str], held: str, bound_s: float = 60.0) -> tuple[dict[str, str], float]:
    """Wait until no job of ``jobs`` is live and ``held`` has its own accounting record:
    slurmctld records a cancel asynchronously, and slurmdbd may still list an array by its
    pending record (``180``) before its tasks' own (``180_0``) arrive."""
    since = time.monotonic()
    while True:
        states = job_states(jobs)
        over = states and not any(s in LIVE for s in states.values()) and not in_queue(jobs)
        if (over and held in states) or time.monotonic() - since > bound_s:
            return states, time.monotonic() - since
        time.sleep(0.5)


@pytest.mark.slow
@pytest.mark.parametrize("how", ["SIGINT", "SIGTERM"])
def test_slurm_sweep_stop_cancels_its_jobs_and_resumes(
    slurm_cluster: Path,  # noqa: F811
    tmp_path: Path,
    how: str,
) -> None:
    proc, (held, _) = start(tmp_path)  # the held baseline case is in flight in its job
    jobs = submitted_jobs(tmp_path / "sweep")
    assert jobs
    sent = time.monotonic()
    os.kill(proc.pid, signal.SIGINT if how == "SIGINT" else signal.SIGTERM)
    try:
        out, _ = proc.communicate(timeout=BOUND_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise AssertionError("the sweep did not stop after the signal") from None
    took = time.monotonic() - sent
    states, to_settle = settled(jobs, held)
    print(
        f"slurm sweep, {how}: exit {proc.returncode}, time to stop {took:.2f}s, "
        f"jobs {sorted(states.items())} settled {to_settle:.1f}s later"
    )
    assert proc.returncode == expected_code(how), out[-3000:]
    assert took < STOP_BUDGET_S, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    assert "cancelled" in out and "submitted job(s)" in out, out[-3000:]
    # Every job it submitted is over (none lives on); the held one was cancelled.
    assert states and not [s for s in states.values() if s in LIVE], states
    assert in_queue(jobs) == []
    # Its own record, or (accounting lagging past the bound) the array's record holding it.
    held_state = states.get(held, states.get(held.split("_")[0]))
    assert held_state == "CANCELLED", (held, states)
    # The held case has no verdict and nothing is damaged: incomplete, not invalid.
    assert verify_code(tmp_path) == 3
    if how == "SIGTERM":  # what schedulers send; one resume keeps the test's cost down
        resumes_to_completion(tmp_path, command(tmp_path), BOUND_S)
