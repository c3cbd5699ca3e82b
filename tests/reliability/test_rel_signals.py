"""Ctrl-C and SIGTERM stop a run or a sweep: exit 130 / 143, no orphans, no false verdict.

The real `xconf-run` runs in its own session (process group) with `HeldRuntime`, which holds
the baseline case while a file exists. Once that case is in flight the test signals the parent,
the whole group, or sends SIGTERM (what schedulers send); then it checks the exit code, the
time to stop, that every process the run had started is gone, and that the store is merely
incomplete (`xconf verify` exit 3: the held case has no verdict, nothing is damaged). The same
command then resumes to a complete, valid run.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from xconf.verify import verify_run

REPO = Path(__file__).resolve().parents[2]
HELD = "tests.reliability.relruntimes:HeldRuntime"
# The experiment's own interventions dropped: the baseline (held) and one more case.
SWEEP = ["interventions=[]", "batch.size=choice(3)"]
STOP_BUDGET_S = 15.0  # generous for a busy 2-core box; the figure printed is the real one


def command(tmp: Path, *, sweep: bool, launcher: str | None = None) -> list[str]:
    argv = [sys.executable, "-m", "xconf.cli.hydra_app"]
    if sweep:
        argv += ["-m", *SWEEP, f"hydra.sweep.dir={tmp / 'sweep'}"]
    else:
        argv += ["interventions=[]", f"hydra.run.dir={tmp / 'run'}"]
    if launcher:
        argv += [f"hydra/launcher={launcher}", "hydra.launcher.shutdown_timeout_s=2"]
    return [
        *argv,
        "+experiment=cpu_smoke",
        "allow_smoke_operators=true",
        f"runtime._target_={HELD}",
        f"+runtime.hold={tmp / 'hold'}",
        f"output_root={tmp / 'out'}",
    ]


def start(tmp: Path, argv: list[str], log: str) -> tuple[subprocess.Popen[bytes], float]:
    """Start the run holding the baseline; returns once that case is in flight."""
    (tmp / "hold").write_text("", "utf-8")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with (tmp / log).open("wb") as out:
        proc = subprocess.Popen(
            argv, cwd=tmp, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    deadline = time.monotonic() + 180
    while not list(tmp.glob("hold.*.started")):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError((tmp / log).read_text("utf-8", "replace")[-3000:])
        time.sleep(0.1)
    return proc, time.monotonic()


def tree(pid: int) -> list[psutil.Process]:
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


def left_over(processes: list[psutil.Process]) -> list[int]:
    """Processes of the run's tree still alive (is_running also checks the start time)."""
    deadline = time.monotonic() + 5  # zombies of the group's last children being reaped
    while True:
        alive = [p.pid for p in processes if p.is_running() and p.status() != "zombie"]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.1)


def stop(proc: subprocess.Popen[bytes], how: str) -> tuple[int, float, list[int]]:
    """Signal the run as ``how`` says; (exit code, seconds to stop, pids left)."""
    processes = tree(proc.pid)
    sent = time.monotonic()
    if how == "SIGINT parent":
        os.kill(proc.pid, signal.SIGINT)
    elif how == "SIGTERM":
        os.kill(proc.pid, signal.SIGTERM)
    elif how == "SIGINT group":
        os.killpg(proc.pid, signal.SIGINT)
    elif how == "SIGINT group twice":
        os.killpg(proc.pid, signal.SIGINT)
        time.sleep(0.3)
        os.killpg(proc.pid, signal.SIGINT)
    else:
        raise ValueError(how)
    try:
        code = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return code, time.monotonic() - sent, left_over(processes)


def verify_code(tmp: Path) -> int:
    return verify_run(tmp / "out" / "cpu-smoke").exit_code


def resumes_to_completion(tmp: Path, argv: list[str], timeout_s: float = 300) -> None:
    """Release the held case and run the same command again: every case judged, exit 0,
    the store complete and valid (`verify` 0)."""
    (tmp / "hold").unlink()
    rerun = subprocess.run(
        argv,
        cwd=tmp,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
    assert verify_code(tmp) == 0


def expected_code(how: str) -> int:
    return 143 if how == "SIGTERM" else 130


def check_stopped(tmp: Path, how: str, code: int, took: float, left: list[int], log: str) -> None:
    text = (tmp / log).read_text("utf-8", "replace")
    print(f"{how}: exit {code}, time to stop {took:.2f}s, processes left: {len(left)}")
    assert code == expected_code(how), text[-3000:]
    assert left == []
    assert took < STOP_BUDGET_S
    assert "Traceback" not in text
    # The held case has no verdict and nothing is damaged: incomplete, not invalid.
    assert verify_code(tmp) == 3


@pytest.mark.parametrize("how", ["SIGINT parent", "SIGTERM"])
def test_single_run_stops_on_a_signal_and_resumes(tmp_path: Path, how: str) -> None:
    argv = command(tmp_path, sweep=False)
    proc, _ = start(tmp_path, argv, "first.log")
    code, took, left = stop(proc, how)
    check_stopped(tmp_path, how, code, took, left, "first.log")
    resumes_to_completion(tmp_path, argv)


@pytest.mark.slow
@pytest.mark.parametrize("how", ["SIGINT parent", "SIGINT group", "SIGTERM", "SIGINT group twice"])
def test_torchrun_sweep_stops_launching_and_ends_its_ranks(tmp_path: Path, how: str) -> None:
    argv = command(tmp_path, sweep=True, launcher="torchrun")
    proc, _ = start(tmp_path, argv, "first.log")
    code, took, left = stop(proc, how)
    check_stopped(tmp_path, how, code, took, left, "first.log")
    # Stopped launching: the second case's job never started.
    assert not (tmp_path / "sweep" / "1").exists()
    if how != "SIGINT parent":
        return
    resumes_to_completion(tmp_path, argv)
    print(f"resumed after {how}: exit 0, verify 0")
