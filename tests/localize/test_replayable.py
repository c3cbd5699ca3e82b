"""Which cases localize can replay, decided from the plan before anything is loaded."""

from __future__ import annotations

import pytest

from xconf.experiment import Case
from xconf.localize.errors import LocalizeError
from xconf.localize.replay import check_replayable


def _case(**knobs: object) -> Case:
    pairs = tuple(sorted((k.replace("__", "."), v) for k, v in knobs.items()))
    return Case("c-0", 1, "one_at_a_time", pairs[:1], pairs)  # type: ignore[arg-type]


def test_a_decode_shaped_training_case_is_refused_and_its_full_arm_case_is_not() -> None:
    """Localize compares one forward per sample on the transformers side; the decode shape
    runs the rollout engine's steps there (docs/arms.md)."""
    with pytest.raises(LocalizeError) as info:
        check_replayable(_case(training__scoring_mode="decode", training__align__all="vllm"))
    assert info.value.code == "localize.decode_shaped_training"
    check_replayable(_case(training__scoring_mode="full", training__align__all="vllm"))
