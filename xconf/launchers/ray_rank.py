"""One rank of a case on Ray: an actor that runs the torchrun launcher's own rank.

Ray starts each rank as an actor in a worker process of its own, in its bundle of the case's
placement group. The actor checks that the case's job directory is the one the launcher
wrote (the storage every worker must reach), sends everything its process writes (engines,
C code, torch) to the case's log in that directory, and then runs
:func:`xconf.launchers.world.run_rank` exactly as a torchrun rank does: the world comes from
``RANK``/``WORLD_SIZE``/``MASTER_ADDR``/``MASTER_PORT`` (gloo on CPU, NCCL on GPU), the job
is the JSON description of :func:`xconf.launchers.world.rank_job_text`. What the launcher
hands an actor are strings; what it answers is JSON text. This class is importable, so Ray
carries it by name. The actor's process ends when the launcher kills it (every case's actors
are killed when the case ends, however it ends).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from xconf.launchers.ports import free_port
from xconf.launchers.world import WorldSettings, run_rank

PROBE_NAME = ".xconf-ray-probe"  # written by the launcher into each job directory


def log_name(rank: int) -> str:
    return f"ray_rank{rank}.out"


def _storage_error(rank: int, job_dir: str, nonce: str) -> str | None:
    """Why this worker cannot use the job directory the launcher wrote (None: it can)."""
    probe = Path(job_dir) / PROBE_NAME
    try:
        seen = probe.read_text("utf-8").strip()
    except OSError as exc:
        seen = f"<{type(exc).__name__}: {exc.strerror or exc}>"
    if seen == nonce:
        return None
    return (
        f"rank {rank} on node {_node_ip()} does not see the launcher's job directory {job_dir} "
        f"({PROBE_NAME}: {seen[:80]!r}); output_root and hydra.sweep.dir must be on storage "
        "every Ray worker reaches"
    )


def _node_ip() -> str:
    import ray

    return str(ray.util.get_node_ip_address())


def _redirect_output(path: Path) -> None:
    """Descriptors 1 and 2 of this process (and of every process it starts) to ``path``."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o644)
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
    finally:
        os.close(fd)


class RankActor:
    """Rank ``rank`` of the case whose job directory is ``job_dir``."""

    def __init__(self, rank: int, job_dir: str, nonce: str) -> None:
        self.rank = rank
        self.storage_error = _storage_error(rank, job_dir, nonce)
        if self.storage_error is None:
            _redirect_output(Path(job_dir) / log_name(rank))

    def where(self) -> str:
        """Where this rank runs (JSON); rank 0 also names a free port for the world's store."""
        import ray

        ip = _node_ip()
        return json.dumps(
            {
                "rank": self.rank,
                "ip": ip,
                "pid": os.getpid(),
                "node_id": ray.get_runtime_context().get_node_id(),
                "port": free_port(ip) if self.rank == 0 else None,
                "storage_error": self.storage_error,
            }
        )

    def run(self, job: str, settings_json: str, pid_dir: str, env_json: str) -> str:
        """Join the world and run the job; ``{"ok": true, "value": ...}`` or the failure."""
        if self.storage_error is not None:
            return json.dumps({"ok": False, "error": self.storage_error})
        os.environ.update(json.loads(env_json))
        try:
            value = run_rank(job, WorldSettings(**json.loads(settings_json)), pid_dir)
        except Exception as exc:
            return json.dumps({"ok": False, "error": _summary(exc)})
        return json.dumps({"ok": True, "value": value})


def _summary(exc: BaseException) -> str:
    from xconf.errors import XconfError

    if isinstance(exc, XconfError):
        return f"[{exc.code}] {exc.message}"
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}".strip()


def parse(answer: Any) -> dict[str, Any]:
    data = json.loads(str(answer))
    if not isinstance(data, dict):
        raise ValueError(f"a rank answered {answer!r}")
    return data
