"""Reliability campaigns: one intra-op thread (small shared CI machines)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from tests.reliability.relhelpers import RUN_FLAGS, cli, write_experiment

torch.set_num_threads(1)
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The experiment file and the output root of one sealed S0 run per test module, for the
    module's tests to copy and damage (S0 fails some cases on purpose: exit 1)."""
    base = tmp_path_factory.mktemp("pristine")
    experiment = write_experiment(base)
    root = base / "pristine"
    assert cli("run", experiment, *RUN_FLAGS, "--output-root", root) == 1
    return experiment, root
