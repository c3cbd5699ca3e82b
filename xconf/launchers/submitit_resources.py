"""Group a sweep's jobs by derived world size, with Slurm resources for each group.

hydra-submitit-launcher gives every job of one ``launch()`` call the same resources, so a
sweep whose cases need different process counts is submitted as one launch per group. Each
Slurm task is one rank: a world fills nodes of the partition's shape (:class:`NodeShape`, from
the launcher config or ``sinfo``), one GPU per rank where the nodes have GPUs; the node's
cores are split between its tasks unless the user set ``cpus_per_task``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from xconf.launchers.errors import TopologyError
from xconf.launchers.topology import required_world_size


@dataclass(frozen=True)
class NodeShape:
    """One node of the partition jobs go to: where ranks (one Slurm task each) can be placed.

    ``gpus`` > 0: one GPU per rank, so a node holds at most ``gpus`` ranks. ``nodes``: how many
    such nodes the partition has (a world needing more is refused before submission).
    """

    cpus: int
    gpus: int = 0
    nodes: int = 1
    max_tasks: int | None = None  # tasks per node at most; default one per GPU, else per CPU

    def task_cap(self) -> int:
        return self.max_tasks or self.gpus or self.cpus


# scripts/slurm-up's one node (CPUs=2, no GPU): what unit tests and docs examples assume.
LOCAL_TEST_NODE = NodeShape(cpus=2)


@dataclass(frozen=True)
class ResourceGroup:
    """Jobs that share one world size, in their original sweep order."""

    world_size: int
    job_indices: tuple[int, ...]  # positions in the sweep's job list
    job_overrides: tuple[tuple[str, ...], ...]
    tasks_per_node: int
    cpus_per_task: int
    nodes: int = 1
    gpus_per_node: int | None = None

    def resources(self) -> dict[str, int]:
        out = {
            "tasks_per_node": self.tasks_per_node,
            "cpus_per_task": self.cpus_per_task,
            "nodes": self.nodes,
        }
        if self.gpus_per_node is not None:
            out["gpus_per_node"] = self.gpus_per_node
        return out

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


def resources_for(
    world_size: int, node: NodeShape = LOCAL_TEST_NODE, cpus_per_task: int | None = None
) -> dict[str, int]:
    """Slurm resources for one world: as many ranks per node as fit, as many nodes as needed.

    The user's ``cpus_per_task`` is kept (checked against the node); otherwise the node's CPUs
    are split between its tasks.
    """
    per_node = min(world_size, node.task_cap())
    if world_size % per_node:
        raise TopologyError(
            "launch.slurm.uneven_world",
            f"world size {world_size} does not split evenly over nodes of {per_node} tasks",
            "hydra.launcher.tasks_per_node",
        )
    nodes = world_size // per_node
    if nodes > node.nodes:
        raise TopologyError(
            "launch.slurm.world_too_large",
            f"world size {world_size} needs {nodes} node(s) of {per_node} tasks; the partition "
            f"has {node.nodes} node(s) of {node.cpus} CPUs and {node.gpus} GPUs",
            "hydra.launcher.tasks_per_node",
        )
    if cpus_per_task is None:
        cpus_per_task = max(1, node.cpus // per_node)
    elif cpus_per_task * per_node > node.cpus:
        raise TopologyError(
            "launch.slurm.cpus_exceed_node",
            f"{per_node} tasks x cpus_per_task={cpus_per_task} exceed the node's {node.cpus} CPUs",
            "hydra.launcher.cpus_per_task",
        )
    out = {"tasks_per_node": per_node, "cpus_per_task": cpus_per_task, "nodes": nodes}
    if node.gpus:
        out["gpus_per_node"] = per_node  # one GPU per rank
    return out


def group_jobs(
    job_overrides: Sequence[Sequence[str]],
    configs: Sequence[DictConfig | Mapping[str, Any]],
    node: NodeShape = LOCAL_TEST_NODE,
    cpus_per_task: int | None = None,
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
        res = resources_for(world, node, cpus_per_task)
        groups.append(
            ResourceGroup(
                world_size=world,
                job_indices=tuple(members[world]),
                job_overrides=tuple(tuple(job_overrides[i]) for i in members[world]),
                tasks_per_node=res["tasks_per_node"],
                cpus_per_task=res["cpus_per_task"],
                nodes=res["nodes"],
                gpus_per_node=res.get("gpus_per_node"),
            )
        )
    return groups


def group_jobs_with_loader(
    load_sweep_config: Callable[[DictConfig, list[str]], DictConfig],
    master_config: DictConfig,
    job_overrides: Sequence[Sequence[str]],
    node: NodeShape = LOCAL_TEST_NODE,
    cpus_per_task: int | None = None,
) -> list[ResourceGroup]:
    """Compose each job with Hydra's loader (``hydra_context.config_loader.load_sweep_config``)
    and group it; for sweepers that hold only override lists."""
    configs = [load_sweep_config(master_config, list(o)) for o in job_overrides]
    return group_jobs(job_overrides, configs, node, cpus_per_task)


def _without_hydra(cfg: DictConfig | Mapping[str, Any]) -> Mapping[str, Any]:
    if isinstance(cfg, DictConfig):
        # The hydra node holds ${hydra:...} interpolations that only resolve inside Hydra.
        data = OmegaConf.to_container(cfg, resolve=False)
        if not isinstance(data, dict):
            raise TopologyError("launch.topology.not_a_mapping", "config is not a mapping", "")
        data.pop("hydra", None)
        return OmegaConf.to_container(OmegaConf.create(data), resolve=True)  # type: ignore[return-value]
    return {str(k): v for k, v in cfg.items() if k != "hydra"}


def node_shape_from_slurm(partition: str | None = None, timeout_s: float = 30.0) -> NodeShape:
    """The partition's node shape as Slurm reports it (``sinfo``): CPUs, GPUs, node count.

    Nodes of different shapes: the smallest (a world planned for it fits every node).
    """
    import re
    import subprocess

    argv = ["sinfo", "-h", "-o", "%c|%G|%D"] + (["-p", partition] if partition else [])
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=True)
    except (OSError, subprocess.SubprocessError) as exc:
        raise TopologyError(
            "launch.slurm.node_shape_unknown",
            f"cannot ask Slurm for the node shape ({type(exc).__name__}: {exc}); set "
            "hydra.launcher.node_cpus / node_gpus / node_count",
            "hydra.launcher.node_cpus",
        ) from exc
    shapes = []
    for line in out.stdout.split("\n"):
        if not line.strip():
            continue
        cpus, gres, count = line.strip().split("|")
        gpus = re.search(r"gpu(?::[^:,()]+)?:(\d+)", gres)
        gpu_count = int(gpus.group(1)) if gpus else 0
        shapes.append(NodeShape(int(cpus.rstrip("+")), gpu_count, int(count.rstrip("+"))))
    if not shapes:
        raise TopologyError(
            "launch.slurm.node_shape_unknown",
            f"sinfo reports no nodes for partition {partition or '(default)'}",
            "hydra.launcher.partition",
        )
    smallest = min(shapes, key=lambda n: (n.gpus, n.cpus))
    return NodeShape(smallest.cpus, smallest.gpus, sum(n.nodes for n in shapes))


def node_shape(
    declared: Mapping[str, Any],
    partition: str | None,
    ask_slurm: bool = True,
    ask: Callable[[], NodeShape] | None = None,
) -> NodeShape:
    """The node shape from the launcher config (``node_cpus``, ``node_gpus``, ``node_count``,
    ``max_tasks_per_node``); what is not declared comes from ``ask`` (the Ray launcher asks
    its cluster), else from ``sinfo``."""
    known = {k: declared.get(k) for k in ("node_cpus", "node_gpus", "node_count")}
    if None in known.values() and (ask_slurm or ask is not None):
        asked = ask() if ask is not None else node_shape_from_slurm(partition)
        fill = {"node_cpus": asked.cpus, "node_gpus": asked.gpus, "node_count": asked.nodes}
        known = {k: fill[k] if v is None else v for k, v in known.items()}
    if known["node_cpus"] is None:
        raise TopologyError(
            "launch.slurm.node_shape_unknown",
            "the node's CPUs are not declared",
            "hydra.launcher.node_cpus",
        )
    return NodeShape(
        cpus=int(known["node_cpus"]),
        gpus=int(known["node_gpus"] or 0),
        nodes=int(known["node_count"] or 1),
        max_tasks=declared.get("max_tasks_per_node"),
    )
