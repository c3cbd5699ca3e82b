"""required_world_size: derived from process-lifecycle knobs, never set."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from xconf.launchers.errors import TopologyError
from xconf.launchers.topology import required_world_size


@pytest.mark.parametrize(
    ("cfg", "world"),
    [
        ({}, 1),
        ({"rollout": {"dtype": "bfloat16"}}, 1),
        ({"rollout": {"tensor_parallel_size": 2}}, 2),
        ({"rollout": {"tensor_parallel_size": 2, "context_parallel_size": 2}}, 4),
        ({"training": {"sharding": "fsdp"}}, 2),
        # The legal alias plans and launches like fsdp (it once got a world of 1).
        ({"training": {"sharding": "fsdp2"}}, 2),
        ({"training": {"sharding": "FSDP2"}}, 2),
        ({"training": {"sharding": "none"}}, 1),
        ({"rollout": {"tensor_parallel_size": 4}, "training": {"sharding": "fsdp"}}, 4),
        # Megatron's training TP launches its ranks too (it once got a world of 1).
        ({"training": {"tensor_parallel_size": 2}}, 2),
        ({"rollout": {"tensor_parallel_size": 2}, "training": {"tensor_parallel_size": 3}}, 3),
    ],
)
def test_world_size_from_knobs(cfg: dict, world: int) -> None:
    assert required_world_size(cfg) == world
    assert required_world_size(OmegaConf.create(cfg)) == world


def test_interpolated_knob_counts() -> None:
    cfg = OmegaConf.create({"tp": 2, "rollout": {"tensor_parallel_size": "${tp}"}})
    assert required_world_size(cfg) == 2


@pytest.mark.parametrize(
    ("cfg", "code", "path"),
    [
        ({"world_size": 2}, "launch.topology.world_size_not_settable", "world_size"),
        (
            {"rollout": {"nproc_per_node": 2}},
            "launch.topology.world_size_not_settable",
            "rollout.nproc_per_node",
        ),
        (
            {"rollout": {"tensor_parallel_size": 0}},
            "launch.topology.bad_parallel_size",
            "rollout.tensor_parallel_size",
        ),
        (
            {"rollout": {"context_parallel_size": True}},
            "launch.topology.bad_parallel_size",
            "rollout.context_parallel_size",
        ),
        (
            {"training": {"tensor_parallel_size": 0}},
            "launch.topology.bad_parallel_size",
            "training.tensor_parallel_size",
        ),
        ({"training": {"sharding": 3}}, "launch.topology.bad_sharding", "training.sharding"),
        # An unknown mode was silently a world of 1; now it names the path.
        ({"training": {"sharding": "zero3"}}, "launch.topology.bad_sharding", "training.sharding"),
    ],
)
def test_bad_topology_is_typed(cfg: dict, code: str, path: str) -> None:
    with pytest.raises(TopologyError) as info:
        required_world_size(cfg)
    assert info.value.code == code
    assert info.value.path == path
