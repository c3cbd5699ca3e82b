"""Run one Hydra job as a torch elastic world: parent-side composition, rank-side task call.

The parent (inside Hydra's ``run_job``, so the job directory, ``.hydra/`` record and
JobReturn stay single) derives the world size, resolves the job's config and starts the
ranks; each rank rebuilds the config, checks that every rank runs the same case and calls the
task. Rank 0's return value becomes the job's return value. What crosses to the ranks is JSON
(:class:`RankJob` and the task's description, :mod:`xconf.launchers.rank_call`).
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from xconf.launchers.errors import CaseDisagreementError, LaunchError
from xconf.launchers.rank_call import describe, rebuild
from xconf.launchers.topology import required_world_size
from xconf.launchers.world import (
    WorldSettings,
    config_digest,
    launch_world,
    verify_case_agreement,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RankJob:
    """Everything a rank needs, as plain data (children have no HydraConfig of their own)."""

    task_cfg: dict[str, Any]  # resolved in the parent
    struct: bool
    readonly: bool
    hydra_cfg: dict[str, Any] | None  # resolved hydra node (enums as names), for HydraConfig
    job_dir: str
    job_name: str
    world_size: int
    digest: str  # hex

    def identity(self) -> dict[str, Any]:
        """What every rank must agree on; hashed into the case digest."""
        return {"task_cfg": self.task_cfg, "job_dir": self.job_dir, "world": self.world_size}

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RankJob:
        return cls(**data)


def _resolved_hydra_node() -> dict[str, Any] | None:
    """A resolved plain copy of the job's Hydra config (``{"hydra": ...}``, enums by name),
    or None."""
    from hydra.core.hydra_config import HydraConfig

    current: Any = HydraConfig.instance().cfg  # typed HydraConf by Hydra; a DictConfig really
    if not isinstance(current, DictConfig):
        return None
    try:
        node = copy.deepcopy(current)
        # Hydra marks its node read-only; this is our copy, and resolving writes values in.
        OmegaConf.set_readonly(node, False)
        OmegaConf.set_readonly(node.hydra, False)  # set_config flags this node explicitly
        OmegaConf.resolve(node)
        plain = OmegaConf.to_container(node, resolve=True, enum_to_str=True)
    except Exception as exc:  # a hydra field that only resolves lazily; ranks go without
        log.warning("hydra config not resolvable for ranks (%s); ranks get no HydraConfig", exc)
        return None
    return {str(k): v for k, v in plain.items()} if isinstance(plain, dict) else None


def make_rank_job(task_cfg: DictConfig, world_size: int) -> RankJob:
    from hydra.core.hydra_config import HydraConfig

    container = OmegaConf.to_container(task_cfg, resolve=True, throw_on_missing=False)
    if not isinstance(container, dict):
        raise LaunchError("launch.config.not_a_mapping", "job config is not a mapping", "")
    hydra_node = _resolved_hydra_node()
    if HydraConfig.initialized():
        job_dir = str(HydraConfig.get().runtime.output_dir)
        job_name = str(HydraConfig.get().job.name)
    else:
        job_dir, job_name = str(Path.cwd()), "job"
    job = RankJob(
        task_cfg={str(k): v for k, v in container.items()},
        struct=bool(OmegaConf.is_struct(task_cfg)),
        readonly=bool(OmegaConf.is_readonly(task_cfg)),
        hydra_cfg=hydra_node,
        job_dir=job_dir,
        job_name=job_name,
        world_size=world_size,
        digest="",
    )
    return dataclasses.replace(job, digest=config_digest(job.identity()).hex())


def _rank_logging(job: RankJob, rank: int) -> None:
    """Fresh handlers per rank: spawned children inherit none, so their logs would vanish."""
    fmt = logging.Formatter(f"[%(asctime)s][rank{rank}][%(name)s][%(levelname)s] - %(message)s")
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    file_handler = logging.FileHandler(Path(job.job_dir) / f"{job.job_name}_rank{rank}.log")
    stream_handler = logging.StreamHandler(sys.stderr)
    for handler in (file_handler, stream_handler):
        handler.setFormatter(fmt)
        root.addHandler(handler)
    root.setLevel(logging.INFO)


def _install_hydra_config(job: RankJob) -> None:
    if job.hydra_cfg is None:
        return
    from hydra.conf import HydraConf
    from hydra.core.hydra_config import HydraConfig

    try:
        # Typed again (HydraConf): enum fields such as ``hydra.mode`` come back as enums; the
        # node also holds keys outside the schema (``env``), as Hydra's own node does.
        schema = OmegaConf.structured(HydraConf)
        OmegaConf.set_struct(schema, False)
        typed = OmegaConf.merge(schema, job.hydra_cfg["hydra"])
        HydraConfig.instance().set_config(OmegaConf.create({"hydra": typed}))
    except Exception as exc:  # best effort: the task config itself is already resolved
        log.warning("could not install HydraConfig in rank: %s", exc)


def run_task_in_rank(task: dict[str, Any], job: dict[str, Any]) -> Any:
    """Rank side (the target every rank imports): rebuild the config and the task function
    from JSON, agree on the case, call the task."""
    return _run_task(rebuild(task), RankJob.from_dict(job))


def _run_task(task_function: Callable[[DictConfig], Any], job: RankJob) -> Any:
    import torch.distributed as dist

    rank = dist.get_rank()
    Path(job.job_dir).mkdir(parents=True, exist_ok=True)
    _rank_logging(job, rank)
    if config_digest(job.identity()).hex() != job.digest:
        raise CaseDisagreementError(
            "launch.case_corrupted", "rank's case differs from the launcher's", "hydra.launcher"
        )
    verify_case_agreement(bytes.fromhex(job.digest))
    _install_hydra_config(job)
    cfg = OmegaConf.create(job.task_cfg)
    OmegaConf.set_struct(cfg, job.struct)
    OmegaConf.set_readonly(cfg, job.readonly)
    logging.getLogger(__name__).info("rank %d/%d running case", rank, job.world_size)
    return task_function(cfg)


class RankedTask:
    """Task function handed to Hydra's ``run_job``: runs the real task in a launched world."""

    def __init__(self, task_function: Callable[[DictConfig], Any], settings: WorldSettings):
        self._task_function = task_function
        self._settings = settings

    def __call__(self, task_cfg: DictConfig) -> Any:
        world_size = required_world_size(task_cfg)
        job = make_rank_job(task_cfg, world_size)
        log.info("launching %d rank(s) for %s (own world, not shared)", world_size, job.job_dir)
        value, _record = launch_world(
            world_size,
            f"{__name__}:run_task_in_rank",
            {"task": describe(self._task_function), "job": job.to_dict()},
            self._settings,
            Path(job.job_dir),
        )
        return value
