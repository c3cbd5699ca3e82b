"""The xconf sweeper (`hydra/sweeper=xconf`): one-at-a-time or pairwise cases, never a product.

Heavy imports (torch, xconf's runner) are deferred to ``sweep`` so plugin discovery stays fast.
No ``from __future__ import annotations`` here: Hydra's plugin scan executes this module outside
``sys.modules``, where dataclasses cannot resolve string annotations.
"""

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from hydra.core.utils import JobReturn
from hydra.plugins.launcher import Launcher
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf

log = logging.getLogger(__name__)


@dataclass
class XconfSweeperConf:
    _target_: str = "hydra_plugins.xconf_sweeper.xconf_sweeper.XconfSweeper"
    # Jobs handed to the launcher at once; None launches every case in one batch.
    max_batch_size: Optional[int] = None  # noqa: UP045 (OmegaConf 2.3 needs typing.Optional)


ConfigStore.instance().store(
    group="hydra/sweeper", name="xconf", node=XconfSweeperConf, provider="xconf"
)


class XconfSweeper(Sweeper):
    def __init__(self, max_batch_size: int | None = None) -> None:
        super().__init__()
        self.max_batch_size = max_batch_size
        self.hydra_context: HydraContext | None = None
        self.config: DictConfig | None = None
        self.launcher: Launcher | None = None
        self.task_function: TaskFunction | None = None

    def setup(
        self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig
    ) -> None:
        from hydra.core.plugins import Plugins

        self.hydra_context = hydra_context
        self.config = config
        self.task_function = task_function
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config
        )

    def sweep(self, arguments: list[str]) -> Any:
        from hydra.core.override_parser.overrides_parser import OverridesParser

        from xconf.session import OutcomeReceiver
        from xconf.sweep_service import run_sweep

        if self.config is None or self.launcher is None or self.hydra_context is None:
            raise RuntimeError("XconfSweeper.sweep called before setup")
        # The task is xconf-run's: it gives the sweep its view and receives its outcome
        # (Hydra drops sweep()'s return value), so this plugin needs nothing of the CLI.
        front = getattr(self.task_function, "__self__", self.task_function)
        if not isinstance(front, OutcomeReceiver):
            raise RuntimeError("the xconf sweeper runs only xconf-run's task (xconf-run -m)")
        parser = OverridesParser.create(config_loader=self.hydra_context.config_loader)
        overrides = parser.parse_overrides(arguments)
        config = self.config
        loader = self.hydra_context.config_loader

        def save_multirun() -> None:
            sweep_dir = Path(config.hydra.sweep.dir)
            sweep_dir.mkdir(parents=True, exist_ok=True)
            OmegaConf.save(config, sweep_dir / "multirun.yaml")

        result = run_sweep(
            overrides=overrides,
            load_config=lambda shared: loader.load_sweep_config(config, list(shared)),
            launch=self._launch,
            max_batch_size=self.max_batch_size,
            save_multirun=save_multirun,
            view=front.sweep_view(),
        )
        front.receive(result.outcome)
        return result.returns

    def _launch(self, batch: list[list[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        """In-process and torchrun launchers size each job themselves. Submitit (Slurm, local)
        jobs are submitted in groups of equal world size, each sized against the node shape
        (launcher config, else ``sinfo``)."""
        if (
            self.launcher is None
            or self.config is None
            or self.hydra_context is None
            or self.task_function is None
        ):
            raise RuntimeError("XconfSweeper used before setup")
        # By its executor, not isinstance: Hydra's plugin scan loads the submitit plugin
        # module a second time, so its BaseSubmititLauncher is not the class one imports here
        # (isinstance was False, and every submitit job went out at 1 task).
        executor = getattr(self.launcher, "_EXECUTOR", None)
        if executor not in ("slurm", "local"):
            return self.launcher.launch(batch, initial_job_idx=initial_job_idx)
        from hydra.core.plugins import Plugins

        from xconf.launchers.submitit_resources import group_jobs_with_loader, node_shape

        declared = dict(getattr(self.launcher, "node_declared", {}))
        params: Any = getattr(self.launcher, "params", {})
        if executor == "local":
            import os

            # The local executor runs every task on this machine: its node is this machine.
            declared = {"node_cpus": os.cpu_count() or 1, "node_gpus": 0, "node_count": 1}
        node = node_shape(declared, params.get("partition"))
        cpus_per_task = params.get("cpus_per_task")  # the user's, never overwritten
        groups = group_jobs_with_loader(
            self.hydra_context.config_loader.load_sweep_config,
            self.config,
            batch,
            node,
            cpus_per_task,
        )
        returns: list[JobReturn | None] = [None] * len(batch)
        next_idx = initial_job_idx
        for group in groups:
            launcher = Plugins.instance().instantiate_launcher(
                hydra_context=self.hydra_context,
                task_function=self.task_function,
                config=group.apply_to(self.config),
            )
            results = launcher.launch([list(o) for o in group.job_overrides], next_idx)
            next_idx += len(results)
            for position, result in zip(group.job_indices, results, strict=True):
                returns[position] = result
        return [r for r in returns if r is not None]
