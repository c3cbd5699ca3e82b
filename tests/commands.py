"""`xconf-run` in a subprocess, as a user runs it: the one place its test environment is set."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def xconf_run(cwd: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """``xconf-run ARGS`` (the Hydra app) started from ``cwd``: xconf imported from this
    checkout, one intra-op thread (the CI machines are small and shared) and a wide terminal
    (tables are not wrapped, so the tests can read them); never raises on a non-zero exit."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": "1",
        "COLUMNS": "200",
    }
    return subprocess.run(
        [sys.executable, "-m", "xconf.cli.hydra_app", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
