"""vLLM's forwards grouped into samples by the positions the engine fed (no engine needed).

One request at a time: a sample's positions rise from 0, and the next sample starts lower
again. A sample that starts above 0 had its prefix served from the prefix cache: those
positions were never computed, so there is nothing to compare and localize refuses.
"""

from __future__ import annotations

import pytest
import torch

from xconf.localize.capture import Recorder
from xconf.localize.errors import LocalizeError
from xconf.localize.names import name_map, taps


def _recorder(positions: list[list[int]]) -> Recorder:
    recorder = Recorder(None, name_map("Qwen3ForCausalLM", "test"), "vllm", taps(1))
    recorder.positions = [torch.tensor(p) for p in positions]
    for key in recorder.outputs:
        recorder.outputs[key] = [torch.zeros(len(p), 4) for p in positions]
    return recorder


def test_each_sample_starts_again_from_position_0() -> None:
    # Two decode passes of 5 tokens (prefill of 3, then 1 forced token at a time) and one of 4.
    recorder = _recorder([[0, 1, 2], [3], [0, 1, 2], [3], [0, 1], [2]])
    assert recorder._vllm_groups([5, 5, 4]) == [[0, 1], [2, 3], [4, 5]]


def test_a_sample_served_from_the_prefix_cache_is_refused() -> None:
    # The second sample's positions 0..1 came from the cache: it starts at 2.
    recorder = _recorder([[0, 1, 2], [3], [2], [3]])
    with pytest.raises(LocalizeError) as info:
        recorder._vllm_groups([5, 5])
    assert info.value.code == "localize.prefix_cache_hit"
    assert info.value.path == "rollout.enable_prefix_caching"
    assert "positions 0..1 of sample 1" in str(info.value)


@pytest.mark.parametrize(
    ("positions", "lengths"),
    [
        ([[0, 1, 2], [3]], [5, 5]),  # a sample missing
        ([[0, 1, 2], [4]], [5]),  # a position skipped
    ],
)
def test_positions_that_do_not_fit_the_frozen_samples_are_refused(
    positions: list[list[int]], lengths: list[int]
) -> None:
    with pytest.raises(LocalizeError) as info:
        _recorder(positions)._vllm_groups(lengths)
    assert info.value.code == "localize.capture_mismatch"
