"""Writers for the loggers RL users run: TensorBoard event files, MLflow, W&B.

Each takes the flat ``figures`` of a :class:`~xconf.inloop.api.BatchVerdict` and a step::

    from xconf.inloop.loggers import TensorBoardWriter
    writer = TensorBoardWriter("runs/xconf")
    writer.write(verdict.figures, step)
    writer.close()

Every writer is local: TensorBoard event files (``tensorboardX``), an MLflow file store
(``mlflow-skinny``, ``file:`` tracking URI), W&B in offline mode (``wandb``, files under
``dir``; ``wandb sync`` uploads them later). Their packages are optional: a missing one is a
coded :class:`LoggerUnavailable` (an :class:`~xconf.inloop.api.InloopError`) when the writer
is made, not an ImportError at import time. NaN (a figure that was not finite) is written
as NaN.

A logger never stops the training loop: the first failure to open, write or close (its
directory is a file, the disk is full, the store refuses) is one :class:`LoggerWarning`
naming the writer and why, and the writer then writes nothing (``writer.failed`` says why).
Ranks may share one MLflow store: its experiment is created under a file lock, and a rank
that finds it created meanwhile uses it. The W&B writer never touches a run it did not
start: an active run of the training loop is left alone (its own run is a new one), and
``WandbWriter(run=...)`` logs into the given run and leaves it open.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, Protocol, TypeVar

from xconf.inloop.api import InloopError

T = TypeVar("T")


class LoggerUnavailable(InloopError):
    """The logger's package is not installed."""


class LoggerWarning(UserWarning):
    """A logger that could not write: the training loop goes on without it."""


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


class _Degrading:
    """The failure rule every writer shares: one warning, then nothing more is written."""

    failed: str | None = None

    def _attempt(self, what: str, action: Callable[[], T]) -> T | None:
        if self.failed is not None:
            return None
        try:
            return action()
        except Exception as exc:  # whatever the logger raised: the loop must go on
            self.failed = f"{type(self).__name__} could not {what}: {type(exc).__name__}: {exc}"
            warnings.warn(f"{self.failed}; it writes nothing more", LoggerWarning, stacklevel=3)
            return None


class TensorBoardWriter(_Degrading):
    """Scalars in a TensorBoard event file under ``logdir`` (tensorboardX's format).

    The event file is written here, synchronously, through an unbuffered file: each write
    reaches the file or fails at once (a full disk is this writer's one warning).
    tensorboardX's own ``SummaryWriter`` keeps a writer thread and an exit hook that, after
    a full disk, print tracebacks when the interpreter ends."""

    def __init__(self, logdir: str | Path) -> None:
        self._tbx = _need("tensorboardX", "tensorboardX")
        self._file: Any = None
        self._attempt("open", lambda: self._open(Path(logdir)))

    def _open(self, logdir: Path) -> None:
        import socket
        import time

        from tensorboardX.proto import event_pb2

        logdir.mkdir(parents=True, exist_ok=True)
        # the pid too: two ranks opening one directory in the same second get two files
        name = f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}.{os.getpid()}"
        self._file = open(logdir / name, "xb", buffering=0)  # noqa: SIM115 (closed by close)
        self._record(event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2"))

    def _record(self, event: Any) -> None:
        """One TFRecord (length, its masked CRC-32C, the event, its masked CRC-32C)."""
        import struct

        from tensorboardX.record_writer import masked_crc32c

        data = event.SerializeToString()
        header = struct.pack("<Q", len(data))
        view = memoryview(
            header + struct.pack("<I", masked_crc32c(header)) + data
            + struct.pack("<I", masked_crc32c(data))
        )  # fmt: skip
        while view:  # a short write (a full disk) is not a success
            view = view[self._file.write(view) :]

    def write(self, figures: Mapping[str, float], step: int) -> None:
        self._attempt("write", lambda: self._write(figures, step))

    def _write(self, figures: Mapping[str, float], step: int) -> None:
        import time

        from tensorboardX.proto import event_pb2

        now = time.time()
        for name, value in figures.items():
            summary = self._tbx.summary.scalar(name, float(value))
            self._record(event_pb2.Event(wall_time=now, step=int(step), summary=summary))

    def close(self) -> None:
        file, self._file = self._file, None
        if file is None:
            return
        if self.failed is None:  # unbuffered: nothing is left to flush
            self._attempt("close", file.close)
        else:  # already warned: the descriptor is released all the same
            with suppress(OSError):
                file.close()


@contextmanager
def _store_lock(store: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``<store>/.xconf.lock``: one rank at a time creates the
    experiment (the file store checks a name, then creates it: two ranks would race)."""
    import fcntl

    store.mkdir(parents=True, exist_ok=True)
    fd = os.open(store / ".xconf.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


class MlflowWriter(_Degrading):
    """Metrics of one MLflow run in a local file store (``file:<store>``), no server.

    MLflow 3 keeps its file store in maintenance mode behind ``MLFLOW_ALLOW_FILE_STORE``;
    a local directory is what this writer is for, so it opts in (unless already set).
    ``tracking_uri`` instead of ``store``: any other MLflow backend (``sqlite:///...``).
    Each writer (each rank) is its own run of the one experiment.
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
            raise InloopError(
                "inloop.mlflow_store", "give a store directory or a tracking_uri", "store"
            )
        tracking = _need("mlflow.tracking", "mlflow-skinny")
        self._entities = _need("mlflow.entities", "mlflow-skinny")
        self.run_id: str | None = None
        folder = Path(store).expanduser().resolve() if store is not None else None
        self.run_id = self._attempt(
            "open", lambda: self._open(tracking, folder, tracking_uri, experiment, run_name)
        )

    def _open(
        self,
        tracking: Any,
        folder: Path | None,
        uri: str | None,
        experiment: str,
        run_name: str | None,
    ) -> str:
        if folder is not None:
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
            uri = folder.as_uri()
        self._client = tracking.MlflowClient(tracking_uri=uri)
        if folder is not None:
            with _store_lock(folder):
                experiment_id = self._experiment(experiment)
        else:
            experiment_id = self._experiment(experiment)
        return str(self._client.create_run(experiment_id, run_name=run_name).info.run_id)

    def _experiment(self, name: str) -> str:
        """The experiment's id; created when absent (by this rank, or by another meanwhile)."""
        found = self._client.get_experiment_by_name(name)
        if found is not None:
            return str(found.experiment_id)
        try:
            return str(self._client.create_experiment(name))
        except Exception:  # "already exists": another rank (or process) created it first
            found = self._client.get_experiment_by_name(name)
            if found is None:
                raise
            return str(found.experiment_id)

    def write(self, figures: Mapping[str, float], step: int) -> None:
        self._attempt("write", lambda: self._write(figures, step))

    def _write(self, figures: Mapping[str, float], step: int) -> None:
        import time

        now = int(time.time() * 1000)
        metrics = [
            self._entities.Metric(name, float(value), now, int(step))
            for name, value in figures.items()
        ]
        self._client.log_batch(self.run_id, metrics=metrics)

    def close(self) -> None:
        self._attempt("close", lambda: self._client.set_terminated(self.run_id))


class WandbWriter(_Degrading):
    """A W&B run in offline mode: everything stays under ``dir`` (``wandb sync`` uploads it).

    ``run``: log into the training loop's own run instead (it is left open on close).
    Without it the writer starts a run of its own, also when the loop already has an active
    run (that one is left alone: never handed back, never finished); its own run is finished
    on close, and W&B's service process is ended when no other run is open.
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
        if run is None and dir is None:
            raise InloopError("inloop.wandb_dir", "give a directory or a run", "dir")
        # an active run of the loop's own, at open: W&B's service stays up for it at close
        self._others = self._wandb.run is not None
        if run is None:
            run = self._attempt("open", lambda: self._open(dir, project, name))
        self._run = run

    def _open(self, dir: str | Path | None, project: str, name: str | None) -> Any:
        Path(str(dir)).mkdir(parents=True, exist_ok=True)
        return self._wandb.init(
            mode="offline",
            dir=str(dir),
            project=project,
            name=name,
            reinit="create_new",  # a run of the loop's own is never handed back to us
            settings=self._wandb.Settings(console="off", x_disable_stats=True, silent=True),
        )

    @property
    def run_dir(self) -> Path:
        return Path(self._run.dir).parent

    def write(self, figures: Mapping[str, float], step: int) -> None:
        self._attempt(
            "write",
            lambda: self._run.log({k: float(v) for k, v in figures.items()}, step=int(step)),
        )

    def close(self) -> None:
        if not self._owned:
            return
        self._attempt("close", self._close)

    def _close(self) -> None:
        self._run.finish()
        if not self._others and self._wandb.run is None:
            self._wandb.teardown()
