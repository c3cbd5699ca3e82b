"""The two ways to get a raw_logits engine's full-vocabulary rows, for the bitwise test.

``through_dicts``: the path the scorer took before the engine kept rows as tensors: ask vLLM
for every vocabulary entry (``logprobs=-1`` / ``prompt_logprobs=-1``), get one dict of
``Logprob`` per token, copy it into a row one entry at a time (slow; the tiny model's 512
columns keep it cheap). ``as_kept``: the rows the operator now receives, recorded by an
operator that only looks.
"""

from __future__ import annotations

from typing import Any

import torch

from xconf.adapters.frozen import FrozenBatch


def _row(entry: dict[int, Any]) -> torch.Tensor:
    row = torch.full((max(entry) + 1,), float("-inf"), dtype=torch.float32)
    for token, logprob in entry.items():
        row[token] = float(logprob.logprob)
    return row


def through_dicts(engine: Any, batch: FrozenBatch, mode: str) -> list[torch.Tensor]:
    """Per sample, [scored tokens, vocab] rows from vLLM's per-token dicts."""
    from vllm import SamplingParams

    from xconf.adapters.vllm.forcing import FORCED_TOKENS_KEY

    samples = list(batch.samples)
    if mode == "decode":
        params = [
            SamplingParams(
                max_tokens=len(s.response_ids),
                temperature=0.0,
                logprobs=-1,
                ignore_eos=True,
                detokenize=False,
                extra_args={FORCED_TOKENS_KEY: list(s.response_ids)},
            )
            for s in samples
        ]
        prompts = [{"prompt_token_ids": list(s.prompt_ids)} for s in samples]
    else:
        params = [
            SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=-1, detokenize=False)
            for _ in samples
        ]
        prompts = [{"prompt_token_ids": list(s.token_ids)} for s in samples]
    outs = engine.llm.generate(prompts, params, use_tqdm=False)
    entries = [
        list(out.outputs[0].logprobs) if mode == "decode" else list(out.prompt_logprobs[1:])
        for out in outs
    ]
    return [torch.stack([_row(e) for e in sample]) for sample in entries]


def as_kept(engine: Any, batch: FrozenBatch, mode: str) -> tuple[list[torch.Tensor], Any]:
    """Per sample, the rows the operator receives from the engine, and the scores."""
    from xconf.adapters.vllm.scorer import score_frozen
    from xconf.ops.reference import ReferenceSelectedLogprob

    reference = ReferenceSelectedLogprob()
    seen: list[torch.Tensor] = []

    def looking(logits: torch.Tensor, target: torch.Tensor, active: torch.Tensor) -> Any:
        seen.append(logits.clone())
        return reference(logits, target, active)

    scores = score_frozen(engine, batch, mode, 4, looking)
    return seen, scores
