"""Group a sweep's jobs by derived world size, with Slurm resources for each group.

hydra-submitit-launcher gives every job of one ``launch()`` call the same resources, so a
sweep whose cases need different process counts is submitted as one launch per group. Each
Slurm task is one rank: ``tasks_per_node`` is the world size and the machine's cores are
split between the tasks.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from xconf.launchers.errors import TopologyError
from xconf.launchers.topology import required_world_size

# Cores of one node in the local cluster (scripts/slurm-up declares CPUs=2).
DEFAULT_NODE_CPUS = 2


@dataclass(frozen=True)
class ResourceGroup:
    """Jobs that share one world size, in their original sweep order."""

    world_size: int
    job_indices: tuple[int, ...]  # positions in the sweep's job list
    job_overrides: tuple[tuple[str, ...], ...]
    tasks_per_node: int
    cpus_per_task: int
    nodes: int = 1

    def resources(self) -> dict[str, int]:
        return {
            "tasks_per_node": self.tasks_per_node,
            "cpus_per_task": self.cpus_per_task,
            "nodes": self.nodes,
        }

    def launcher_overrides(self) -> tuple[str, ...]:
        """Hydra overrides selecting this group's resources (``hydra.launcher.*``)."""
        return tuple(f"hydra.launcher.{k}={v}" for k, v in self.resources().items())

    def apply_to(self, config: DictConfig) -> DictConfig:
        """A copy of the sweep's master config with this group's launcher resources set."""
        out = copy.deepcopy(config)
        with read_write(out), open_dict(out):
            for key, value in self.resources().items():
                out.hydra.launcher[key] = value
        return out


def resources_for(world_size: int, node_cpus: int = DEFAULT_NODE_CPUS) -> dict[str, int]:
    if world_size > node_cpus:
        raise TopologyError(
            "launch.slurm.world_too_large",
            f"world size {world_size} exceeds the node's {node_cpus} CPUs (one task per rank)",
            "hydra.launcher.tasks_per_node",
        )
    return {"tasks_per_node": world_size, "cpus_per_task": max(1, node_cpus // world_size)}


def group_jobs(
    job_overrides: Sequence[Sequence[str]],
    configs: Sequence[DictConfig | Mapping[str, Any]],
    node_cpus: int = DEFAULT_NODE_CPUS,
) -> list[ResourceGroup]:
    """Group jobs by ``required_world_size`` of their composed configs.

    ``configs[i]`` is job i's composed config (its ``hydra`` node is ignored). Groups come in
    order of first appearance; each keeps its jobs' original indices so returns can be put
    back in sweep order.
    """
    if len(job_overrides) != len(configs):
        raise TopologyError(
            "launch.slurm.group_mismatch",
            f"{len(job_overrides)} override lists but {len(configs)} configs",
            "",
        )
    order: list[int] = []
    members: dict[int, list[int]] = {}
    for idx, cfg in enumerate(configs):
        world = required_world_size(_without_hydra(cfg))
        if world not in members:
            order.append(world)
            members[world] = []
        members[world].append(idx)
    groups = []
    for world in order:
        res = resources_for(world, node_cpus)
        groups.append(
            ResourceGroup(
                world_size=world,
                job_indices=tuple(members[world]),
                job_overrides=tuple(tuple(job_overrides[i]) for i in members[world]),
                tasks_per_node=res["tasks_per_node"],
                cpus_per_task=res["cpus_per_task"],
            )
        )
    return groups


def group_jobs_with_loader(
    load_sweep_config: Callable[[DictConfig, list[str]], DictConfig],
    master_config: DictConfig,
    job_overrides: Sequence[Sequence[str]],
    node_cpus: int = DEFAULT_NODE_CPUS,
) -> list[ResourceGroup]:
    """Compose each job with Hydra's loader (``hydra_context.config_loader.load_sweep_config``)
    and group it; for sweepers that hold only override lists."""
    configs = [load_sweep_config(master_config, list(o)) for o in job_overrides]
    return group_jobs(job_overrides, configs, node_cpus)


def _without_hydra(cfg: DictConfig | Mapping[str, Any]) -> Mapping[str, Any]:
    if isinstance(cfg, DictConfig):
        # The hydra node holds ${hydra:...} interpolations that only resolve inside Hydra.
        data = OmegaConf.to_container(cfg, resolve=False)
        if not isinstance(data, dict):
            raise TopologyError("launch.topology.not_a_mapping", "config is not a mapping", "")
        data.pop("hydra", None)
        return OmegaConf.to_container(OmegaConf.create(data), resolve=True)  # type: ignore[return-value]
    return {str(k): v for k, v in cfg.items() if k != "hydra"}
