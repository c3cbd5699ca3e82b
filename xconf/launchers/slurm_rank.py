"""Inside a submitit Slurm task: become one rank of the job's gloo world.

hydra-submitit-launcher runs the Hydra job once per Slurm task; with ``tasks_per_node=W``
each of the W tasks calls :func:`init_slurm_rank` and only rank 0 publishes artifacts.
Rank 0 picks the rendezvous port (a free one, never one derived from the job id: any other
process on the node may hold that) and leaves it in the job's folder for the others.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from xconf.launchers.errors import LaunchError
from xconf.launchers.ports import free_port

# Rank 0 leaves the port it picked here, in the job's submitit folder that every task sees.
_PORT_FILE = ".xconf-rendezvous-{job_id}-{restart}.port"
_POLL_S = 0.2
_PORT_MAX_BYTES = 8  # "65535" and room for nothing else


@dataclass(frozen=True)
class SlurmRank:
    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int
    job_id: str

    @property
    def publishes(self) -> bool:
        """Rank 0 alone writes artifacts and returns the case's value."""
        return self.rank == 0


def port_file(folder: Path, job_id: str, restart: str = "0") -> Path:
    """Where rank 0 of job ``job_id`` (its ``restart``-th start) publishes its port; a
    requeued job starts with a new name, so no task reads the port of a previous start."""
    return folder / _PORT_FILE.format(job_id=job_id, restart=restart)


def publish_port(path: Path, port: int) -> None:
    """Rank 0: the port, written atomically (a peer never reads half a number)."""
    from xconf.artifacts.safe_io import write_file

    write_file(path, str(port).encode())


def wait_port(path: Path, timeout_s: float) -> int:
    """A peer: the port rank 0 published at ``path``, waiting up to ``timeout_s``."""
    from xconf.artifacts.layout import read_regular
    from xconf.errors import ArtifactError

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            # Bounded, never following a link, never blocking on a FIFO: the folder is shared.
            data = read_regular(path, _PORT_MAX_BYTES)
        except ArtifactError as exc:
            raise LaunchError(
                "launch.slurm.rendezvous", f"the port file is unreadable: {exc}", str(path)
            ) from None
        if data is not None:
            return _port(data, path)
        if time.monotonic() >= deadline:
            raise LaunchError(
                "launch.slurm.rendezvous",
                f"rank 0 published no port at {path} within {timeout_s:g} s",
                str(path),
            )
        time.sleep(_POLL_S)


def _port(data: bytes, path: Path) -> int:
    text = data.decode("ascii", "replace")
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise LaunchError(
            "launch.slurm.rendezvous", f"the port file holds {text[:16]!r}, not a port", str(path)
        )
    return int(text)


def slurm_rank_from_env(timeout_s: float = 300.0) -> SlurmRank:
    """Who this task is; rank 0 picks a free port (``ports.free_port``, the owner Ray's
    ranks use too) and publishes it in the job's folder, the other tasks wait for it."""
    import submitit

    env = submitit.JobEnvironment()
    # SLURM_JOB_ID is unique per array element, unlike submitit's "<array>_<index>" job_id.
    job_id = os.environ.get("SLURM_JOB_ID") or str(env.job_id)
    master = "localhost" if env.num_nodes == 1 else env.hostnames[0]
    path = port_file(env.paths.folder, job_id, os.environ.get("SLURM_RESTART_COUNT", "0"))
    if env.global_rank == 0:
        port = free_port(master)
        publish_port(path, port)
    else:
        port = wait_port(path, timeout_s)
    return SlurmRank(
        rank=env.global_rank,
        world_size=env.num_tasks,
        local_rank=env.local_rank,
        master_addr=master,
        master_port=port,
        job_id=job_id,
    )


def init_slurm_rank(timeout_s: float = 300.0, backend: str = "gloo") -> SlurmRank:
    """Initialise torch.distributed for this Slurm task; returns who we are.

    Idempotent within a process. The timeout bounds every collective, so a task whose peer
    died fails instead of holding the allocation.
    """
    import torch.distributed as dist

    me = slurm_rank_from_env(timeout_s)
    os.environ.update(
        MASTER_ADDR=me.master_addr,
        MASTER_PORT=str(me.master_port),
        RANK=str(me.rank),
        WORLD_SIZE=str(me.world_size),
        LOCAL_RANK=str(me.local_rank),
    )
    if not dist.is_initialized():
        dist.init_process_group(
            backend,
            init_method=f"tcp://{me.master_addr}:{me.master_port}",
            rank=me.rank,
            world_size=me.world_size,
            timeout=timedelta(seconds=timeout_s),
        )
    return me


def destroy_slurm_rank() -> None:
    from xconf.runtime.ranks import close_world

    close_world()
