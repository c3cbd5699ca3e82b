"""Grouping a sweep's jobs by derived world size, and per-group Slurm resources."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from omegaconf import DictConfig, OmegaConf

from tests.conftest import S3_JSON
from xconf.config.strict import load_experiment_file
from xconf.launchers.errors import LaunchError, TopologyError
from xconf.launchers.ports import free_port
from xconf.launchers.slurm_rank import port_file, publish_port, wait_port
from xconf.launchers.submitit_resources import NodeShape, group_jobs, node_shape
from xconf.planner import plan_experiment


def test_groups_keep_sweep_order_and_split_cores() -> None:
    configs: list[DictConfig | Mapping[str, Any]] = [
        {"rollout": {"dtype": "float32"}},
        {"rollout": {"tensor_parallel_size": 2}},
        {"training": {"sharding": "fsdp"}},
        OmegaConf.create({"batch": {"size": 8}, "hydra": {"job": {"name": "${hydra:job.id}"}}}),
    ]
    overrides = [["rollout.dtype=float32"], ["rollout.tensor_parallel_size=2"], [], ["b=8"]]
    groups = group_jobs(overrides, configs)
    assert [(g.world_size, g.job_indices) for g in groups] == [(1, (0, 3)), (2, (1, 2))]
    one, two = groups
    assert one.resources() == {"tasks_per_node": 1, "cpus_per_task": 2, "nodes": 1}
    assert two.resources() == {"tasks_per_node": 2, "cpus_per_task": 1, "nodes": 1}
    assert two.job_overrides == (("rollout.tensor_parallel_size=2",), ())
    assert two.launcher_overrides() == (
        "hydra.launcher.tasks_per_node=2",
        "hydra.launcher.cpus_per_task=1",
        "hydra.launcher.nodes=1",
    )


def test_apply_to_sets_launcher_resources_on_a_copy() -> None:
    master = OmegaConf.create({"hydra": {"launcher": {"tasks_per_node": 1, "nodes": 1}}})
    OmegaConf.set_readonly(master, True)
    (group,) = group_jobs([[]], [{"training": {"sharding": "fsdp"}}])
    out = group.apply_to(master)
    assert out.hydra.launcher.tasks_per_node == 2 and out.hydra.launcher.cpus_per_task == 1
    assert master.hydra.launcher.tasks_per_node == 1


def test_world_larger_than_node_is_refused() -> None:
    with pytest.raises(TopologyError) as info:
        group_jobs([[]], [{"rollout": {"tensor_parallel_size": 4}}])
    assert info.value.path == "hydra.launcher.tasks_per_node"


def test_mismatched_lengths_are_refused() -> None:
    with pytest.raises(TopologyError):
        group_jobs([[], []], [{}])


def test_rank_zero_publishes_a_free_port_the_peers_read(tmp_path: Path) -> None:
    # A port some other process holds (what a job-id-derived port met on a shared node):
    # the port rank 0 publishes is one nothing listens on, and the peers read that one.
    with socket.socket() as taken:
        taken.bind(("localhost", 0))
        taken.listen()
        port = free_port("localhost")
        assert port != taken.getsockname()[1]
    path = port_file(tmp_path, "1234")
    publish_port(path, port)
    assert wait_port(path, timeout_s=0) == port
    # A requeued job (its next start) never reads the port of the previous one.
    assert port_file(tmp_path, "1234", restart="1") != path


def test_a_peer_without_rank_zero_fails_coded(tmp_path: Path) -> None:
    path = port_file(tmp_path, "99")
    with pytest.raises(LaunchError) as err:
        wait_port(path, timeout_s=0.3)
    assert err.value.code == "launch.slurm.rendezvous"
    assert str(path) in str(err.value)


@pytest.mark.parametrize(
    "content", [b"", b"12ab", b"0", b"70000", b"1" * 100], ids=["empty", "text", "0", "big", "long"]
)
def test_a_port_file_that_holds_no_port_fails_coded(tmp_path: Path, content: bytes) -> None:
    path = port_file(tmp_path, "7")
    path.write_bytes(content)
    with pytest.raises(LaunchError) as err:
        wait_port(path, timeout_s=0)
    assert err.value.code == "launch.slurm.rendezvous"
    assert str(path) in str(err.value)


def test_a_fifo_at_the_port_path_never_blocks_the_peer(tmp_path: Path) -> None:
    path = port_file(tmp_path, "8")
    os.mkfifo(path)
    with pytest.raises(LaunchError) as err:
        wait_port(path, timeout_s=0)
    assert err.value.code == "launch.slurm.rendezvous"


def _nested(knobs: dict) -> dict:
    out: dict = {}
    for path, value in knobs.items():
        node = out
        *parents, leaf = path.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return out


def _s3_groups(node: NodeShape, cpus_per_task: int | None = None) -> list:
    plan = plan_experiment(load_experiment_file(S3_JSON))
    overrides = [[case.label()] for case in plan.cases]
    configs = [_nested(case.knob_dict()) for case in plan.cases]
    return group_jobs(overrides, configs, node, cpus_per_task)


TWO_BY_EIGHT = NodeShape(cpus=64, gpus=8, nodes=2)


def test_s3_on_two_nodes_of_eight_gpus_plans_two_nodes_of_eight_tasks(tmp_path: Path) -> None:
    import submitit

    groups = _s3_groups(TWO_BY_EIGHT)
    # TP4 x CP4 = 16 ranks for nine cases; TP=1 or CP=1 leaves 4 ranks (one node, 4 GPUs).
    assert [(g.world_size, len(g.job_indices)) for g in groups] == [(16, 9), (4, 2)]
    big, small = groups
    assert big.resources() == {
        "tasks_per_node": 8,
        "cpus_per_task": 8,
        "nodes": 2,
        "gpus_per_node": 8,
    }
    assert small.resources() == {
        "tasks_per_node": 4,
        "cpus_per_task": 16,
        "nodes": 1,
        "gpus_per_node": 4,
    }
    # What sbatch would get, through submitit's own executor (no cluster needed to render it).
    executor = submitit.AutoExecutor(folder=str(tmp_path), cluster="slurm")
    executor.update_parameters(timeout_min=5, **big.resources())
    slurm = executor._executor
    assert isinstance(slurm, submitit.SlurmExecutor)
    script = slurm._make_submission_file_text("python -c pass", "uid")
    for line in (
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks-per-node=8",
        "#SBATCH --gpus-per-node=8",
        "#SBATCH --cpus-per-task=8",
    ):
        assert line in script


def test_users_cpus_per_task_is_kept_or_refused_when_the_node_is_too_small() -> None:
    big, _ = _s3_groups(TWO_BY_EIGHT, cpus_per_task=4)
    assert big.cpus_per_task == 4
    with pytest.raises(TopologyError) as info:
        _s3_groups(TWO_BY_EIGHT, cpus_per_task=16)  # 8 tasks x 16 > 64 CPUs
    assert info.value.code == "launch.slurm.cpus_exceed_node"
    assert info.value.path == "hydra.launcher.cpus_per_task"


def test_a_world_needing_more_nodes_than_the_partition_has_is_refused() -> None:
    with pytest.raises(TopologyError) as info:
        _s3_groups(NodeShape(cpus=64, gpus=8, nodes=1))
    assert info.value.code == "launch.slurm.world_too_large"


def test_node_shape_comes_from_the_launcher_config() -> None:
    declared = {"node_cpus": 64, "node_gpus": 8, "node_count": 2, "max_tasks_per_node": None}
    assert node_shape(declared, None, ask_slurm=False) == TWO_BY_EIGHT
    with pytest.raises(TopologyError):
        node_shape({"node_gpus": 8}, None, ask_slurm=False)
