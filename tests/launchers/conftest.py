"""Session fixture: a real one-node Slurm cluster from scripts/slurm-up.

Skips the Slurm tests with the reason when the cluster cannot start, unless
XCONF_REQUIRE_SLURM=1 (CI), where that is a failure. The cluster is stopped at session end
if this session started it (XCONF_SLURM_KEEP=1 leaves it running).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.launchers.ray_fixture import ray_cluster  # noqa: F401 (the Ray tests' fixture)

REPO = Path(__file__).resolve().parents[2]
STATE = Path(os.environ.get("XCONF_SLURM_DIR", "/tmp/xconf-slurm"))
UP_TIMEOUT_S = 600  # a first start may install packages with apt-get


def _running() -> bool:
    pid_file = STATE / "run" / "slurmctld.pid"
    try:
        return "slurmctld" in (Path("/proc") / pid_file.read_text().strip() / "cmdline").read_text()
    except OSError:
        return False


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[Path]:
    required = os.environ.get("XCONF_REQUIRE_SLURM") == "1"
    was_running = _running()
    try:
        proc = subprocess.run(
            [str(REPO / "scripts" / "slurm-up")],
            capture_output=True,
            text=True,
            timeout=UP_TIMEOUT_S,
        )
        failure = None if proc.returncode == 0 else proc.stderr.strip()[-800:]
    except (OSError, subprocess.TimeoutExpired) as exc:
        failure = f"{type(exc).__name__}: {exc}"
    if failure is not None:
        if not was_running:  # don't leave a half-started cluster behind
            subprocess.run([str(REPO / "scripts" / "slurm-down")], timeout=120, check=False)
        message = f"local Slurm cluster could not start (scripts/slurm-up): {failure}"
        if required:
            pytest.fail(message + " [XCONF_REQUIRE_SLURM=1]")
        pytest.skip(message)
    conf = STATE / "etc" / "slurm.conf"
    old = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(conf)
    try:
        yield conf
    finally:
        if old is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = old
        if not was_running and os.environ.get("XCONF_SLURM_KEEP") != "1":
            subprocess.run([str(REPO / "scripts" / "slurm-down")], timeout=120, check=False)
