"""Training scoring through the forwards the arms and the decode mode install.

Two shapes (``training.scoring_mode``):

- ``full``: one teacher-forced forward per request, as the plain scorer runs it (a padded
  batch, or one packed row with ``training.remove_padding``).
- ``decode``: the rollout engine's step shapes. The first forward of a request holds every
  prompt (packed one after the other as vLLM's scheduler batches them, or right-padded with
  ``remove_padding=false``), each later forward one frozen response token per sample, every
  token attending over its sample's KV cache. The logits of a step are computed only for the
  rows it scores, as vLLM computes them only for the rows it samples (a full forward computes
  them at every position, as the plain scorer does, through the model's own forward).

The frozen tokens are fed, never sampled; the model's parameters are never touched (the
plain scorer's read-only guard wraps every call).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from xconf.adapters.frozen import FrozenSample
from xconf.adapters.hf.align import kernels
from xconf.adapters.hf.align.step import RequestCaches, Step, VllmPaged, WholeBatch, entered
from xconf.adapters.hf.layout import lay_out

Select = Callable[[Any, Any, Any], Any]  # (logits [N, V], targets [N], active [N]) -> [N]


@dataclass(frozen=True)
class ChunkScore:
    values: list[dict[int, float]]  # per sample of the request: token offset -> logprob
    forward_tokens: tuple[int, ...]  # tokens each forward computed (its GEMM M dimension)


@dataclass(frozen=True)
class Shaping:
    """How a scorer whose model carries installed forwards scores a request."""

    kinds: frozenset[str]  # the arms installed
    decode: bool

    def chunk(
        self,
        model: Any,
        samples: Sequence[FrozenSample],
        pad_token_id: int,
        select: Select,
        native: bool,
        packed: bool,
    ) -> ChunkScore:
        import contextlib

        with kernels.ir_priority() if self.kinds else contextlib.nullcontext():
            if self.decode:
                return self._decode(model, samples, pad_token_id, select, native, packed)
            return self._full(model, samples, pad_token_id, select, native, packed)

    # -- pieces ------------------------------------------------------------------------------
    def _core(self, model: Any, samples: Sequence[FrozenSample]) -> Any:
        attention = model.get_decoder().layers[0].self_attn
        implementation = str(model.config._attn_implementation)
        if "attention" in self.kinds:
            config = model.config
            paged = kernels.PagedAttention(
                len(model.get_decoder().layers),
                int(config.num_attention_heads),
                int(config.num_key_value_heads),
                int(attention.head_dim),
                [s.length for s in samples],
                next(model.parameters()).dtype,
            )
            return VllmPaged(paged)
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        eager = sys.modules[type(attention).__module__].eager_attention_forward
        function = ALL_ATTENTION_FUNCTIONS.get_interface(implementation, eager)
        return RequestCaches(function, implementation) if self.decode else WholeBatch(function)

    def _forward(
        self,
        model: Any,
        step: Step,
        ids: Any,
        mask: Any,
        whole: bool,
        samples: Sequence[FrozenSample],
    ) -> Any:
        """One step: the model's own forward and its logits [B, T, V] (``whole``: a full
        forward, as the plain scorer calls it), or the decoder's hidden states [B, T, H];
        request ``r`` of the step is ``samples[step.requests[r]]``. Under the attention arm
        a full forward's attention is computed in the rollout engine's steps
        (``PagedAttention.begin_rollout_steps``): vLLM's CPU scheduler splits a query's keys
        by the step it is in, so one prefill of the whole sequence gives some rows other bits
        than the decode steps the rollout ran."""
        if isinstance(step.attention, VllmPaged):
            paged = step.attention.paged
            if whole:
                paged.begin_rollout_steps(
                    [len(samples[r].prompt_ids) for r in step.requests],
                    [len(samples[r].response_ids) for r in step.requests],
                    step.requests,
                )
            else:
                paged.begin_step(step.counts, step.requests)
        run = model if whole else model.get_decoder()
        with entered(step):
            out = run(
                input_ids=ids, attention_mask=mask, position_ids=step.positions, use_cache=False
            )
        return out.logits if whole else out.last_hidden_state

    def _logprobs(self, logits: Any, targets: Any, select: Select, native: bool) -> Any:
        """Selected logprobs of ``logits`` [N, V]: vLLM's raw logprobs under the logits arm
        with the native operator, else the operator (native: fp32 log_softmax)."""
        import torch

        if native and "logits" in self.kinds:
            return kernels.compute_logprobs(logits).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        return select(logits, targets, torch.ones(targets.shape[0], dtype=torch.bool))

    # -- full: one teacher-forced forward per request -----------------------------------------
    def _full(
        self,
        model: Any,
        samples: Sequence[FrozenSample],
        pad: int,
        select: Select,
        native: bool,
        packed: bool,
    ) -> ChunkScore:
        import torch

        lengths = [s.length for s in samples]
        laid = lay_out([s.token_ids for s in samples], pad, packed)
        rows, cols = laid.rows, laid.cols
        core = self._core(model, samples)
        step = Step(laid.positions, rows, cols, tuple(lengths), core, tuple(range(len(samples))))
        logits = self._forward(model, step, laid.ids, laid.mask, True, samples)
        # the response positions: column c + t predicts token t + 1 of its sample
        where = [
            (r, t)
            for r, s in enumerate(samples)
            for t in range(len(s.prompt_ids) - 1, s.length - 1)
        ]
        row_index = torch.tensor([rows[r] for r, _ in where])
        col_index = torch.tensor([cols[r] + t for r, t in where])
        targets = torch.tensor([samples[r].token_ids[t + 1] for r, t in where])
        # the head over every position, as the plain scorer runs it (vLLM's under the arm)
        selected = self._logprobs(logits[row_index, col_index], targets, select, native)
        values: list[dict[int, float]] = [{} for _ in samples]
        for (r, t), v in zip(where, selected.tolist(), strict=True):
            values[r][t] = float(v)
        return ChunkScore(values, (int(laid.ids.numel()),))

    # -- decode: the rollout engine's steps ----------------------------------------------------
    def _decode(
        self,
        model: Any,
        samples: Sequence[FrozenSample],
        pad: int,
        select: Select,
        native: bool,
        packed: bool,
    ) -> ChunkScore:
        import torch

        core = self._core(model, samples)
        prompts = [len(s.prompt_ids) for s in samples]
        n = len(samples)
        # vLLM's prefill: every prompt back to back in one row (or right-padded rows)
        laid = lay_out([s.prompt_ids for s in samples], pad, packed)
        ids, positions, rows, cols = laid.ids, laid.positions, laid.rows, laid.cols
        step = Step(positions, rows, cols, tuple(prompts), core, tuple(range(n)))
        last = [c + p - 1 for c, p in zip(cols, prompts, strict=True)]
        values: list[dict[int, float]] = [{} for _ in samples]
        tokens: list[int] = []
        for k in range(max(len(s.response_ids) for s in samples)):
            hidden = self._forward(model, step, ids, None, False, samples)
            tokens.append(int(ids.numel()))
            live = step.requests  # the samples this step scored, in the step's row order
            targets = torch.tensor([samples[r].response_ids[k] for r in live])
            # the logits of the rows this step scores only, as vLLM computes them
            head = model.get_output_embeddings()(hidden[torch.tensor(rows), torch.tensor(last)])
            selected = self._logprobs(head, targets, select, native)
            for r, v in zip(live, selected.tolist(), strict=True):
                values[r][prompts[r] - 1 + k] = float(v)
            # a sample whose response ends here leaves the batch, as a finished request does
            going = [i for i, r in enumerate(live) if k + 1 < len(samples[r].response_ids)]
            if not going:
                break
            fed = targets[going]
            m = len(going)
            ids = fed.view(1, m) if packed else fed.view(m, 1)
            positions = torch.tensor([prompts[live[i]] + k for i in going]).view(ids.shape)
            rows, cols = ((0,) * m, tuple(range(m))) if packed else (tuple(range(m)), (0,) * m)
            last = list(cols)
            step = Step(positions, rows, cols, (1,) * m, core, tuple(live[i] for i in going))
        return ChunkScore(values, tuple(tokens))
