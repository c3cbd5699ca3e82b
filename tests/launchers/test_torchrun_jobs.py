"""hydra/launcher=torchrun on jobs that need 1 and 2 ranks, and on a job whose rank dies."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import pytest
from hydra import compose, initialize_config_dir
from hydra._internal.callbacks import Callbacks
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.core.plugins import Plugins
from hydra.core.utils import JobStatus
from hydra.types import HydraContext
from omegaconf import DictConfig

from xconf.launchers.errors import RankFailedError

CONF = Path(__file__).parent / "apps" / "conf"


def _task(cfg: DictConfig) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    if cfg.fail and rank == world - 1:
        os._exit(1)  # dies before the collective: the other rank must not hang
    total = torch.tensor([float(cfg.value)])
    dist.all_reduce(total)
    logging.getLogger("xconf.test").info("rank %d of %d summed %s", rank, world, total.item())
    return {"world": world, "sum": total.item(), "out": cfg.out}


def _launch(tmp_path: Path, jobs: list[list[str]]) -> list[Any]:
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        cfg = compose(
            config_name="torchrun_app",
            overrides=[
                "hydra/launcher=torchrun",
                f"hydra.sweep.dir={tmp_path}",
                "hydra.launcher.job_timeout_s=120",
                "hydra.launcher.pg_timeout_s=30",
            ],
            return_hydra_config=True,
        )
        HydraConfig.instance().set_config(cfg)
        context = HydraContext(
            config_loader=GlobalHydra.instance().config_loader(), callbacks=Callbacks(cfg)
        )
        launcher = Plugins.instance().instantiate_launcher(
            hydra_context=context, task_function=_task, config=cfg
        )
        return list(launcher.launch(jobs, initial_job_idx=0))


@pytest.mark.usefixtures("hydra_restore_singletons")
def test_one_and_two_rank_jobs(tmp_path: Path) -> None:
    rets = _launch(
        tmp_path,
        [
            ["rollout.tensor_parallel_size=1", "value=2"],
            ["rollout.tensor_parallel_size=2", "value=3"],
        ],
    )
    assert [r.status for r in rets] == [JobStatus.COMPLETED] * 2
    for num, (ret, world, total) in enumerate(zip(rets, (1, 2), (2.0, 6.0), strict=True)):
        job_dir = tmp_path / str(num)
        assert ret.return_value == {"world": world, "sum": total, "out": str(job_dir)}
        # One job directory, one .hydra record, one log per rank.
        assert (job_dir / ".hydra" / "config.yaml").is_file()
        assert sorted(p.name for p in job_dir.glob("*_rank*.log")) == [
            f"{ret.task_name}_rank{r}.log" for r in range(world)
        ]
        assert "summed" in (job_dir / f"{ret.task_name}_rank{world - 1}.log").read_text()
        record = json.loads((job_dir / "launch.json").read_text())
        assert record["world_size"] == world and record["world_shared"] is False


@pytest.mark.usefixtures("hydra_restore_singletons")
def test_dead_rank_is_a_failed_job_not_a_crashed_sweep(tmp_path: Path) -> None:
    rets = _launch(tmp_path, [["rollout.tensor_parallel_size=2", "fail=true"], ["value=5"]])
    assert [r.status for r in rets] == [JobStatus.FAILED, JobStatus.COMPLETED]
    assert isinstance(rets[0]._return_value, RankFailedError)
    assert rets[0]._return_value.code == "launch.rank_failed"
    assert rets[1].return_value["sum"] == 5.0
