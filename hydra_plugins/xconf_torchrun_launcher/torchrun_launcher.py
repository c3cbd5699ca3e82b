"""The ``torchrun`` Hydra launcher: one torch elastic world per job, in the parent's job dir.

Only light imports at module level: Hydra imports every plugin module during discovery.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra.core.utils import JobReturn, configure_log, filter_overrides, run_job, setup_globals
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, open_dict

from hydra_plugins.xconf_torchrun_launcher.config import TorchrunLauncherConf

log = logging.getLogger(__name__)

__all__ = ["TorchrunLauncher", "TorchrunLauncherConf"]


class TorchrunLauncher(Launcher):
    def __init__(self, **params: Any) -> None:
        # xconf imports are deferred: discovery imports this module, and the xconf package
        # root may pull in the whole core.
        from xconf.launchers.world import WorldSettings

        self.settings: Any = WorldSettings(**params)
        self.settings.validate()
        self.config: DictConfig | None = None
        self.task_function: TaskFunction | None = None
        self.hydra_context: HydraContext | None = None

    def setup(
        self,
        *,
        hydra_context: HydraContext,
        task_function: TaskFunction,
        config: DictConfig,
    ) -> None:
        self.config = config
        self.hydra_context = hydra_context
        self.task_function = task_function

    def launch(
        self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int
    ) -> Sequence[JobReturn]:
        from xconf.launchers.errors import LaunchError
        from xconf.launchers.torchrun import RankedTask

        if self.config is None or self.hydra_context is None or self.task_function is None:
            raise LaunchError(
                "launch.not_set_up", "launch() called before setup()", "hydra.launcher"
            )
        setup_globals()
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        Path(str(self.config.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True)
        log.info("Launching %d jobs with torchrun (torch elastic)", len(job_overrides))
        task = RankedTask(self.task_function, self.settings)
        runs: list[JobReturn] = []
        for offset, overrides in enumerate(job_overrides):
            idx = initial_job_idx + offset
            log.info("\t#%d : %s", idx, " ".join(filter_overrides(overrides)))
            sweep_config = self.hydra_context.config_loader.load_sweep_config(
                self.config, list(overrides)
            )
            with open_dict(sweep_config):
                sweep_config.hydra.job.id = f"torchrun_{idx}"
                sweep_config.hydra.job.num = idx
            # run_job writes the one job dir and .hydra/ record and turns a raised launch
            # error into a FAILED JobReturn instead of crashing the sweep.
            runs.append(
                run_job(
                    hydra_context=self.hydra_context,
                    task_function=task,
                    config=sweep_config,
                    job_dir_key="hydra.sweep.dir",
                    job_subdir_key="hydra.sweep.subdir",
                )
            )
            configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        return runs
