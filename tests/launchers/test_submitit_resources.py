"""Grouping a sweep's jobs by derived world size, and per-group Slurm resources."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from xconf.launchers.errors import LaunchError, TopologyError
from xconf.launchers.slurm_rank import port_for_job
from xconf.launchers.submitit_resources import group_jobs


def test_groups_keep_sweep_order_and_split_cores() -> None:
    configs = [
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


def test_port_for_job_is_stable_and_bounded() -> None:
    assert port_for_job("1234") == port_for_job("1234")
    assert port_for_job("1234") != port_for_job("1235")
    assert 20000 <= port_for_job("987654321") < 40000
    assert port_for_job("12_3") == port_for_job("123")
    with pytest.raises(LaunchError):
        port_for_job("abc")
