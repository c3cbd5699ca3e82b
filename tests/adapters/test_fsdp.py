"""FSDP2 training scorer: 2 gloo ranks, bitwise equal to the unsharded scorer, read-only."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from tests.adapters.conftest import needs_hf
from tests.adapters.spawned_ranks import free_port, run_ranks

pytestmark = [needs_hf, pytest.mark.slow]
WORLD = 2
TIMEOUT_S = 240


def _rank_main(rank: int, model_path: str, port: int, out_dir: str) -> None:
    import torch
    import torch.distributed as dist

    from xconf.adapters.frozen import FrozenBatch, FrozenSample
    from xconf.adapters.hf.handlers import TRAINING as HANDLERS
    from xconf.adapters.hf.model import TrainingScorerConfig
    from xconf.adapters.hf.scorer import HFTrainingScorer
    from xconf.runtime.protocol import knob_readback
    from xconf.runtime.ranks import close_world

    def read_back(scorer: HFTrainingScorer) -> dict[str, Any]:
        """The scorer's readings and each knob read from its live state by its handler."""
        live = scorer.live()
        return {**live.readings(), **knob_readback(HANDLERS, "training", live)}

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", rank=rank, world_size=WORLD, timeout=__import__("datetime").timedelta(seconds=120)
    )
    try:
        batch = FrozenBatch(
            (FrozenSample((5, 6, 7), (8, 9, 10, 11)), FrozenSample((12, 13), (14, 15, 16))),
            pad_token_id=0,
        )
        plain = HFTrainingScorer(TrainingScorerConfig(model_path=model_path)).score(batch, 2)
        sharded_scorer = HFTrainingScorer(
            TrainingScorerConfig(model_path=model_path, sharding="fsdp")
        )
        sharded = sharded_scorer.score(batch, 2)
        back = read_back(sharded_scorer)
        # The alias builds the same FSDP2 scorer and reads back the canonical spelling.
        alias_scorer = HFTrainingScorer(
            TrainingScorerConfig(model_path=model_path, sharding="fsdp2")
        )
        alias = alias_scorer.score(batch, 2)
        # training.param_dtype / reduce_dtype: an FSDP2 MixedPrecisionPolicy, read back live.
        mixed_scorer = HFTrainingScorer(
            TrainingScorerConfig(
                model_path=model_path,
                sharding="fsdp",
                param_dtype="bfloat16",
                reduce_dtype="float32",
            )
        )
        mixed = mixed_scorer.score(batch, 2)
        mixed_back = read_back(mixed_scorer)
        result = {
            "bitwise": bool(torch.equal(plain.logprobs, sharded.logprobs)),
            "alias_bitwise": bool(torch.equal(alias.logprobs, sharded.logprobs)),
            "alias_sharding": read_back(alias_scorer)["training.sharding"],
            "policy": [mixed_back["training.param_dtype"], mixed_back["training.reduce_dtype"]],
            "plain_policy": [back["training.param_dtype"], back["training.reduce_dtype"]],
            "mixed_diff": float((plain.logprobs - mixed.logprobs).abs().max()),
            "max_diff": float((plain.logprobs - sharded.logprobs).abs().max()),
            "digest_equal": sharded.digest_before == sharded.digest_after,
            "sharding": back["training.sharding"],
            "world": back["training.world_size"],
            "wrapped": len(back["training.fsdp_wrapped_modules"]),
        }
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))
    finally:
        close_world()


def test_fsdp2_two_ranks_bitwise_equal_to_unsharded(model_record: Any, tmp_path: Path) -> None:
    started = time.perf_counter()
    run_ranks(_rank_main, (model_record.path, free_port(), str(tmp_path)), WORLD, TIMEOUT_S)
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD)]
    for res in results:
        assert res["bitwise"], res
        assert res["digest_equal"]
        assert res["sharding"] == "fsdp" and res["world"] == WORLD
        assert res["alias_bitwise"] and res["alias_sharding"] == "fsdp"
        assert res["policy"] == ["bfloat16", "float32"]
        assert res["plain_policy"] == ["none", "none"]
        assert res["mixed_diff"] > 1e-5  # bfloat16 compute really ran: the scores moved
        assert res["wrapped"] == 3  # two decoder layers and the root
    print(f"fsdp2 2-rank test: {time.perf_counter() - started:.1f} s")
