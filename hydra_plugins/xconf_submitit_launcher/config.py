"""Configs of ``xconf_submitit_slurm``/``xconf_submitit_local``: hydra-submitit's, retargeted,
plus the node shape xconf sizes each world against."""

# No `from __future__ import annotations`: Hydra's plugin scan executes this module without
# registering it in sys.modules, which string annotations on dataclasses cannot survive.
from dataclasses import dataclass
from typing import Optional

from hydra.core.config_store import ConfigStore
from hydra_plugins.hydra_submitit_launcher.config import LocalQueueConf, SlurmQueueConf

_MODULE = "hydra_plugins.xconf_submitit_launcher.submitit_launcher"


@dataclass
class NodeShapeConf:
    """The partition's node, for sizing worlds; what is left unset is asked from ``sinfo``.
    (typing.Optional: OmegaConf 2.3 cannot read ``int | None`` annotations.)"""

    node_cpus: Optional[int] = None  # noqa: UP045
    node_gpus: Optional[int] = None  # noqa: UP045
    node_count: Optional[int] = None  # noqa: UP045
    max_tasks_per_node: Optional[int] = None  # noqa: UP045


@dataclass
class XconfSlurmQueueConf(NodeShapeConf, SlurmQueueConf):
    _target_: str = f"{_MODULE}.XconfSlurmLauncher"


@dataclass
class XconfLocalQueueConf(NodeShapeConf, LocalQueueConf):
    _target_: str = f"{_MODULE}.XconfLocalLauncher"


ConfigStore.instance().store(
    group="hydra/launcher", name="xconf_submitit_slurm", node=XconfSlurmQueueConf, provider="xconf"
)
ConfigStore.instance().store(
    group="hydra/launcher", name="xconf_submitit_local", node=XconfLocalQueueConf, provider="xconf"
)
