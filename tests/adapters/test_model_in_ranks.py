"""The tiny checkpoint built from a cold cache inside a two-rank world (what the first S1 case
on a fresh clone does): transformers' ``save_pretrained`` writes nothing on a rank other than
0, so that rank waits for rank 0's checkpoint instead of failing the case."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.adapters.conftest import needs_hf
from xconf.launchers.world import WorldSettings, launch_world


def _ensure_in_rank(cache: str) -> list[str]:
    import torch.distributed as dist

    from xconf.adapters.models import ensure_model

    if dist.get_rank() == 0:
        time.sleep(1.0)  # rank 1 finds the cache cold first, as a rank that starts earlier does
    record = ensure_model(cache_dir=cache)
    shas: list[str | None] = [None] * dist.get_world_size()
    dist.all_gather_object(shas, record.checkpoint_sha256)
    return [str(s) for s in shas]


@needs_hf
@pytest.mark.slow
def test_every_rank_gets_the_checkpoint_rank_zero_built(tmp_path: Path) -> None:
    cache = tmp_path / "models"
    shas, record = launch_world(
        2,
        f"{__name__}:_ensure_in_rank",
        {"cache": str(cache)},
        WorldSettings(job_timeout_s=300, pg_timeout_s=300),
        tmp_path,
    )
    assert record.status == "completed"
    assert len(set(shas)) == 1 and len(shas[0]) == 64
    assert len([p for p in cache.iterdir() if not p.name.startswith(".")]) == 1
