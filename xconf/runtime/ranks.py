"""Rank coordination for multi-process cases: rank 0 decides and publishes, others follow.

Outside torch.distributed every helper degenerates to the single-process behaviour.
"""

from __future__ import annotations

from typing import TypeVar

import torch.distributed as dist

T = TypeVar("T")


def in_process_group() -> bool:
    return dist.is_available() and dist.is_initialized()


def rank() -> int:
    return dist.get_rank() if in_process_group() else 0


def world_size() -> int:
    return dist.get_world_size() if in_process_group() else 1


def from_rank0(value: T) -> T:
    """Every rank gets rank 0's ``value``, so no rank diverges before a collective."""
    if not in_process_group() or dist.get_world_size() == 1:
        return value
    box: list[object] = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]  # type: ignore[return-value]
