"""The Ray cluster a sweep runs on: its settings, the connection, its node shape, a case's
placement.

xconf connects to a cluster that is already running (``address=auto``: ``RAY_ADDRESS`` or the
cluster last started on this machine; or ``host:port``) and never starts one, except when the
address is ``local`` (Ray's own single-node instance, for trying it out). An address nobody
answers at is a coded error naming it, within ``connect_timeout_s``, never a hang. Ray is
imported here only, lazily: Hydra imports launcher plugins during discovery.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from xconf.launchers.errors import LaunchError, TopologyError, check_settings
from xconf.launchers.submitit_resources import NodeShape, node_shape
from xconf.launchers.world import WorldSettings

ADDRESS_PATH = "hydra.launcher.address"
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})


@dataclass(frozen=True)
class RaySettings:
    """``hydra/launcher=xconf_ray``'s settings (see the plugin's config for each field)."""

    address: str = "auto"
    connect_timeout_s: float = 15.0
    backend: str = "auto"
    pg_timeout_s: float = 300.0
    job_timeout_s: float = 1800.0
    omp_num_threads: int = 1
    node_cpus: int | None = None
    node_gpus: int | None = None
    node_count: int | None = None
    max_tasks_per_node: int | None = None
    cpus_per_task: int | None = None

    def validate(self) -> None:
        self.world().validate()
        checks = (
            ("address", bool(self.address.strip())),
            ("connect_timeout_s", self.connect_timeout_s > 0),
            ("cpus_per_task", self.cpus_per_task is None or self.cpus_per_task >= 1),
        )
        check_settings(self, checks)
        if self.address not in ("auto", "local"):
            _host_port(self.address)

    def world(self) -> WorldSettings:
        """What a rank needs to join its world: the torchrun launcher's own settings."""
        return WorldSettings(
            backend=self.backend,
            pg_timeout_s=self.pg_timeout_s,
            job_timeout_s=self.job_timeout_s,
            omp_num_threads=self.omp_num_threads,
        )

    def declared_node(self) -> dict[str, Any]:
        keys = ("node_cpus", "node_gpus", "node_count", "max_tasks_per_node")
        return {k: getattr(self, k) for k in keys}


def _host_port(address: str) -> tuple[str, int]:
    if address.startswith("ray://"):
        # Ray Client runs the driver off the cluster, where the job directories it writes are
        # not the storage the ranks write to: run xconf-run on a node of the cluster instead.
        raise LaunchError(
            "launch.ray.client_address",
            f"{address!r} is a Ray Client address; run xconf-run on a cluster node (the head "
            "pod) with address=auto or the GCS host:port",
            ADDRESS_PATH,
        )
    host, sep, port = address.strip().rpartition(":")
    if not sep or not host or not port.isdigit():
        raise LaunchError(
            "launch.ray.bad_address",
            f"expected 'auto', 'local' or host:port, got {address!r}",
            ADDRESS_PATH,
        )
    return host.strip("[]"), int(port)


def _given_address(settings: RaySettings) -> str | None:
    """The host:port xconf will connect to, found as Ray finds it for ``auto`` (``RAY_ADDRESS``,
    a running GCS on this machine, the cluster last started here), so that a stale record is
    a coded error naming it, not minutes of Ray retrying."""
    if settings.address == "local":
        return None
    if settings.address != "auto":
        return settings.address
    try:
        from ray._private.services import get_ray_address_from_environment

        found = get_ray_address_from_environment("auto", None)
    except Exception:  # not found (Ray says so on connecting), or Ray moved the function
        found = os.environ.get("RAY_ADDRESS")
    return found if found and found != "auto" else None


def _probe(address: str, timeout_s: float) -> None:
    """Fail fast, naming the address, when nothing answers there (Ray itself retries for
    minutes before giving up on an address)."""
    host, port = _host_port(address)
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            pass
    except OSError as exc:
        raise LaunchError(
            "launch.ray.unreachable",
            f"no Ray cluster answers at {address} ({type(exc).__name__}: {exc}); start one "
            "(`ray start --head`, KubeRay) or set hydra.launcher.address",
            ADDRESS_PATH,
        ) from None


def _routable_ip() -> str | None:
    """This machine's address towards the outside (no packet is sent), as Ray picks it."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.connect(("8.8.8.8", 80))
            return str(sock.getsockname()[0])
    except OSError:
        return None


def _loopback_only(address: str) -> bool:
    """A loopback address of a cluster that listens on loopback only (scripts/ray-up), not a
    real node's ``RAY_ADDRESS=127.0.0.1:6379`` (a KubeRay head pod), which Ray resolves to
    the node's own address."""
    host, port = _host_port(address)
    if host not in LOOPBACK_HOSTS:
        return False
    routable = _routable_ip()
    if routable is None or routable.startswith("127."):
        return True
    try:
        with socket.create_connection((routable, port), timeout=2):
            return False
    except OSError:
        return True


def _keep_loopback() -> None:
    """A cluster on 127.0.0.1 (scripts/ray-up): Ray rewrites a loopback address to the
    machine's routable IP before connecting, where a loopback cluster does not listen. Ray
    keeps loopback addresses as they are when its multi-node support is switched off for this
    driver process (it starts no node of its own, so nothing else changes)."""
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    constants = sys.modules.get("ray._private.ray_constants")
    if constants is not None:  # already imported: the flag was read at import
        constants.ENABLE_RAY_CLUSTER = False  # type: ignore[attr-defined]


def connect(settings: RaySettings) -> None:
    """Connect this process to the cluster (once); raises ``launch.ray.unreachable``."""
    given = _given_address(settings)
    if given is not None:
        _probe(given, settings.connect_timeout_s)
    loopback = settings.address == "local" or (given is not None and _loopback_only(given))
    if loopback:
        _keep_loopback()
    import ray

    if ray.is_initialized():
        return
    options: dict[str, Any] = {
        # Ranks write to their case's log (ray_rank.py); nothing of theirs reaches this terminal.
        "log_to_driver": False,
        "logging_level": "WARNING",
        "configure_logging": False,
        "include_dashboard": False if settings.address == "local" else None,
    }
    if loopback:
        options["_node_ip_address"] = "127.0.0.1"
    if settings.address == "local":
        options.update(num_cpus=os.cpu_count() or 1, object_store_memory=100 * 2**20)
    options = {k: v for k, v in options.items() if v is not None}
    # ray.init installs its own SIGTERM handler; xconf's (stop, cancel, exit 143) must stay.
    saved = _signal_handlers()
    try:
        ray.init(address=settings.address, **options)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise LaunchError(
            "launch.ray.unreachable",
            f"cannot connect to the Ray cluster at {given or settings.address}: "
            f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}",
            ADDRESS_PATH,
        ) from None
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def _signal_handlers() -> dict[int, Any]:
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {s: signal.getsignal(s) or signal.SIG_DFL for s in (signal.SIGINT, signal.SIGTERM)}


def shape_of_nodes(nodes: Sequence[Mapping[str, Any]]) -> NodeShape:
    """The node shape of a cluster as ``ray.nodes()`` lists it: the smallest live node that
    takes work (a head started with ``--num-cpus=0`` takes none), and how many there are."""
    workers = [
        n.get("Resources", {})
        for n in nodes
        if n.get("Alive") and n.get("Resources", {}).get("CPU")
    ]
    if not workers:
        raise TopologyError(
            "launch.ray.node_shape_unknown",
            "the Ray cluster has no live node with CPUs; set hydra.launcher.node_cpus / "
            "node_gpus / node_count (an autoscaling cluster adds nodes on demand)",
            "hydra.launcher.node_cpus",
        )
    shapes = [(int(r.get("GPU", 0)), int(r["CPU"])) for r in workers]
    gpus, cpus = min(shapes)
    return NodeShape(cpus=cpus, gpus=gpus, nodes=len(workers))


def cluster_node_shape(settings: RaySettings) -> NodeShape:
    """The node shape: what the launcher config declares, the rest from the cluster."""

    def ask() -> NodeShape:
        import ray

        return shape_of_nodes(ray.nodes())

    return node_shape(settings.declared_node(), None, ask_slurm=False, ask=ask)


@dataclass(frozen=True)
class Placement:
    """One case's placement group: one bundle per rank, in rank order."""

    bundles: tuple[dict[str, float], ...]
    strategy: str  # STRICT_PACK: the world on one node; PACK: as few nodes as hold it
    nodes: int

    @property
    def gpus_per_rank(self) -> float:
        return self.bundles[0].get("GPU", 0.0)

    @property
    def cpus_per_rank(self) -> float:
        return self.bundles[0]["CPU"]
