"""Inside a submitit Slurm task: become one rank of the job's gloo world.

hydra-submitit-launcher runs the Hydra job once per Slurm task; with ``tasks_per_node=W``
each of the W tasks calls :func:`init_slurm_rank` and only rank 0 publishes artifacts.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from datetime import timedelta

from xconf.launchers.errors import LaunchError

# Ports derived from the job id fall in [_PORT_BASE, _PORT_BASE + _PORT_SPAN).
_PORT_BASE = 20000
_PORT_SPAN = 20000


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


def port_for_job(job_id: str) -> int:
    """A rendezvous port derived from the Slurm job id (distinct for concurrent jobs)."""
    digits = re.sub(r"\D", "", job_id)
    if not digits:
        raise LaunchError("launch.slurm.job_id", f"no digits in job id {job_id!r}", "SLURM_JOB_ID")
    return _PORT_BASE + int(digits) % _PORT_SPAN


def slurm_rank_from_env() -> SlurmRank:
    import submitit

    env = submitit.JobEnvironment()
    # SLURM_JOB_ID is unique per array element, unlike submitit's "<array>_<index>" job_id.
    job_id = os.environ.get("SLURM_JOB_ID") or str(env.job_id)
    master = "localhost" if env.num_nodes == 1 else env.hostnames[0]
    return SlurmRank(
        rank=env.global_rank,
        world_size=env.num_tasks,
        local_rank=env.local_rank,
        master_addr=master,
        master_port=port_for_job(job_id),
        job_id=job_id,
    )


def init_slurm_rank(timeout_s: float = 300.0, backend: str = "gloo") -> SlurmRank:
    """Initialise torch.distributed for this Slurm task; returns who we are.

    Idempotent within a process. The timeout bounds every collective, so a task whose peer
    died fails instead of holding the allocation.
    """
    import torch.distributed as dist

    me = slurm_rank_from_env()
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
