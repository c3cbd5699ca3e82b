"""Each logger writer for real, read back by its own package's formats (no network)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

import xconf
from tests.inloop.readers import tensorboard_scalars, wandb_history


def _figures() -> dict[str, float]:
    g = torch.Generator().manual_seed(1)
    rollout = -torch.rand((4, 8), generator=g)
    verdict = xconf.judge_batch(
        rollout, rollout + 1e-3, torch.ones((4, 8)), rollout_dtype="float32",
        training_dtype="float32",
    )  # fmt: skip
    figures = dict(verdict.figures)
    figures["xconf/rollout_corr/chi2_seq"] = math.nan  # a figure that was not finite
    return figures


def _equal(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b, rel=1e-6)


def test_tensorboard_event_file(tmp_path: Path) -> None:
    from xconf.inloop.loggers import TensorBoardWriter

    figures = _figures()
    writer = TensorBoardWriter(tmp_path / "tb")
    writer.write(figures, 7)
    writer.write({"xconf/pass": 1.0}, 8)
    writer.close()
    scalars = tensorboard_scalars(tmp_path / "tb")
    assert scalars[("xconf/pass", 8)] == 1.0
    for name, value in figures.items():  # event files hold float32
        assert _equal(scalars[(name, 7)], float(torch.tensor(value, dtype=torch.float32))), name


@pytest.mark.slow
def test_mlflow_local_file_store(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    from xconf.inloop.loggers import MlflowWriter

    figures = _figures()
    writer = MlflowWriter(tmp_path / "mlruns", run_name="grpo")
    writer.write(figures, 7)
    writer.write({"xconf/mismatches": 3.0}, 8)
    writer.close()
    client = MlflowClient(tracking_uri=(tmp_path / "mlruns").resolve().as_uri())
    run_id = writer.run_id
    assert run_id is not None
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "grpo"
    history = client.get_metric_history(run_id, "xconf/mismatches")
    assert [(m.step, m.value) for m in history] == [(7, figures["xconf/mismatches"]), (8, 3.0)]
    for name, value in figures.items():
        metric = client.get_metric_history(run_id, name)[0]
        assert metric.step == 7 and _equal(metric.value, value), name


@pytest.mark.slow
def test_wandb_offline_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import psutil

    from xconf.inloop.loggers import WandbWriter

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "cache"))
    figures = _figures()
    writer = WandbWriter(tmp_path / "wandb", name="grpo")
    writer.write(figures, 7)
    writer.write({"xconf/pass": 0.0}, 8)
    writer.close()
    rows = wandb_history(writer.run_dir)
    assert [r["_step"] for r in rows] == [7, 8]
    for name, value in figures.items():
        assert _equal(float(rows[0][name]), value), name
    assert rows[1]["xconf/pass"] == 0
    # The service process W&B started for the writer's run is gone again.
    assert "wandb-core" not in [p.name() for p in psutil.Process().children(recursive=True)]
