"""Config of ``hydra/launcher=torchrun``; registered in Hydra's ConfigStore at import."""

# No `from __future__ import annotations` here: Hydra's plugin scan executes this module
# without registering it in sys.modules, and dataclasses cannot resolve string annotations
# of a module missing from sys.modules.
from dataclasses import dataclass

from hydra.core.config_store import ConfigStore


@dataclass
class TorchrunLauncherConf:
    """Launcher settings. The world size is not here: it is derived from each job's config."""

    _target_: str = "hydra_plugins.xconf_torchrun_launcher.torchrun_launcher.TorchrunLauncher"
    # auto: nccl when CUDA is available, else gloo.
    backend: str = "auto"
    # Process group timeout: bounds a rank stuck in a collective (torch's default is 30 min).
    pg_timeout_s: float = 300.0
    # Watchdog over the whole launch of one job; on expiry the workers are killed and the
    # job returns FAILED.
    job_timeout_s: float = 1800.0
    # torch elastic leaves OMP_NUM_THREADS unset in workers; set per rank.
    omp_num_threads: int = 1
    start_method: str = "spawn"
    monitor_interval_s: float = 0.1
    # Grace period between SIGTERM and SIGKILL for surviving ranks after one fails.
    shutdown_timeout_s: int = 5


ConfigStore.instance().store(
    group="hydra/launcher", name="torchrun", node=TorchrunLauncherConf, provider="xconf"
)
