"""Rank coordination for multi-process cases: rank 0 decides and publishes, others follow.

Outside torch.distributed every helper degenerates to the single-process behaviour. Each
side (rollout, training) runs on its own sub-group of the launched world, sized by its own
knobs (:func:`xconf.knobs.side_worlds`).
"""

from __future__ import annotations

import gc
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


def process_group_context() -> tuple[tuple[str, Any], ...]:
    """The launched world as a binding records it: its backend, this rank, its size
    (``none``, 0, 1 outside torch.distributed)."""
    if in_process_group():
        return (
            ("backend", str(dist.get_backend())),
            ("rank", dist.get_rank()),
            ("world_size", dist.get_world_size()),
        )
    return (("backend", "none"), ("rank", 0), ("world_size", 1))


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


# size -> (the world it was made in, the sub-group). A group belongs to one world: after
# ``destroy_process_group`` and a new ``init_process_group`` its communicator is gone.
_GROUPS: dict[int, tuple[Any, Any]] = {}


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
    cached = _GROUPS.get(size)
    if cached is None or cached[0] is not dist.group.WORLD:
        cached = (dist.group.WORLD, dist.new_group(ranks=list(range(size))))
        _GROUPS[size] = cached
    return SideGroup(size, cached[1], rank() < size)


def close_world() -> None:
    """End this rank's part in the launched world: every process group, sub-groups included.

    The sub-group cache is emptied first: it would otherwise keep each sub-group's backend
    (worker threads, sockets) alive past the destroy, to be torn down during interpreter
    finalization, where a C++ thread pool can abort a rank whose work had succeeded.
    """
    _GROUPS.clear()
    if in_process_group():
        dist.destroy_process_group()
    gc.collect()  # the released backends' threads are joined now, not at exit
