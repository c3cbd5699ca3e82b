"""The one place a launcher picks a rendezvous port: one the kernel says is free now.

Ray's rank 0 (``ray_rank``) and a Slurm job's rank 0 (``slurm_rank``) each bind port 0 on
the master's address and hand the number to their peers; torchrun's c10d rendezvous binds
port 0 itself (``world.launch_world``). A port derived from a name (a job id) can be taken
by any other process on the node, so no launcher derives one.
"""

from __future__ import annotations

import socket


def free_port(host: str) -> int:
    """A TCP port on ``host`` that nothing listens on at the time of the call."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
