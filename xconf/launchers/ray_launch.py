"""``hydra/launcher=xconf_ray``: every case of a batch as its own world on a Ray cluster.

Before anything is submitted the launcher connects (a coded error naming an address nobody
answers at), reads the node shape (declared, else asked from the cluster) and sizes every
case's world against it as the Slurm launcher does: a case that cannot fit refuses the whole
batch. Then, for each case in turn, inside Hydra's own ``run_job`` (one job directory, one
``.hydra/`` record, one JobReturn per case) it resolves the case as the torchrun launcher
does (:func:`xconf.launchers.torchrun.make_rank_job`) and creates the case's placement group,
one bundle per rank. Ray places the groups as the cluster frees room, so cases run
concurrently up to what it holds. A placed group gets one rank actor per bundle;
rank 0 names the world's address, every rank joins it and runs the case; rank 0's answer
becomes the JobReturn's value.

A case that fails (:mod:`xconf.launchers.ray_cases`) is a FAILED JobReturn with the reason;
the other cases go on. A stop signal (:class:`xconf.interrupts.Interrupted`) kills every actor
and removes every placement group this launch made before it goes up.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from hydra.core.utils import JobReturn, configure_log, run_job, setup_globals
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, open_dict

from xconf.interrupts import Interrupted, deferred_stop
from xconf.launchers.errors import TopologyError
from xconf.launchers.rank_call import describe
from xconf.launchers.ray_cases import RayLaunch
from xconf.launchers.ray_cluster import Placement, RaySettings, cluster_node_shape, connect
from xconf.launchers.submitit_resources import ResourceGroup, group_jobs
from xconf.launchers.topology import required_world_size
from xconf.launchers.torchrun import make_rank_job
from xconf.launchers.world import rank_job_text

log = logging.getLogger(__name__)

RANK_TARGET = "xconf.launchers.torchrun:run_task_in_rank"  # the torchrun ranks' own target


def placement_of(group: ResourceGroup) -> Placement:
    """A world's bundles from the Slurm launcher's sizing of it: one bundle per rank (its
    ``cpus_per_task``, one GPU on GPU nodes); all on one node when one node holds it."""
    bundle: dict[str, float] = {"CPU": float(group.cpus_per_task)}
    if group.gpus_per_node:
        bundle["GPU"] = 1.0
    strategy = "STRICT_PACK" if group.nodes == 1 else "PACK"
    return Placement(tuple(dict(bundle) for _ in range(group.world_size)), strategy, group.nodes)


def plan_placements(
    job_overrides: Sequence[Sequence[str]],
    configs: Sequence[DictConfig | Mapping[str, Any]],
    settings: RaySettings,
) -> list[Placement]:
    """Each job's placement, in job order; raises before anything is submitted when a world
    cannot fit the cluster's nodes."""
    node = cluster_node_shape(settings)
    try:
        groups = group_jobs(job_overrides, configs, node, settings.cpus_per_task)
    except TopologyError as exc:
        if not exc.code.startswith("launch.slurm."):
            raise
        raise TopologyError(
            exc.code.replace("launch.slurm.", "launch.ray."),
            f"{exc.message.replace('partition', 'Ray cluster')} (node shape: {node})",
            "hydra.launcher.cpus_per_task"
            if "cpus_per_task" in (exc.path or "")
            else "hydra.launcher",
        ) from None
    placements: list[Placement | None] = [None] * len(job_overrides)
    for group in groups:
        for index in group.job_indices:
            placements[index] = placement_of(group)
    return [p for p in placements if p is not None]


class _Submit:
    """The task ``run_job`` calls: resolves the case and submits its placement group."""

    def __init__(
        self, launch: RayLaunch, task_function: TaskFunction, index: int, placement: Placement
    ):
        self._launch = launch
        self._task = task_function
        self._index = index
        self._placement = placement

    def __call__(self, task_cfg: DictConfig) -> Any:
        world_size = required_world_size(task_cfg)
        job = make_rank_job(task_cfg, world_size)
        text = rank_job_text(RANK_TARGET, {"task": describe(self._task), "job": job.to_dict()})
        self._launch.submit(self._index, Path(job.job_dir), world_size, self._placement, text)
        return None  # replaced by rank 0's answer once the case ends


def launch_on_ray(
    settings: RaySettings,
    job_overrides: Sequence[Sequence[str]],
    initial_job_idx: int,
    hydra_context: HydraContext,
    task_function: TaskFunction,
    config: DictConfig,
) -> list[JobReturn]:
    """Run the batch on the cluster; a JobReturn per job, in job order."""
    setup_globals()
    configure_log(config.hydra.hydra_logging, config.hydra.verbose)
    Path(str(config.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True)
    launch = RayLaunch(settings)
    # Ray's native calls cannot take an exception from a signal handler: a stop signal is
    # noted and raised between them (each wait is bounded by POLL_S).
    with deferred_stop() as check:
        try:
            return _launch(
                launch, check, job_overrides, initial_job_idx, hydra_context, task_function, config
            )
        except BaseException as exc:
            # Ctrl-C / SIGTERM (Interrupted), or anything else: no rank of this launch runs on.
            launch.cancel(stopped=isinstance(exc, Interrupted))
            raise


def _launch(
    launch: RayLaunch,
    check: Callable[[], None],
    job_overrides: Sequence[Sequence[str]],
    initial_job_idx: int,
    hydra_context: HydraContext,
    task_function: TaskFunction,
    config: DictConfig,
) -> list[JobReturn]:
    connect(launch.settings)
    check()
    sweep_configs = []
    for offset, overrides in enumerate(job_overrides):
        sweep_config = hydra_context.config_loader.load_sweep_config(config, list(overrides))
        with open_dict(sweep_config):
            sweep_config.hydra.job.id = f"ray_{initial_job_idx + offset}"
            sweep_config.hydra.job.num = initial_job_idx + offset
        sweep_configs.append(sweep_config)
    placements = plan_placements(job_overrides, sweep_configs, launch.settings)
    check()
    log.info("Launching %d jobs on the Ray cluster", len(job_overrides))
    runs: list[JobReturn] = []
    for offset, (sweep_config, placement) in enumerate(zip(sweep_configs, placements, strict=True)):
        submit: Callable[[DictConfig], Any] = _Submit(launch, task_function, offset, placement)
        ret = run_job(
            hydra_context=hydra_context,
            task_function=submit,
            config=sweep_config,
            job_dir_key="hydra.sweep.dir",
            job_subdir_key="hydra.sweep.subdir",
        )
        configure_log(config.hydra.hydra_logging, config.hydra.verbose)
        runs.append(ret)
        if offset in launch.cases:  # submitted; a job that failed to submit has no case
            launch.cases[offset].ret = ret
        check()
    launch.wait_all(check)
    return runs
