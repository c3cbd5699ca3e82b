"""Slurm faults on the real local cluster: a job cancelled with scancel, slurmd killed mid-job.

The sweep holds its baseline case in a Slurm job (`HeldRuntime`) and the fault hits that job.
Required: the case ends as a failed case with the reason, the sweep goes on to judge the
other case, nothing hangs, and the same command afterwards resumes to a complete run.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from tests.launchers.conftest import STATE, slurm_cluster  # noqa: F401 (the fixture)
from tests.reliability.test_rel_signals import resumes_to_completion
from xconf.verify import verify_run

REPO = Path(__file__).resolve().parents[2]
BOUND_S = 240  # a fault must end the sweep well within this, never hang


def command(tmp: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "xconf.cli.hydra_app",
        "-m",
        "interventions=[]",
        "batch.size=choice(3)",
        "+experiment=cpu_smoke",
        "allow_smoke_operators=true",
        "hydra/launcher=xconf_submitit_slurm",
        "hydra.launcher.timeout_min=10",
        # One CPU per case, so both cases run side by side on the 2-CPU node (a world of one
        # rank otherwise gets the whole node: the other case would wait behind the faulted one,
        # and after slurmd's death wait on a down node).
        "hydra.launcher.cpus_per_task=1",
        "runtime._target_=tests.reliability.relruntimes:HeldRuntime",
        f"+runtime.hold={tmp / 'hold'}",
        f"output_root={tmp / 'out'}",
        f"hydra.sweep.dir={tmp / 'sweep'}",
    ]


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO)}


def held_job(tmp: Path, proc: subprocess.Popen[str]) -> tuple[str, str]:
    """Wait until the baseline case is in flight in a Slurm job: (job id, raw job id)."""
    deadline = time.monotonic() + BOUND_S
    while True:
        started = [p for p in tmp.glob("hold.*.started") if p.read_text("utf-8").strip()]
        if started:
            job, raw = started[0].read_text("utf-8").split()
            return job, raw
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"the held job never started (exit {proc.poll()})")
        time.sleep(0.2)


def finish(proc: subprocess.Popen[str], since: float) -> tuple[int, str, float]:
    try:
        out, _ = proc.communicate(timeout=BOUND_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError("the sweep hung after the fault") from None
    return proc.returncode, out, time.monotonic() - since


def restore_cluster() -> None:
    subprocess.run([str(REPO / "scripts" / "slurm-up")], timeout=300, check=False)
    subprocess.run(
        ["scontrol", "update", "nodename=xconf-node", "state=resume"],
        timeout=30,
        check=False,
        capture_output=True,
    )


def check_fault_then_resume(
    tmp: Path, proc: subprocess.Popen[str], since: float, repair: Callable[[], None] = lambda: None
) -> str:
    code, out, took = finish(proc, since)
    repair()
    print(f"sweep ended {took:.1f}s after the fault, exit {code}")
    # The held case failed with the reason; the other case was still judged.
    assert code == 1, out[-3000:]
    assert "baseline: job failed (launch.submitit.job_failed)" in out, out[-3000:]
    assert "without a result" in out
    assert "batch.size=3" in out and "│ pass" in out
    assert verify_run(tmp / "out" / "cpu-smoke").exit_code == 3  # incomplete, not damaged
    resumes_to_completion(tmp, command(tmp), BOUND_S)
    return out


def start(tmp: Path) -> tuple[subprocess.Popen[str], tuple[str, str]]:
    (tmp / "hold").write_text("", "utf-8")
    proc = subprocess.Popen(
        command(tmp),
        cwd=tmp,
        env=env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    return proc, held_job(tmp, proc)


@pytest.mark.slow
def test_scancelled_job_is_a_failed_case_and_the_sweep_goes_on(
    slurm_cluster: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    proc, (job, _) = start(tmp_path)
    since = time.monotonic()
    subprocess.run(["scancel", job], check=True, timeout=30)
    out = check_fault_then_resume(tmp_path, proc, since)
    # The reason names the cancellation: Slurm's state, or the signal the job received.
    reason = next(line for line in out.splitlines() if "baseline: job failed" in line)
    print(reason)
    assert "CANCELLED" in reason or "interrupted by SIGTERM" in reason, out[-3000:]


def job_processes(job: str) -> list[int]:
    """The processes of Slurm job ``job`` (raw id): its slurmstepd and every task it started."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        line = " ".join(proc.info["cmdline"] or ())
        try:
            ours = proc.environ().get("SLURM_JOB_ID") == job
        except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess):
            ours = False
        if ours or line.startswith(f"slurmstepd: [{job}."):
            found.append(proc.info["pid"])
    return found


def _slurmd_pid() -> int:
    return int((STATE / "run" / "slurmd.pid").read_text().strip())


@pytest.fixture
def slurmd_restored(slurm_cluster: Path) -> Iterator[None]:  # noqa: F811
    """Whatever the test does to slurmd, later tests get a working cluster back."""
    try:
        yield
    finally:
        restore_cluster()


@pytest.mark.slow
@pytest.mark.usefixtures("slurmd_restored")
def test_slurmd_killed_mid_job_is_a_failed_case_and_the_sweep_goes_on(tmp_path: Path) -> None:
    proc, (_, raw) = start(tmp_path)
    since = time.monotonic()
    os.kill(_slurmd_pid(), signal.SIGKILL)
    # The node is lost as far as the controller can tell: the job's processes go with slurmd.
    for pid in job_processes(raw):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    out = check_fault_then_resume(tmp_path, proc, since, repair=restore_cluster)
    print(next(line for line in out.splitlines() if "baseline: job failed" in line))
