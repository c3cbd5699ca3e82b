"""Each side's process group is fixed by its own knobs.

A rollout ``tensor_parallel_size=4`` case launches 4 ranks; the training side must still
shard over the baseline's FSDP group of 2 (a sub-group of the launched world), not over all
4 ranks, and ranks 2 and 3 build no training model. Four gloo ranks, only two of which load
the tiny checkpoint.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from tests.adapters._side_world_worker import WORLD, _rank_main
from tests.adapters.conftest import needs_hf
from tests.adapters.spawned_ranks import free_port, run_ranks

pytestmark = [needs_hf, pytest.mark.slow]
TIMEOUT_S = 300


def test_rollout_tp_case_keeps_the_baseline_training_world(
    model_record: Any, model_cache: str, tmp_path: Path
) -> None:
    started = time.perf_counter()
    run_ranks(_rank_main, (free_port(), model_cache, str(tmp_path)), WORLD, TIMEOUT_S)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD)]
    for rank, res in enumerate(ranks):
        contexts = res["contexts"]
        # The rollout TP=4 case's training world equals the baseline's: 2, in a world of 4.
        assert contexts["tp4"]["world_size"] == contexts["baseline"]["world_size"] == 2
        assert contexts["tp4"]["launcher_world_size"] == WORLD
        # Read back from the live model on ranks 0-1, received from rank 0 on ranks 2-3.
        assert res["readback"] == {"training.world_size": 2, "training.sharding": "fsdp"}
        assert res["built_model"] == (rank < 2), (rank, res)
    assert ranks[0]["bitwise"]
    print(f"4-rank side-world test: {time.perf_counter() - started:.1f} s")
