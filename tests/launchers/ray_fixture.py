"""Session fixture: the local two-node Ray cluster of scripts/ray-up, on 127.0.0.1.

CI starts it (scripts/ci-services-up) and exports ``XCONF_RAY_ADDRESS`` and
``XCONF_REQUIRE_RAY=1``. Elsewhere the fixture starts it and stops it at session end
(``XCONF_RAY_KEEP=1`` leaves it running). When no cluster can be had the Ray tests skip with
the reason, unless ``XCONF_REQUIRE_RAY=1``: then that is a failure.
"""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

REPO = Path(__file__).resolve().parents[2]
UP_TIMEOUT_S = 180


def _answers(address: str) -> bool:
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=3).close()
    except (OSError, ValueError):
        return False
    return True


def _unavailable(message: str) -> None:
    if os.environ.get("XCONF_REQUIRE_RAY") == "1":
        pytest.fail(message + " [XCONF_REQUIRE_RAY=1]")
    pytest.skip(message)


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[str]:
    """The cluster's address (``127.0.0.1:<port>``)."""
    given = os.environ.get("XCONF_RAY_ADDRESS")
    if given:
        if not _answers(given):
            _unavailable(f"XCONF_RAY_ADDRESS={given}: no Ray cluster answers there")
        yield given
        return
    try:
        up = subprocess.run(
            [str(REPO / "scripts" / "ray-up")], capture_output=True, text=True, timeout=UP_TIMEOUT_S
        )
        failure = None if up.returncode == 0 else up.stderr.strip()[-800:]
    except (OSError, subprocess.TimeoutExpired) as exc:
        failure = f"{type(exc).__name__}: {exc}"
    if failure is not None:
        subprocess.run([str(REPO / "scripts" / "ray-down")], timeout=120, check=False)
        _unavailable(f"local Ray cluster could not start (scripts/ray-up): {failure}")
    address = up.stdout.strip().rpartition("XCONF_RAY_ADDRESS=")[2]
    try:
        yield address
    finally:
        if os.environ.get("XCONF_RAY_KEEP") != "1":
            subprocess.run([str(REPO / "scripts" / "ray-down")], timeout=120, check=False)


def rank_actors() -> list[int]:
    """Pids of every xconf rank actor alive on this machine (Ray names its worker processes
    after the actor class they hold)."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        line = " ".join(proc.info["cmdline"] or ())
        if line.startswith("ray::RankActor"):
            found.append(proc.info["pid"])
    return found
