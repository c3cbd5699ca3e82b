"""Which rank am I, whatever launched me: one call for the task function.

Under ``hydra/launcher=torchrun`` the launcher has already initialised the process group;
under a submitit Slurm job with several tasks this joins the job's gloo world; anywhere
else (``basic`` launcher, a single Slurm task) the process is rank 0 of a world of 1 and
no process group is created.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class RankInfo:
    rank: int
    world_size: int
    launcher: str  # "torchrun" | "slurm" | "single"

    @property
    def publishes(self) -> bool:
        """Rank 0 alone writes artifacts and returns the case's value."""
        return self.rank == 0


def _submitit_tasks() -> int:
    """Tasks of the submitit job this process runs in (0 outside submitit)."""
    # submitit exports SUBMITIT_EXECUTOR into every task it starts (slurm and local).
    if "SUBMITIT_EXECUTOR" not in os.environ:
        return 0
    import submitit

    return int(submitit.JobEnvironment().num_tasks)


def join_world(timeout_s: float = 300.0) -> RankInfo:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return RankInfo(dist.get_rank(), dist.get_world_size(), "torchrun")
    if _submitit_tasks() > 1:
        from xconf.launchers.slurm_rank import init_slurm_rank

        me = init_slurm_rank(timeout_s=timeout_s)
        return RankInfo(me.rank, me.world_size, "slurm")
    return RankInfo(0, 1, "single")
