"""Real multi-process (gloo) checks: bits across TP sizes, replication, preflight."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from _logprob_workers import DTYPES, IMPLS, VOCABS, run_world, score_all, score_impls

from tests.bitwise import same_bits


@pytest.fixture(scope="module")
def tp1() -> dict[str, Any]:
    # In-process, with this process's own thread count: layout and threads both differ.
    return {impl: score_all(0, 1, impl) for impl in IMPLS}


def _check_world(results: list[dict[str, Any]], tp1: dict[str, Any], world: int) -> None:
    for name, _real, _padded, bounds_by_world in VOCABS:
        bounds = bounds_by_world[world]
        for dtype in DTYPES:
            key0 = f"{name}/{dtype}/0"
            ref_lp, ref_lse, ref_grad = tp1[key0]
            for attempt in (0, 1):
                key = f"{name}/{dtype}/{attempt}"
                for rank in range(world):
                    lp, lse, _ = results[rank][key]
                    assert same_bits(lp, ref_lp), (key, rank, "logprob")
                    assert same_bits(lse, ref_lse), (key, rank, "lse")
                grad = torch.cat([results[r][key][2] for r in range(world)], dim=1)
                assert grad.shape[1] == bounds[-1][1]
                assert same_bits(grad, ref_grad), (key, "grad")


@pytest.mark.slow
def test_tp2_bitwise_and_preflight(tmp_path: Path, tp1: dict[str, Any]) -> None:
    from _logprob_workers import tp2_world

    results = run_world(2, tp2_world, tmp_path)
    for impl in IMPLS:
        _check_world([r[impl] for r in results], tp1[impl], 2)
    errors = [r["errors"] for r in results]
    assert [e["tiles"] for e in errors] == ["logprob.preflight.num_vocab_tiles_mismatch"] * 2
    assert [e["determinism"] for e in errors] == ["logprob.preflight.determinism_mode_mismatch"] * 2
    assert errors[0]["shard_size"] == "logprob.preflight.peer_failed"
    assert errors[1]["shard_size"] == "logprob.call.shard_size"
    assert [e["bad_target"] for e in errors] == ["logprob.call.target_out_of_range"] * 2
    # Loud and bounded: each failure returns at preflight speed, not a collective timeout.
    assert max(max(r["seconds"].values()) for r in results) < 20.0


@pytest.mark.slow
def test_tp4_bitwise(tmp_path: Path, tp1: dict[str, Any]) -> None:
    results = run_world(4, score_impls, tmp_path, ("native", "compiled"))
    for impl in ("native", "compiled"):
        _check_world([r[impl] for r in results], tp1[impl], 4)


@pytest.mark.slow
def test_tp2_all_gather_exchange_gives_the_same_bits(tmp_path: Path, tp1: dict[str, Any]) -> None:
    # The branch NCCL takes (all_gather_single), forced on gloo: the same bits as TP 1.
    from _logprob_workers import score_by_all_gather

    results = run_world(2, score_by_all_gather, tmp_path, ("native",))
    _check_world([r["native"] for r in results], tp1["native"], 2)
