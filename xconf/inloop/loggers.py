"""Writers for the loggers RL users run: TensorBoard event files, MLflow, W&B.

Each takes the flat ``figures`` of a :class:`~xconf.inloop.api.BatchVerdict` and a step::

    from xconf.inloop.loggers import TensorBoardWriter
    writer = TensorBoardWriter("runs/xconf")
    writer.write(verdict.figures, step)
    writer.close()

Every writer is local: TensorBoard event files (``tensorboardX``), an MLflow file store
(``mlflow-skinny``, ``file:`` tracking URI), W&B in offline mode (``wandb``, files under
``dir``; ``wandb sync`` uploads them later). Their packages are optional: a missing one is a
coded :class:`LoggerUnavailable`, not an ImportError at import time. NaN (a figure that
was not finite) is written as NaN.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from xconf.errors import XconfError


class LoggerUnavailable(XconfError):
    """The logger's package is not installed."""


class FigureWriter(Protocol):
    def write(self, figures: Mapping[str, float], step: int) -> None: ...

    def close(self) -> None: ...


def _need(module: str, distribution: str) -> Any:
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise LoggerUnavailable(
            "inloop.logger_unavailable",
            f"{distribution} is not installed: pip install {distribution}",
            distribution,
        ) from exc


class TensorBoardWriter:
    """Scalars in a TensorBoard event file under ``logdir`` (tensorboardX)."""

    def __init__(self, logdir: str | Path) -> None:
        tbx = _need("tensorboardX", "tensorboardX")
        self._writer = tbx.SummaryWriter(logdir=str(logdir))

    def write(self, figures: Mapping[str, float], step: int) -> None:
        for name, value in figures.items():
            self._writer.add_scalar(name, float(value), global_step=int(step))
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class MlflowWriter:
    """Metrics of one MLflow run in a local file store (``file:<store>``), no server.

    MLflow 3 keeps its file store in maintenance mode behind ``MLFLOW_ALLOW_FILE_STORE``;
    a local directory is what this writer is for, so it opts in (unless already set).
    ``tracking_uri`` instead of ``store``: any other MLflow backend (``sqlite:///...``).
    """

    def __init__(
        self,
        store: str | Path | None = None,
        *,
        tracking_uri: str | None = None,
        experiment: str = "xconf",
        run_name: str | None = None,
    ) -> None:
        if (store is None) == (tracking_uri is None):
            raise XconfError(
                "inloop.mlflow_store", "give a store directory or a tracking_uri", "store"
            )
        tracking = _need("mlflow.tracking", "mlflow-skinny")
        self._entities = _need("mlflow.entities", "mlflow-skinny")
        uri = tracking_uri
        if store is not None:
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
            uri = Path(store).expanduser().resolve().as_uri()
        self._client = tracking.MlflowClient(tracking_uri=uri)
        found = self._client.get_experiment_by_name(experiment)
        experiment_id = (
            found.experiment_id if found is not None else self._client.create_experiment(experiment)
        )
        self.run_id: str = self._client.create_run(experiment_id, run_name=run_name).info.run_id

    def write(self, figures: Mapping[str, float], step: int) -> None:
        import time

        now = int(time.time() * 1000)
        metrics = [
            self._entities.Metric(name, float(value), now, int(step))
            for name, value in figures.items()
        ]
        self._client.log_batch(self.run_id, metrics=metrics)

    def close(self) -> None:
        self._client.set_terminated(self.run_id)


class WandbWriter:
    """A W&B run in offline mode: everything stays under ``dir`` (``wandb sync`` uploads it).

    ``run``: log into the training loop's own run instead (it is left open on close).
    A run this writer started is finished on close, and W&B's service process is ended
    when no other run is open.
    """

    def __init__(
        self,
        dir: str | Path | None = None,
        *,
        project: str = "xconf",
        name: str | None = None,
        run: Any = None,
    ) -> None:
        self._wandb = _need("wandb", "wandb")
        self._owned = run is None
        if run is None:
            if dir is None:
                raise XconfError("inloop.wandb_dir", "give a directory or a run", "dir")
            Path(dir).mkdir(parents=True, exist_ok=True)
            run = self._wandb.init(
                mode="offline",
                dir=str(dir),
                project=project,
                name=name,
                settings=self._wandb.Settings(console="off", x_disable_stats=True, silent=True),
            )
        self._run = run

    @property
    def run_dir(self) -> Path:
        return Path(self._run.dir).parent

    def write(self, figures: Mapping[str, float], step: int) -> None:
        self._run.log({k: float(v) for k, v in figures.items()}, step=int(step))

    def close(self) -> None:
        if not self._owned:
            return
        self._run.finish()
        if self._wandb.run is None:
            self._wandb.teardown()
