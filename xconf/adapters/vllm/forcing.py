"""Forced decoding for vLLM v1: a logits processor that pins each row to frozen tokens.

A request opts in with ``SamplingParams(extra_args={FORCED_TOKENS_KEY: [ids...]})``. At
every step the processor reads the row's position from the live output-token list that
vLLM hands over when the request is added, and masks every other token to ``-inf``.
vLLM computes ``raw_logprobs`` before logits processors run, so forcing changes which
token is emitted but not the reported logprob. Rows without the key are untouched.
An engine built for processed logprobs (computed after the processors) is never pinned
here: the sampler hook (:mod:`~xconf.adapters.vllm.sampling`) forces the sampled token
after vLLM computed them (:meth:`ForcedTokensLogitsProcessor.force_sampled`). The processor
also tracks the rows of requests that carry :data:`~xconf.adapters.vllm.sampling.SCORED_KEY`
(every scoring request, prompt-logprob ones included), whose sampling the hook records.
A request that also names :data:`~xconf.adapters.vllm.rows.ROWS_KEY` has each of its rows
kept, as the processor receives it and before pinning it (:mod:`xconf.adapters.vllm.rows`).

This module imports vLLM at import time: it is loaded by vLLM itself through the import
string :data:`FORCED_TOKENS_PROCESSOR` (also in worker processes), never by xconf's core.
"""

from __future__ import annotations

from typing import Any

import torch
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import (
    BatchUpdate,
    LogitsProcessor,
    MoveDirectionality,
)

from xconf.adapters.vllm import rows
from xconf.adapters.vllm.sampling import SCORED_KEY

FORCED_TOKENS_KEY = "xconf_forced_tokens"


def _scored(params: SamplingParams | None) -> bool:
    return bool((getattr(params, "extra_args", None) or {}).get(SCORED_KEY))


def _forced_tokens(params: SamplingParams | None) -> list[int] | None:
    extra = getattr(params, "extra_args", None) or {}
    forced = extra.get(FORCED_TOKENS_KEY)
    if forced is None:
        return None
    return [int(t) for t in forced]


class ForcedTokensLogitsProcessor(LogitsProcessor):
    """Per-row forced decoding; state follows vLLM's persistent batch (remove, add, move)."""

    @classmethod
    def validate_params(cls, sampling_params: SamplingParams) -> None:
        extra = getattr(sampling_params, "extra_args", None) or {}
        forced = extra.get(FORCED_TOKENS_KEY)
        if rows.ROWS_KEY in extra and not isinstance(extra[rows.ROWS_KEY], str):
            raise ValueError(f"{rows.ROWS_KEY} must be a string")
        if SCORED_KEY in extra and not isinstance(extra[SCORED_KEY], bool):
            raise ValueError(f"{SCORED_KEY} must be a bool")
        if forced is None:
            return
        if not isinstance(forced, list | tuple) or not all(
            isinstance(t, int) and t >= 0 for t in forced
        ):
            raise ValueError(f"{FORCED_TOKENS_KEY} must be a list of non-negative ints")

    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
        # batch row -> (forced token ids (none: a scored prompt-logprobs request), live
        # reference to the row's output token ids, the key its rows are kept under or None)
        self._rows: dict[int, tuple[list[int], list[int], str | None]] = {}
        # Processed logprobs come after the logits processors: those rows are forced after
        # sampling (force_sampled), never pinned here (vllm_config None: a unit test's).
        mode = getattr(getattr(vllm_config, "model_config", None), "logprobs_mode", None)
        self._pins = not str(mode).startswith("processed")

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if batch_update is None:
            return
        for index in batch_update.removed:
            self._rows.pop(index, None)
        for index, params, _prompt_ids, output_ids in batch_update.added:
            forced = _forced_tokens(params)
            if forced is None and not _scored(params):
                self._rows.pop(index, None)
            else:
                self._rows[index] = (forced or [], output_ids, rows.rows_key(params))
        for src, dst, direction in batch_update.moved:
            a = self._rows.pop(src, None)
            if direction == MoveDirectionality.SWAP:
                b = self._rows.pop(dst, None)
                if b is not None:
                    self._rows[src] = b
            else:
                self._rows.pop(dst, None)
            if a is not None:
                self._rows[dst] = a

    def scored_rows(self) -> list[int]:
        """The batch rows of scoring requests (forced or prompt-logprobs)."""
        return list(self._rows)

    def force_sampled(self, sampled: torch.Tensor, processed: torch.Tensor | None) -> None:
        """After vLLM's sampler computed the processed logprobs: each forced row's sampled
        token becomes its frozen one (vLLM then gathers that token's processed logprob), and
        an asked-for row's processed logprobs are kept (as the processor keeps raw rows)."""
        for index, (forced, output_ids, key) in self._rows.items():
            position = len(output_ids)
            if position >= len(forced) or index >= sampled.shape[0]:
                continue
            if key is not None and processed is not None:
                rows.keep(key, position, processed[index][None].clone())
            sampled[index] = forced[position]

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if not self._pins:
            return logits
        for index, (forced, output_ids, key) in self._rows.items():
            position = len(output_ids)
            if position >= len(forced) or index >= logits.shape[0]:
                continue
            token = forced[position]
            row = logits[index]
            if key is not None:
                rows.keep(key, position, row[None].clone())
            keep = row[token].clone()
            row.fill_(float("-inf"))
            row[token] = keep if torch.isfinite(keep) else 0.0
        return logits


FORCED_TOKENS_PROCESSOR = f"{__name__}:{ForcedTokensLogitsProcessor.__name__}"
