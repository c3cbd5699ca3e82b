"""vLLM's per-process tokenizer cache: each engine records whether its tokenizer came from it,
and the reuse never moves a bit of a score (the same batch scored with and without it)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.adapters.conftest import needs_vllm
from xconf.runtime.readback import ROLLOUT_TOKENIZER_REUSED

pytestmark = [needs_vllm, pytest.mark.slow]


def test_tokenizer_reuse_is_recorded_and_changes_no_bit(
    model_record: Any, frozen_batch: Any
) -> None:
    from vllm.tokenizers.registry import cached_get_tokenizer

    from xconf.adapters.vllm.engine import RolloutEngineConfig, VllmRolloutEngine
    from xconf.adapters.vllm.scorer import score_frozen

    cfg = RolloutEngineConfig(model_path=model_record.path)
    scored = {}
    for reuse in (False, True):
        if not reuse:
            cached_get_tokenizer.cache_clear()  # this engine must load its own
        with VllmRolloutEngine(cfg) as engine:
            assert engine.tokenizer_reused is reuse
            assert engine.live().readings()[ROLLOUT_TOKENIZER_REUSED.name] is reuse
            scored[reuse] = score_frozen(engine, frozen_batch, "decode", 4)
    assert scored[True].numpy().tobytes() == scored[False].numpy().tobytes()
