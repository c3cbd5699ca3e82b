"""Submitit launchers whose dead jobs become FAILED JobReturns.

The stock launcher gathers results with ``[j.results()[0] for j in jobs]``, so one job that
died before writing its result raises out of ``launch()`` and every other job's return is
lost. These subclasses submit the same way and gather each job on its own.

Hydra lists every concrete launcher class it finds in a plugin module's namespace
(``--info plugins``), imported ones included: so the upstream classes are reached through
their module, and the shared launch is a function, not an internal base class.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, filter_overrides
from hydra_plugins.hydra_submitit_launcher import submitit_launcher as upstream
from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf
from omegaconf import OmegaConf

from hydra_plugins.xconf_submitit_launcher.config import XconfLocalQueueConf, XconfSlurmQueueConf

log = logging.getLogger(__name__)

__all__ = ["XconfLocalLauncher", "XconfLocalQueueConf", "XconfSlurmLauncher", "XconfSlurmQueueConf"]

# Executor-level (not per-job) settings of hydra-submitit-launcher.
_INIT_KEYS = frozenset({"submitit_folder", "max_num_timeout"})


def _executor(launcher: upstream.BaseSubmititLauncher) -> Any:
    import submitit

    kind = launcher._EXECUTOR
    init: dict[str, Any] = {"folder": launcher.params["submitit_folder"]}
    if "max_num_timeout" in launcher.params:
        init[f"{kind}_max_num_timeout"] = launcher.params["max_num_timeout"]
    executor = submitit.AutoExecutor(cluster=kind, **init)
    shared = set(OmegaConf.structured(BaseQueueConf).keys())
    executor.update_parameters(
        **{
            key if key in shared else f"{kind}_{key}": value
            for key, value in launcher.params.items()
            if key not in _INIT_KEYS
        }
    )
    return executor


def _gather(job: Any, overrides: Sequence[str]) -> JobReturn:
    from submitit.core.utils import UncompletedJobError

    from xconf.launchers.errors import LaunchError

    try:
        result: JobReturn = job.results()[0]
        return result
    except UncompletedJobError as exc:
        state = getattr(job, "state", "UNKNOWN")
        error = LaunchError(
            "launch.submitit.job_failed",
            f"job {job.job_id} ended {state} without a result: {str(exc).splitlines()[0]}",
            "hydra.launcher",
        )
        error.__cause__ = exc
        log.error("job %s (%s) failed: %s", job.job_id, " ".join(overrides), state)
        return JobReturn(overrides=list(overrides), status=JobStatus.FAILED, _return_value=error)


def _tolerant_launch(
    launcher: upstream.BaseSubmititLauncher,
    job_overrides: Sequence[Sequence[str]],
    initial_job_idx: int,
) -> Sequence[JobReturn]:
    from xconf.launchers.errors import LaunchError

    if launcher.config is None or not job_overrides:
        raise LaunchError("launch.not_set_up", "no config or no jobs", "hydra.launcher")
    executor = _executor(launcher)
    sweep_dir = Path(str(launcher.config.hydra.sweep.dir))
    sweep_dir.mkdir(parents=True, exist_ok=True)
    if "mode" in launcher.config.hydra.sweep:
        os.chmod(sweep_dir, mode=int(str(launcher.config.hydra.sweep.mode), 8))
    log.info("Submitit '%s' sweep output dir : %s", launcher._EXECUTOR, sweep_dir)
    params = []
    for offset, overrides in enumerate(job_overrides):
        idx = initial_job_idx + offset
        log.info("\t#%d : %s", idx, " ".join(filter_overrides(overrides)))
        params.append(
            (
                list(overrides),
                "hydra.sweep.dir",
                idx,
                f"job_id_for_{idx}",
                Singleton.get_state(),
            )
        )
    jobs = executor.map_array(launcher, *zip(*params, strict=True))
    return [_gather(job, o) for job, o in zip(jobs, job_overrides, strict=True)]


class XconfSlurmLauncher(upstream.SlurmLauncher):
    _EXECUTOR = "slurm"

    def launch(
        self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int
    ) -> Sequence[JobReturn]:
        return _tolerant_launch(self, job_overrides, initial_job_idx)


class XconfLocalLauncher(upstream.LocalLauncher):
    _EXECUTOR = "local"

    def launch(
        self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int
    ) -> Sequence[JobReturn]:
        return _tolerant_launch(self, job_overrides, initial_job_idx)
