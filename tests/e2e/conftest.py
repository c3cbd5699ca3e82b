"""End-to-end fixtures: one real `xconf run` of the S0 example, shared by the e2e modules."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest

from tests.conftest import S0_JSON
from xconf.cli.main import main

EXPERIMENT = "cpu-smoke-json"
RUN = ("run", str(S0_JSON), "--runtime", "cpu-smoke", "--allow-smoke-operators")


def xconf_run(root: Path, *extra: str) -> tuple[int, str]:
    """`xconf run` of the S0 example in-process; returns (exit code, stdout + stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([*RUN, "--output-root", str(root), *extra])
    return code, out.getvalue() + err.getvalue()


@pytest.fixture(scope="session")
def first_run(tmp_path_factory) -> tuple[Path, int, str]:
    """The S0 example run once into a fresh output root: (root, exit code, output)."""
    root = tmp_path_factory.mktemp("first") / "out"
    code, output = xconf_run(root)
    return root, code, output
