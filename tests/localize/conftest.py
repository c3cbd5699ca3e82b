"""Runs shared by the localize tests: each tiny experiment is run once per session."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.adapters.conftest import HAVE_HF, model_cache  # noqa: F401  (shared fixture)
from tests.localize import planted

PLANT_TRAINING = {"side": "training", "module": "model.layers.3.mlp", "factor": 1 + 1e-3}


@pytest.fixture(scope="session")
def planted_run(model_cache: str, tmp_path_factory: pytest.TempPathFactory) -> Any:  # noqa: F811
    """hf_pair, 4 layers; the case's training side scales layer 3's MLP output by 1 + 1e-3."""
    if not HAVE_HF:
        pytest.skip("transformers/tokenizers are not installed")
    root = tmp_path_factory.mktemp("planted")
    return planted.run(
        planted.experiment("planted", planted.OPERATOR_CASE),
        root,
        planted.runtime("hf_pair", PLANT_TRAINING),
    )


@pytest.fixture(scope="session")
def clean_run(model_cache: str, tmp_path_factory: pytest.TempPathFactory) -> Any:  # noqa: F811
    """hf_pair with the runtime's default model (what `xconf localize` rebuilds), no plant."""
    if not HAVE_HF:
        pytest.skip("transformers/tokenizers are not installed")
    from xconf.localize.replay import runtime_for

    root = tmp_path_factory.mktemp("clean")
    return planted.run(
        planted.experiment("clean", planted.OPERATOR_CASE), root, runtime_for("hf-pair")
    )


def case_of(summary: Any, baseline: bool = False) -> str:
    return next(r.case_id for r in summary.records if (r.label == "baseline") == baseline)


def run_dir(summary: Any) -> Path:
    return Path(summary.experiment_dir)
