"""Full-vocabulary rows kept as tensors inside the engine: every row checked before use, and,
across TP workers in their own processes, bitwise the rows vLLM hands out as dicts."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.adapters.conftest import needs_vllm
from xconf.adapters.errors import ScoringError
from xconf.adapters.vllm.rows import rows_checked

ROWS = torch.tensor([[0.5, -1.0, 2.0], [1.5, 0.25, -3.0], [-0.5, 4.0, 1.0]])
TARGETS = [2, 0, 1]
REPORTED = [2.0, 1.5, 4.0]


def test_kept_chunks_join_in_position_order() -> None:
    chunks = {2: ROWS[2:], 0: ROWS[:2]}  # kept out of order (chunked prefill)
    assert torch.equal(rows_checked((chunks, None), TARGETS, REPORTED, "here"), ROWS)


@pytest.mark.parametrize(
    ("chunks", "broken", "reported", "code", "said"),
    [
        ({0: ROWS[:2]}, None, REPORTED, "runtime.missing_logits", "kept 2 logits rows for 3"),
        ({0: ROWS[:1], 2: ROWS[2:]}, None, REPORTED, "runtime.missing_logits", "position 2"),
        ({}, "outside this step", REPORTED, "runtime.missing_logits", "outside this step"),
        ({0: ROWS}, None, [2.0, 1.5, 3.999], "runtime.logits_row_mismatch", "token 2 gives 4.0"),
        ({0: ROWS[[0, 2, 1]]}, None, REPORTED, "runtime.logits_row_mismatch", "token 1"),
    ],
    ids=["too-few", "gap", "broken", "another-value", "rows-swapped"],
)
def test_a_row_that_is_not_the_engines_is_a_coded_error(
    chunks: dict[int, torch.Tensor], broken: str | None, reported: list[float], code: str, said: str
) -> None:
    with pytest.raises(ScoringError) as err:
        rows_checked((chunks, broken), TARGETS, reported, "rollout.decode")
    assert err.value.code == code and said in err.value.message, err.value
    assert err.value.path is not None and err.value.path.startswith("rollout.decode")


def test_native_rows_are_checked_against_the_reported_logprob() -> None:
    """A ``raw_logprobs`` engine reports ``log_softmax(row, float32)[target]``: the row is
    checked against that, bit for bit, and a value one ulp off is refused."""
    logprobs = ROWS.log_softmax(-1, dtype=torch.float32)
    reported = [float(logprobs[k, t]) for k, t in enumerate(TARGETS)]
    kept = ({0: ROWS}, None)
    rows = rows_checked(kept, TARGETS, reported, "rollout.decode", as_logprobs=True)
    assert torch.equal(rows, ROWS)  # the logits rows themselves, not their logprobs
    off = [*reported[:2], float(torch.nextafter(logprobs[2, 1], torch.tensor(0.0)))]
    with pytest.raises(ScoringError) as err:
        rows_checked(kept, TARGETS, off, "rollout.decode", as_logprobs=True)
    assert err.value.code == "runtime.logits_row_mismatch"
    with pytest.raises(ScoringError):  # a raw logit is not a logprob
        rows_checked(kept, TARGETS, REPORTED, "rollout.decode", as_logprobs=True)


def test_a_token_outside_the_rows_is_a_coded_error() -> None:
    with pytest.raises(ScoringError, match="outside the engine's 3 logits columns"):
        rows_checked(({0: ROWS}, None), [2, 0, 3], REPORTED, "rollout.prefill")


@needs_vllm
@pytest.mark.slow
def test_rows_from_tensor_parallel_workers_are_bitwise_the_dicts(
    model_record: Any, frozen_batch: Any
) -> None:
    """TP=2: two worker processes; the rows come back through collective_rpc from rank 0."""
    from tests.adapters.vllm_rows import as_kept, through_dicts
    from xconf.adapters.vllm.engine import RolloutEngineConfig, VllmRolloutEngine

    cfg = RolloutEngineConfig(
        model_path=model_record.path, logprobs_mode="raw_logits", tensor_parallel_size=2
    )
    with VllmRolloutEngine(cfg) as engine:
        for mode in ("decode", "prefill"):
            kept, _ = as_kept(engine, frozen_batch, mode)
            dicts = through_dicts(engine, frozen_batch, mode)
            assert len(kept) == len(dicts) == len(frozen_batch.samples)
            for ours, theirs in zip(kept, dicts, strict=True):
                assert ours.shape == theirs.shape and torch.equal(ours, theirs), mode
