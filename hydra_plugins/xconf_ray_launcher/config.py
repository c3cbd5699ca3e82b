"""Config of ``hydra/launcher=xconf_ray``; registered in Hydra's ConfigStore at import."""

# No `from __future__ import annotations` here: Hydra's plugin scan executes this module
# without registering it in sys.modules, and dataclasses cannot resolve string annotations
# of a module missing from sys.modules.
from dataclasses import dataclass
from typing import Optional

from hydra.core.config_store import ConfigStore

from hydra_plugins.xconf_submitit_launcher.config import NodeShapeConf


@dataclass
class RayLauncherConf(NodeShapeConf):
    """Launcher settings. No world size: it is derived from each job's config. The node shape
    (``node_cpus``, ``node_gpus``, ``node_count``, ``max_tasks_per_node``) is the Slurm
    launcher's; what is left unset is asked from the cluster."""

    _target_: str = "hydra_plugins.xconf_ray_launcher.ray_launcher.XconfRayLauncher"
    # auto: RAY_ADDRESS, else the cluster last started on this machine; or the GCS host:port.
    # local: start Ray's own single-node instance for this run (nothing else ever starts one).
    address: str = "auto"
    # An address nobody answers at fails within this, naming it.
    connect_timeout_s: float = 15.0
    # CPUs of each rank's bundle; default: the node's CPUs split between the ranks it holds.
    cpus_per_task: Optional[int] = None  # noqa: UP045 (OmegaConf 2.3 needs typing.Optional)
    # The torchrun launcher's rank settings: auto is nccl where a rank has a GPU, else gloo.
    backend: str = "auto"
    pg_timeout_s: float = 300.0
    # Bounds one case from the moment its ranks start; on expiry its actors are killed.
    job_timeout_s: float = 1800.0
    omp_num_threads: int = 1


ConfigStore.instance().store(
    group="hydra/launcher", name="xconf_ray", node=RayLauncherConf, provider="xconf"
)
