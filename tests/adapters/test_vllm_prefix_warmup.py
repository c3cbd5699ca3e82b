"""The prefix-caching warm-up by the prompts alone leaves the scored pass bitwise what the
whole forced-decode warm-up gave (``xconf/adapters/vllm/scorer.py``), on the tiny model.

The prompts share a first KV block (a 128-token CPU block) and end within their second one,
as the real default's chat prompts do; the responses stay within that block too, so the
cheap warm-up applies. A prompt whose response crosses into another block takes the whole
forced decode."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.adapters.conftest import needs_vllm

pytestmark = [needs_vllm]

PREFIX = " ".join(f"w{i}" for i in range(70))  # well over one block once tokenized


def test_prompt_warm_up_scores_bitwise_as_the_forced_decode_warm_up(
    model_record: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from xconf.adapters.frozen import FrozenSample
    from xconf.adapters.vllm import scorer
    from xconf.adapters.vllm.engine import RolloutEngineConfig, VllmRolloutEngine

    cfg = RolloutEngineConfig(model_path=model_record.path, enable_prefix_caching=True)
    prompts = [f"{PREFIX} question {k} " + "x " * k for k in range(6)]
    with VllmRolloutEngine(cfg) as engine:
        batch = scorer.generate_responses(engine, prompts, response_len=6)
        block = int(engine.llm.llm_engine.vllm_config.cache_config.block_size)
        lengths = [len(s.prompt_ids) for s in batch.samples]
        assert all(block < n and n + 6 <= 2 * block for n in lengths), (block, lengths)
        assert all(
            scorer._prompts_fill_alike(engine, list(batch.samples[i : i + 4])) for i in (0, 4)
        )
        cheap = scorer.score_frozen(engine, batch, "decode", 4)
        cheap_hits = engine.prefix_cache_hits
        monkeypatch.setattr(scorer, "WARM_BY_PROMPTS", False)
        whole = scorer.score_frozen(engine, batch, "decode", 4)
        whole_hits = engine.prefix_cache_hits
        # A response that reaches another block: the whole forced decode, never the shortcut.
        long = FrozenSample(batch.samples[0].prompt_ids, (0,) * (2 * block))
        assert not scorer._prompts_fill_alike(engine, [long])
    assert cheap_hits == whole_hits and cheap_hits is not None and cheap_hits >= block * 6
    assert torch.equal(cheap.view(torch.int32), whole.view(torch.int32))  # bit for bit
