"""Rank coordination for multi-process cases: rank 0 decides and publishes, others follow.

Outside torch.distributed every helper degenerates to the single-process behaviour. Each
side (rollout, training) runs on its own sub-group of the launched world, sized by its own
knobs (:func:`xconf.knobs.side_worlds`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeVar

import torch.distributed as dist

from xconf.errors import XconfError

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


@dataclass(frozen=True)
class SideGroup:
    """One side's process group: ranks ``0 .. size - 1`` of the launched world.

    ``group`` is None when the side spans the whole world (or there is no world); ``member``
    is False on the ranks outside the side, which take part in no collective of that side.
    """

    size: int
    group: Any
    member: bool

    @property
    def is_sub_group(self) -> bool:
        return self.group is not None


_GROUPS: dict[int, Any] = {}


def side_group(size: int) -> SideGroup:
    """The process group for a side of ``size`` ranks (a sub-group when the world is larger).

    ``dist.new_group`` is collective over the whole world: every rank calls this, in the same
    order, whether or not it is a member. Groups are cached by size, so a case that rebuilds
    a side's engine never creates another communicator.
    """
    world = world_size()
    if size > world:
        raise XconfError(
            "runtime.side_world_too_small",
            f"the side needs {size} ranks, the launched world has {world}",
            "launcher",
        )
    if size == world:
        return SideGroup(size, None, True)
    if size not in _GROUPS:
        _GROUPS[size] = dist.new_group(ranks=list(range(size)))
    return SideGroup(size, _GROUPS[size], rank() < size)
