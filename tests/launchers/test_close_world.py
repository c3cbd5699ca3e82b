"""A rank's world ends whole: ``close_world`` releases every sub-group with the default group,
and a world opened again in the same process gets a new sub-group, never the destroyed one."""

from __future__ import annotations

import datetime
import json
import os
from pathlib import Path

from tests.adapters.spawned_ranks import free_port, run_ranks

WORLD = 3


def _open(rank: int, port: int) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group(
        "gloo", rank=rank, world_size=WORLD, timeout=datetime.timedelta(seconds=60)
    )


def _rank_main(rank: int, ports: tuple[int, int], out_dir: str) -> None:
    import torch
    import torch.distributed as dist

    from xconf.runtime import ranks

    torch.set_num_threads(1)
    seen = []
    for port in ports:
        _open(rank, port)
        group = ranks.side_group(2)
        again = ranks.side_group(2)  # cached within one world: no second communicator
        total = torch.ones(1)
        if group.member:
            dist.all_reduce(total, group=group.group)
        seen.append(
            {
                # Registered in this world (a destroyed group from the last one is not).
                "ranks": dist.get_process_group_ranks(group.group) if group.member else None,
                "cached": again.group is group.group,
                "member": group.member,
                "total": float(total),
            }
        )
        ranks.close_world()
        seen[-1]["closed"] = not dist.is_initialized() and not ranks._GROUPS
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(seen))


def test_close_world_releases_sub_groups_and_a_new_world_gets_new_ones(tmp_path: Path) -> None:
    run_ranks(_rank_main, ((free_port(), free_port()), str(tmp_path)), WORLD, 120)
    for rank in range(WORLD):
        first, second = json.loads((tmp_path / f"rank{rank}.json").read_text())
        for world in (first, second):
            assert world["cached"] and world["closed"]
            assert world["member"] == (rank < 2)
            # The sub-group's collective spans ranks 0-1 only, in both worlds.
            assert world["total"] == (2.0 if rank < 2 else 1.0)
            assert world["ranks"] == ([0, 1] if rank < 2 else None)
