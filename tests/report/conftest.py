"""Fixtures for the drift report tests: run directories written in the documented format."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from report_fixtures import standard_specs, write_run


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    """Baseline pass, two failures, zero active tokens, tampered, unsealed and error cases."""
    return write_run(tmp_path / "outputs", "exp-report", standard_specs())
