"""launch_world: real torch elastic worlds (gloo), bounded failures, restored signal handlers.

Each launch spawns real processes (a couple of seconds each on a quiet machine); the bounds
below are generous because CI shares its cores.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from xconf.launchers.errors import LaunchTimeoutError, RankFailedError
from xconf.launchers.world import WorldSettings, launch_world, verify_case_agreement

# Upper bound for one failing launch: spawn + import torch + shutdown grace, on 2 busy cores.
FAIL_BOUND_S = 45.0


def _all_reduce_ranks(offset: int) -> int:
    import torch
    import torch.distributed as dist

    from xconf.launchers.rank import join_world

    me = join_world()
    if (me.launcher, me.rank, me.world_size) != ("torchrun", dist.get_rank(), 2):
        raise RuntimeError(f"join_world saw {me}")
    t = torch.tensor([dist.get_rank() + offset])
    dist.all_reduce(t)
    return int(t.item()) * 100 + int(os.environ["OMP_NUM_THREADS"])


def _rank1_raises() -> None:
    import torch.distributed as dist

    if dist.get_rank() == 1:
        raise ValueError("boom on rank 1")


def _rank1_dies_rank0_waits() -> None:
    import torch
    import torch.distributed as dist

    if dist.get_rank() == 1:
        os._exit(3)
    dist.all_reduce(torch.ones(1))  # would wait for the dead rank until the pg timeout


def _sleep_forever() -> None:
    time.sleep(3600)


def _interrupted() -> None:
    raise KeyboardInterrupt


def _disagree() -> None:
    import torch.distributed as dist

    verify_case_agreement(bytes([dist.get_rank()]) * 32)


def test_two_ranks_all_reduce_and_restore_signals(tmp_path: Path) -> None:
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    value, record = launch_world(
        2, f"{__name__}:_all_reduce_ranks", {"offset": 10}, WorldSettings(), tmp_path
    )
    # (10 + 11) from the all_reduce, and OMP_NUM_THREADS=1 set in the rank.
    assert value == 21 * 100 + 1
    assert record.world_size == 2 and record.backend == "gloo"
    assert record.world_shared is False and record.status == "completed"
    assert (tmp_path / "launch.json").is_file()
    assert {s: signal.getsignal(s) for s in before} == before


@pytest.mark.parametrize(
    ("fn", "needle"),
    [
        ("_rank1_raises", "ValueError: boom on rank 1"),
        ("_rank1_dies_rank0_waits", "exited without raising"),
        ("_disagree", "CaseDisagreementError"),
    ],
)
def test_failing_rank_fails_bounded(tmp_path: Path, fn: str, needle: str) -> None:
    settings = WorldSettings(pg_timeout_s=20, job_timeout_s=FAIL_BOUND_S)
    start = time.monotonic()
    with pytest.raises(RankFailedError) as info:
        launch_world(2, f"{__name__}:{fn}", {}, settings, tmp_path)
    assert time.monotonic() - start < FAIL_BOUND_S
    assert info.value.code == "launch.rank_failed"
    assert needle in str(info.value) or needle in repr(info.value.__context__)


def test_watchdog_kills_hung_world(tmp_path: Path) -> None:
    settings = WorldSettings(job_timeout_s=6)
    start = time.monotonic()
    with pytest.raises(LaunchTimeoutError) as info:
        launch_world(2, f"{__name__}:_sleep_forever", {}, settings, tmp_path)
    assert time.monotonic() - start < 6 + 20
    assert info.value.path == "hydra.launcher.job_timeout_s"


# One rank's entry, run as torch elastic runs it, in a fresh interpreter of its own.
_ENTRY = """
import json, os, signal, socket, sys
from dataclasses import asdict
from xconf.launchers.world import WorldSettings, _rank_entry
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                  MASTER_PORT=str(port))
job = json.dumps({"target": "tests.launchers.test_launch_world:_interrupted", "kwargs": {}})
try:
    _rank_entry(job, json.dumps(asdict(WorldSettings())), sys.argv[1])
except KeyboardInterrupt:
    print("ignored" if signal.getsignal(signal.SIGINT) is signal.SIG_IGN else "default")
"""


def test_an_interrupted_rank_ignores_a_second_ctrl_c_while_it_exits(tmp_path: Path) -> None:
    # Ctrl-C twice reaches every rank of the group: the second one, arriving while the rank
    # exits, must find SIGINT ignored (a KeyboardInterrupt there prints a traceback).
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", _ENTRY, str(tmp_path)],
        cwd=repo,
        env={**os.environ, "PYTHONPATH": str(repo)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.stdout.strip() == "ignored", done.stdout + done.stderr[-2000:]


def test_join_world_outside_any_launcher(monkeypatch: pytest.MonkeyPatch) -> None:
    from xconf.launchers.rank import join_world

    monkeypatch.delenv("SUBMITIT_EXECUTOR", raising=False)
    me = join_world()
    assert (me.rank, me.world_size, me.launcher, me.publishes) == (0, 1, "single", True)
