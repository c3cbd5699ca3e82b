"""``hydra/launcher=xconf_ray`` without a cluster: registration, lazy imports, the node shape
and bundles it derives, and the coded errors that come before anything is submitted."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hydra.core.config_store import ConfigStore

from tests.launchers.test_s0_multirun import SMOKE, xconf_run
from xconf.launchers.errors import TopologyError
from xconf.launchers.ray_cluster import RaySettings, shape_of_nodes
from xconf.launchers.ray_launch import placement_of, plan_placements
from xconf.launchers.submitit_resources import NodeShape, group_jobs

REPO = Path(__file__).resolve().parents[2]


def test_plugin_registers_and_imports_neither_ray_nor_torch() -> None:
    code = (
        "import sys\n"
        "from hydra.core.plugins import Plugins\n"
        "from hydra.plugins.launcher import Launcher\n"
        "names = [p.__name__ for p in Plugins.instance().discover(Launcher)]\n"
        "assert 'XconfRayLauncher' in names, names\n"
        "from hydra_plugins.xconf_ray_launcher import ray_launcher, config\n"
        "print(sorted(m for m in ('ray', 'torch') if m in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"
    import hydra_plugins.xconf_ray_launcher.config  # noqa: F401 (registers the config)

    assert "xconf_ray.yaml" in ConfigStore.instance().list("hydra/launcher")


# What `ray.nodes()` lists for a KubeRay cluster: a head that takes no work (--num-cpus=0), two
# GPU workers, one of them smaller, and a dead node.
NODES = [
    {"Alive": True, "Resources": {"CPU": 0.0, "memory": 1e9, "node:__internal_head__": 1.0}},
    {"Alive": True, "Resources": {"CPU": 16.0, "GPU": 4.0, "memory": 1e11}},
    {"Alive": True, "Resources": {"CPU": 8.0, "GPU": 2.0, "memory": 1e11}},
    {"Alive": False, "Resources": {"CPU": 64.0, "GPU": 8.0}},
]


def test_node_shape_is_the_smallest_live_node_that_takes_work() -> None:
    assert shape_of_nodes(NODES) == NodeShape(cpus=8, gpus=2, nodes=2)
    with pytest.raises(TopologyError) as info:
        shape_of_nodes(NODES[:1])
    assert info.value.code == "launch.ray.node_shape_unknown"


def test_bundles_follow_the_slurm_sizing() -> None:
    configs = [
        {"rollout": {"tensor_parallel_size": tp}, "training": {"sharding": "unsharded"}}
        for tp in (1, 2, 4)
    ]
    overrides = [[f"rollout.tensor_parallel_size={tp}"] for tp in (1, 2, 4)]
    # The local test cluster: two nodes of one CPU; a two-rank world spans both.
    two_small = [
        placement_of(g) for g in group_jobs(overrides[:2], configs[:2], NodeShape(1, 0, 2))
    ]
    assert [(p.bundles, p.strategy) for p in two_small] == [
        (({"CPU": 1.0},), "STRICT_PACK"),
        (({"CPU": 1.0}, {"CPU": 1.0}), "PACK"),
    ]
    # GPU nodes of 8 CPUs and 2 GPUs: one GPU per rank, the node's CPUs split between its ranks.
    gpu = [placement_of(g) for g in group_jobs(overrides, configs, NodeShape(8, 2, 2))]
    assert [(len(p.bundles), p.bundles[0], p.strategy, p.nodes) for p in gpu] == [
        (1, {"CPU": 8.0, "GPU": 1.0}, "STRICT_PACK", 1),
        (2, {"CPU": 4.0, "GPU": 1.0}, "STRICT_PACK", 1),
        (4, {"CPU": 4.0, "GPU": 1.0}, "PACK", 2),
    ]


def test_a_world_the_cluster_cannot_hold_is_refused_with_a_ray_code() -> None:
    settings = RaySettings(node_cpus=1, node_gpus=0, node_count=2)
    with pytest.raises(TopologyError) as info:
        plan_placements(
            [["rollout.tensor_parallel_size=4"]],
            [{"rollout": {"tensor_parallel_size": 4}}],
            settings,
        )
    assert info.value.code == "launch.ray.world_too_large"
    assert "Ray cluster has 2 node(s)" in info.value.message


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize("how", ["given", "auto"])
def test_unreachable_address_is_a_coded_error_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """Given, or found by ``auto`` (here ``RAY_ADDRESS``; Ray's record of the last cluster
    started on the machine is read the same way): named within seconds, never a hang."""
    address = f"127.0.0.1:{_free_port()}"  # nothing listens there
    if how == "auto":
        monkeypatch.setenv("RAY_ADDRESS", address)
    started = time.monotonic()
    done = xconf_run(
        tmp_path,
        *SMOKE,
        "hydra/launcher=xconf_ray",
        f"hydra.launcher.address={address if how == 'given' else 'auto'}",
        f"output_root={tmp_path / 'out'}",
        f"hydra.sweep.dir={tmp_path / 'mr'}",
    )
    took = time.monotonic() - started
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    assert "xconf: error [launch.ray.unreachable] at 'hydra.launcher.address'" in done.stderr
    assert f"no Ray cluster answers at {address}" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "mr" / "0").exists()  # no job was started
    assert took < 60, took


def test_the_plan_and_its_cap_come_before_the_cluster(tmp_path: Path) -> None:
    """300 cases through an address nobody answers at: the cap refuses them first (exit 2,
    nothing written), so no sweep ever reaches a cluster unplanned."""
    done = xconf_run(
        tmp_path,
        "+experiment=cpu_smoke",
        "allow_smoke_operators=true",
        "interventions=[]",
        "batch.size=range(1,300)",
        "hydra/launcher=xconf_ray",
        f"hydra.launcher.address=127.0.0.1:{_free_port()}",
        f"output_root={tmp_path / 'out'}",
        f"hydra.sweep.dir={tmp_path / 'mr'}",
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert "[plan.too_large]" in done.stderr
    assert "launch.ray" not in done.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / "mr").exists()


@pytest.mark.parametrize(
    ("settings", "code"),
    [
        (RaySettings(address="ray://head:10001"), "launch.ray.client_address"),
        (RaySettings(address="head"), "launch.ray.bad_address"),
        (RaySettings(connect_timeout_s=0), "launch.settings.invalid"),
        (RaySettings(backend="mpi"), "launch.settings.invalid"),
    ],
)
def test_bad_settings_are_coded_errors(settings: RaySettings, code: str) -> None:
    from xconf.launchers.errors import LaunchError

    with pytest.raises(LaunchError) as info:
        settings.validate()
    assert info.value.code == code
    assert info.value.path is not None and info.value.path.startswith("hydra.launcher.")


def test_loopback_is_kept_only_for_a_cluster_that_listens_on_loopback_only() -> None:
    """scripts/ray-up's cluster listens on 127.0.0.1 only: its address stays loopback. A real
    node's ``RAY_ADDRESS=127.0.0.1:6379`` (its GCS on the node's address) is left to Ray, which
    resolves it to the node's own address."""
    from xconf.launchers.ray_cluster import _loopback_only, _routable_ip

    with socket.socket() as local_only:
        local_only.bind(("127.0.0.1", 0))
        local_only.listen()
        assert _loopback_only(f"127.0.0.1:{local_only.getsockname()[1]}")
    assert not _loopback_only("10.1.2.3:6379")
    routable = _routable_ip()
    if routable is None or routable.startswith("127."):
        pytest.skip("this machine has no routable address")
    with socket.socket() as everywhere:
        everywhere.bind((routable, 0))  # a GCS on the node's own address
        everywhere.listen()
        assert not _loopback_only(f"127.0.0.1:{everywhere.getsockname()[1]}")


def test_a_rank_that_does_not_see_the_launchers_job_directory_refuses_to_run(
    tmp_path: Path,
) -> None:
    """A worker whose storage is not the launcher's (no probe, or another run's) would seal
    artifacts nobody else sees: its rank runs nothing and names the directory."""
    import json

    from xconf.launchers.ray_rank import PROBE_NAME, RankActor

    (tmp_path / PROBE_NAME).write_text("another-launch", "utf-8")
    for job_dir in (tmp_path / "elsewhere", tmp_path):
        actor = RankActor(1, str(job_dir), "this-launch")
        assert actor.storage_error is not None
        assert f"does not see the launcher's job directory {job_dir}" in actor.storage_error
        answer = json.loads(actor.run("{}", "{}", str(tmp_path), "{}"))
        assert answer == {"ok": False, "error": actor.storage_error}
    assert not (tmp_path / "elsewhere").exists()  # nothing created where the case is not
