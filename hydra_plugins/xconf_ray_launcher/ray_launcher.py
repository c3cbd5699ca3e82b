"""The ``xconf_ray`` Hydra launcher: each case its own world on a Ray cluster.

Only light imports at module level: Hydra imports every plugin module during discovery, and
neither Ray nor torch may load then. The logic is :mod:`xconf.launchers.ray_launch`'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hydra.core.utils import JobReturn
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig

from hydra_plugins.xconf_ray_launcher.config import RayLauncherConf

__all__ = ["RayLauncherConf", "XconfRayLauncher"]


class XconfRayLauncher(Launcher):
    def __init__(self, **params: Any) -> None:
        from xconf.launchers.ray_cluster import RaySettings

        # Checked in launch(), after the plan: a bad setting is then xconf's coded exit 2.
        self.settings: Any = RaySettings(**params)
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
        from xconf.launchers.ray_launch import launch_on_ray

        if self.config is None or self.hydra_context is None or self.task_function is None:
            raise LaunchError(
                "launch.not_set_up", "launch() called before setup()", "hydra.launcher"
            )
        self.settings.validate()
        return launch_on_ray(
            self.settings,
            job_overrides,
            initial_job_idx,
            self.hydra_context,
            self.task_function,
            self.config,
        )
