"""The in-loop API and its loggers under hostile input (fourth campaign): nothing but an
`InloopError` ever leaves the API, a logger that cannot write degrades to one warning and
the loop goes on, ranks share an MLflow store, the loop's own W&B run is left alone, a
strided step gives the sealed step's figures, and a step that cannot be sealed writes
nothing. Before: tracebacks of torch's own errors, a crashed loop, "Experiment 'xconf'
already exists", the user's run finished by the writer, different figures, a dump left."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import xconf
from tests.conftest import REPO, snapshot
from xconf.inloop import InloopError, StepJudge, figures

G = torch.Generator().manual_seed(11)
ROLLOUT = -torch.rand((4, 6), generator=G) - 0.1
TRAINING = ROLLOUT + 2e-6
MASK = torch.ones((4, 6))


def _judge(rollout: Any = ROLLOUT, training: Any = TRAINING, mask: Any = MASK, **kw: Any) -> Any:
    options = {"rollout_dtype": "float32", "training_dtype": "float32", **kw}
    return xconf.judge_batch(rollout, training, mask, **options)


ODD: dict[str, Callable[[], Any]] = {
    "meta": lambda: _judge(rollout=torch.empty((4, 6), device="meta")),
    "sparse": lambda: _judge(training=TRAINING.to_sparse()),
    "sparse_mask": lambda: _judge(mask=MASK.to_sparse_csr()),
    "nested": lambda: _judge(rollout=torch.nested.nested_tensor([ROLLOUT[0], ROLLOUT[1, :3]])),
    "unknown_dtype": lambda: _judge(rollout_dtype="float8"),
    "bad_correction": lambda: _judge(correction="not a Correction"),
    "string": lambda: _judge(rollout="-1.0"),
}


@pytest.mark.parametrize("name", sorted(ODD))
def test_only_inloop_errors_leave_the_api(name: str) -> None:
    with pytest.raises(Exception) as raised:
        ODD[name]()
    assert type(raised.value) is InloopError, (name, type(raised.value), raised.value)
    assert raised.value.code.startswith(("inloop.", "judge.", "rollout_correction.")), raised.value


def test_a_strided_step_gives_the_sealed_steps_figures(tmp_path: Path) -> None:
    g = torch.Generator().manual_seed(64)
    rollout = (-torch.rand((64, 8), generator=g) * 3).t()  # [8, 64], a transposed view
    training = rollout + torch.randn((8, 64), generator=g) * 1e-4
    mask = torch.ones((64, 8)).t()
    verdict = StepJudge(tmp_path, run="s", every=1)(
        1, rollout, training, mask, rollout_dtype="float32", training_dtype="float32"
    )
    assert verdict.dump is not None
    (attempt,) = (Path(verdict.dump) / "cases" / "step-00000001").iterdir()
    sealed = figures(json.loads((attempt / "comparison.json").read_text()))
    for name, value in sealed.items():
        assert value == verdict.figures[name] or (
            math.isnan(value) and math.isnan(verdict.figures[name])
        ), name


def test_a_step_that_cannot_be_sealed_writes_nothing(tmp_path: Path) -> None:
    """A failing step whose input_ids do not end with its responses: refused before a byte."""
    responses = torch.arange(24).reshape(4, 6)
    input_ids = torch.cat([torch.zeros((4, 3), dtype=torch.int64), responses + 1], dim=1)
    judge = StepJudge(tmp_path / "root", run="r", every=0, on_failure=True)
    with pytest.raises(InloopError) as raised:
        judge(5, ROLLOUT, ROLLOUT + 1e-2, MASK, rollout_dtype="float32",
              training_dtype="float32", responses=responses, input_ids=input_ids)  # fmt: skip
    assert raised.value.code == "judge.inconsistent_ids"
    assert snapshot(tmp_path) == {} and not (tmp_path / "root").exists()


def _file(tmp_path: Path) -> Path:
    path = tmp_path / "not-a-dir"
    path.write_text("a file where the log directory should be")
    return path


def _writers(tmp_path: Path) -> dict[str, Callable[[], Any]]:
    from xconf.inloop.loggers import MlflowWriter, TensorBoardWriter, WandbWriter

    return {
        "tensorboard": lambda: TensorBoardWriter(_file(tmp_path)),
        "mlflow": lambda: MlflowWriter(_file(tmp_path)),
        "wandb": lambda: WandbWriter(_file(tmp_path) / "wandb"),
    }


@pytest.mark.parametrize("kind", ["tensorboard", "mlflow", "wandb"])
def test_a_log_directory_that_is_a_file_is_a_warning(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from xconf.inloop.loggers import LoggerWarning

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "config"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        writer = _writers(tmp_path)[kind]()
        writer.write(_judge().figures, 1)  # the loop goes on
        writer.close()
    logged = [w for w in caught if issubclass(w.category, LoggerWarning)]
    assert len(logged) == 1 and writer.failed, [str(w.message) for w in caught]


def test_a_full_disk_under_tensorboard_keeps_the_loop_alive(tmp_path: Path) -> None:
    """The event file may grow to 200 bytes (RLIMIT_FSIZE, SIGXFSZ ignored: EFBIG), in a
    child process so the limit is its own. Nothing is printed at exit either (tensorboardX's
    writer thread and exit hook printed tracebacks after a full disk)."""
    script = (
        "import resource, signal, warnings\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "from xconf.inloop.loggers import TensorBoardWriter, LoggerWarning\n"
        f"w = TensorBoardWriter({str(tmp_path / 'tb')!r})\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (200, 200))\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    for step in range(50):\n"
        "        w.write({f'xconf/f{i}': float(i) for i in range(40)}, step)\n"
        "    w.close()\n"
        "assert [c for c in caught if issubclass(c.category, LoggerWarning)], caught\n"
        "print('loop alive')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
        env={"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert done.returncode == 0 and "loop alive" in done.stdout, done.stderr[-3000:]
    assert "Traceback" not in done.stderr and "Error" not in done.stderr, done.stderr[-3000:]


@pytest.mark.slow
def test_two_ranks_open_one_mlflow_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The race staged exactly: this rank looks the experiment up, another process creates it
    (and logs a run into it) before this rank's create."""
    from mlflow.tracking import MlflowClient

    from xconf.inloop.loggers import MlflowWriter

    store = tmp_path / "mlruns"
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    original = MlflowClient.get_experiment_by_name
    raced = {"done": False}

    def lookup(self: Any, name: str) -> Any:
        if not raced["done"]:  # nothing yet; meanwhile the other rank creates it
            raced["done"] = True
            other = MlflowClient(tracking_uri=store.resolve().as_uri())
            other.create_run(other.create_experiment(name), run_name="rank0")
            return None
        return original(self, name)

    monkeypatch.setattr(MlflowClient, "get_experiment_by_name", lookup)
    with warnings.catch_warnings():
        warnings.simplefilter("error", category=UserWarning)  # no degraded writer
        rank1 = MlflowWriter(store, run_name="rank1")
        rank1.write({"xconf/pass": 1.0}, 3)
        rank1.close()
    monkeypatch.setattr(MlflowClient, "get_experiment_by_name", original)
    client = MlflowClient(tracking_uri=store.resolve().as_uri())
    experiments = [e for e in client.search_experiments() if e.name == "xconf"]
    assert len(experiments) == 1
    runs = client.search_runs([experiments[0].experiment_id])
    assert sorted(r.info.run_name for r in runs) == ["rank0", "rank1"]


@pytest.mark.slow
def test_the_loops_own_wandb_run_is_left_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import wandb

    from xconf.inloop.loggers import WandbWriter

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "cache"))
    settings = wandb.Settings(console="off", x_disable_stats=True, silent=True)
    users = wandb.init(
        mode="offline", dir=str(tmp_path / "user"), project="grpo", settings=settings
    )
    try:
        writer = WandbWriter(tmp_path / "xconf", name="xconf")
        assert writer._run is not users  # its own run, not the loop's handed back
        writer.write({"xconf/pass": 1.0}, 1)
        writer.close()
        users.log({"loss": 0.5}, step=2)  # still open: the writer did not finish it
        assert not users._is_finished
    finally:
        users.finish()
        wandb.teardown()
