"""Faults of a sweep on the real local Ray cluster: Ctrl-C / SIGTERM, a rank's worker killed.

The sweep's two S0 cases run at once, one on each node; the baseline is held in its rank
(`HeldRuntime`) while the other is judged. A stop signal must kill every rank actor and exit
130 / 143 within seconds, leaving the store merely incomplete; a worker killed mid-case must
end that case as a failed case with the reason while the sweep judges the other; and the same
command must then resume to a complete, valid run.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.launchers.ray_fixture import rank_actors
from tests.launchers.test_ray_runs import no_rank_actor_left
from tests.reliability.test_rel_signals import (
    HELD,
    SWEEP,
    check_stopped,
    resumes_to_completion,
    start,
    stop,
    verify_code,
)

BOUND_S = 240


def command(tmp: Path, address: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "xconf.cli.hydra_app",
        "-m",
        *SWEEP,
        f"hydra.sweep.dir={tmp / 'sweep'}",
        "hydra/launcher=xconf_ray",
        f"hydra.launcher.address={address}",
        "+experiment=cpu_smoke",
        "allow_smoke_operators=true",
        f"runtime._target_={HELD}",
        f"+runtime.hold={tmp / 'hold'}",
        f"output_root={tmp / 'out'}",
    ]


@pytest.mark.slow
@pytest.mark.parametrize("how", ["SIGINT parent", "SIGTERM"])
def test_stop_signal_kills_every_rank_actor_and_resumes(
    ray_cluster: str,
    tmp_path: Path,
    how: str,
) -> None:
    argv = command(tmp_path, ray_cluster)
    proc, _ = start(tmp_path, argv, "first.log")
    assert rank_actors()  # the held case's rank is in flight on the cluster
    code, took, left = stop(proc, how)
    check_stopped(tmp_path, how, code, took, left, "first.log")
    text = (tmp_path / "first.log").read_text("utf-8", "replace")
    assert "stop requested: cancelled" in text and "rank actor(s) killed" in text, text[-3000:]
    assert no_rank_actor_left() == []
    if how == "SIGTERM":  # what schedulers send; one resume keeps the test's cost down
        resumes_to_completion(tmp_path, argv, BOUND_S)


@pytest.mark.slow
def test_worker_killed_mid_case_is_a_failed_case_and_the_sweep_goes_on(
    ray_cluster: str,
    tmp_path: Path,
) -> None:
    argv = command(tmp_path, ray_cluster)
    proc, _ = start(tmp_path, argv, "first.log")
    (held,) = tmp_path.glob("hold.*.started")
    worker = int(held.name.split(".")[1])  # the held rank's own process: a Ray worker
    assert worker in rank_actors()
    since = time.monotonic()
    os.kill(worker, signal.SIGKILL)
    try:
        code = proc.wait(timeout=BOUND_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise AssertionError("the sweep hung after its worker was killed") from None
    took = time.monotonic() - since
    out = (tmp_path / "first.log").read_text("utf-8", "replace")
    print(f"sweep ended {took:.1f}s after the kill, exit {code}")
    reason = next((ln for ln in out.splitlines() if "baseline: job failed" in ln), out[-3000:])
    print(reason)
    # The killed case failed with the reason; the other case was still judged.
    assert code == 1, out[-3000:]
    assert "baseline: job failed (launch.rank_failed): rank 0's Ray worker" in reason
    assert f"pid {worker} on node 127.0.0.1" in reason and "died mid-case" in reason
    assert "batch.size=3" in out and "│ pass" in out
    assert "Traceback" not in out
    assert verify_code(tmp_path) == 3  # incomplete, not damaged
    assert no_rank_actor_left() == []
    resumes_to_completion(tmp_path, argv, BOUND_S)
