"""Megatron TP 2 over gloo, as a launched sub-group: ranks 0-1 of a three-rank world hold the
model's shards, rank 2 builds nothing and receives rank 0's score and readback.

Against TP 1 and transformers on the same tokens (within the float32 threshold), every knob
read back from the live shards, a write into one rank's shard caught on both ranks, and
xconf's vocab-parallel operator on Megatron's own vocab
shards bit for bit equal to the same operator on the gathered full rows (its
``cross_tp_bitwise`` promise, on the layout Megatron builds).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch

from tests.adapters.spawned_ranks import free_port, run_ranks
from tests.megatron._tp_worker import CASES, TP, WORLD, rank_main
from tests.megatron.conftest import needs_megatron
from tests.megatron.inputs import max_diff, score, threshold

pytestmark = [needs_megatron, pytest.mark.slow]
TIMEOUT_S = 420


def test_tp2_sub_group_scores_the_same_tokens(checkpoints, tmp_path: Path) -> None:
    from safetensors.torch import load_file

    from tests.megatron.inputs import BATCH
    from xconf.adapters.hf.model import TrainingScorerConfig
    from xconf.adapters.hf.scorer import HFTrainingScorer
    from xconf.adapters.megatron import side
    from xconf.adapters.megatron.settings import MegatronSettings

    roots = {ckpt: str(checkpoints(ckpt)) for ckpt, _ in CASES.values()}
    started = time.perf_counter()
    run_ranks(rank_main, (free_port(), roots, str(tmp_path)), WORLD, TIMEOUT_S)
    elapsed = time.perf_counter() - started
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD)]
    got = load_file(str(tmp_path / "scores.safetensors"))
    for name, (ckpt, settings) in CASES.items():
        for rank, res in enumerate(ranks):
            assert res[name]["built"] == (rank < TP), (name, rank)
            assert res[name] == {**ranks[0][name], "built": rank < TP}  # rank 0's readback
        back = ranks[0][name]["readback"]
        assert back["training.tensor_parallel_size"] == back["training.world_size"] == TP
        assert back["training.launcher_world_size"] == WORLD
        assert back["training.sequence_parallel"] is settings.get("sequence_parallel", False)
        assert back["training.remove_padding"] is settings.get("remove_padding", False)
        assert back["training.attention_backend"] == settings.get("attention_backend", "eager")
        assert back["training.cross_entropy_loss_fusion"] is settings.get(
            "cross_entropy_loss_fusion", False
        )
        assert ranks[0][name]["vocab_bounds"] == [[0, 192], [192, 384]]
        alone = {k: v for k, v in settings.items() if k != "sequence_parallel"}  # TP 1 has none
        one = score(side.engine_for(MegatronSettings(**alone), model_path=roots[ckpt]))
        hf = HFTrainingScorer(TrainingScorerConfig(model_path=roots[ckpt])).score(BATCH, 2)
        assert max_diff(got[f"{name}.native"], one) <= threshold(), name
        assert max_diff(got[f"{name}.native"], hf.logprobs) <= threshold(), name
    assert [r["violation"] for r in ranks] == ["parameters_changed", "parameters_changed", None]
    assert torch.equal(got["plain.vocab_parallel"], got["plain.full_rows"])
    assert max_diff(got["plain.vocab_parallel"], got["plain.native"]) <= threshold()
    print(f"Megatron TP 2 in a {WORLD}-rank world: {elapsed:.1f} s")
