"""Where each side of a vllm_hf case runs inside the launched world.

The launched world has the larger side's ranks (:func:`xconf.knobs.side_worlds`); the rollout
engine and the training scorer each occupy their own ranks ``0 .. size - 1`` of it.
"""

from __future__ import annotations

from typing import Any


def process_group_context() -> tuple[tuple[str, Any], ...]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return (
            ("backend", str(dist.get_backend())),
            ("rank", dist.get_rank()),
            ("world_size", dist.get_world_size()),
        )
    return (("backend", "none"), ("rank", 0), ("world_size", 1))


def launched_world_size() -> int:
    return int(dict(process_group_context())["world_size"])


def rollout_executor(tp: int, world: int) -> tuple[str, bool, str]:
    """(executor, engine core in-process?, evidence) for a rollout TP inside a launcher world."""
    if world > 1 and tp == world:
        return (
            "external_launcher",
            True,
            f"vLLM external_launcher: one TP rank per launcher rank ({world})",
        )
    if world > 1:
        return (
            "auto",
            False,
            f"engine core in its own process on rank 0 of the {world}-rank launched world",
        )
    if tp == 1:
        return "auto", True, "in-process engine"
    return "auto", True, "multiprocess executor, one worker per TP rank"
