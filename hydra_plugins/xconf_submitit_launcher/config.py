"""Configs of ``xconf_submitit_slurm``/``xconf_submitit_local``: hydra-submitit's, retargeted."""

# No `from __future__ import annotations`: Hydra's plugin scan executes this module without
# registering it in sys.modules, which string annotations on dataclasses cannot survive.
from dataclasses import dataclass

from hydra.core.config_store import ConfigStore
from hydra_plugins.hydra_submitit_launcher.config import LocalQueueConf, SlurmQueueConf

_MODULE = "hydra_plugins.xconf_submitit_launcher.submitit_launcher"


@dataclass
class XconfSlurmQueueConf(SlurmQueueConf):
    _target_: str = f"{_MODULE}.XconfSlurmLauncher"


@dataclass
class XconfLocalQueueConf(LocalQueueConf):
    _target_: str = f"{_MODULE}.XconfLocalLauncher"


ConfigStore.instance().store(
    group="hydra/launcher", name="xconf_submitit_slurm", node=XconfSlurmQueueConf, provider="xconf"
)
ConfigStore.instance().store(
    group="hydra/launcher", name="xconf_submitit_local", node=XconfLocalQueueConf, provider="xconf"
)
