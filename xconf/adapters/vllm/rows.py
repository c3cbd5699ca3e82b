"""Full-vocabulary logits rows as tensors, kept inside the engine for an injected operator
and for the full-vocabulary figures (``xconf/full_vocab.py``, native path included).

Asked for full-vocabulary logits (``logprobs=-1``), vLLM returns one dict of ``Logprob``
objects per scored token: 49,152 Python objects a token on the real default, 113 million
for its 2,304 tokens, then copied back into a tensor one entry at a time. Instead, a request
that names a key (``extra_args[ROWS_KEY]``) has the worker keep the rows it computed for it,
as tensors, and the scorer takes them with ``collective_rpc`` after ``generate`` (in-process
and in multiprocess TP workers alike):

- decode: the forced-decoding logits processor (:mod:`~xconf.adapters.vllm.forcing`) copies
  each asked-for row before it pins it. Its input is the sampler's ``logits.to(float32)``
  of the logits the sampler returns as raw logits in ``raw_logits`` mode (``logits.clone()``
  or ``logits.to(float32)``), bit for bit: only vLLM's builtin min-tokens and logit-bias
  processors run before it, and they leave every row of a request without those settings
  untouched.
- prefill: the model runner's prompt-logprobs step is wrapped (:func:`install_prompt_capture`,
  run in every worker when an engine is built), so each ``compute_logits`` output for an
  asked-for request is kept as ``logits.to(float32)``: the very scores vLLM gathers a
  ``raw_logits`` engine's prompt logprobs from (and a ``raw_logprobs`` engine's
  ``log_softmax``).

Every request still asks vLLM for its own token's raw logit (``logprobs=0``,
``prompt_logprobs=0``; a ``raw_logprobs`` engine: its raw logprob), and :func:`rows_checked`
compares each kept row with it bit for bit (``as_logprobs``: the row's float32
``log_softmax``, as vLLM's sampler computes it): a row kept for the wrong request or
position is a coded error, never an input to the operator or a figure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from xconf.adapters.errors import ScoringError

ROWS_KEY = "xconf_logits_rows"
# Per process (a TP worker's, or this one's for an in-process engine): key -> {first
# position: rows [n, vocab]}, and key -> why its rows could not be kept.
_KEPT: dict[str, dict[int, torch.Tensor]] = {}
_BROKEN: dict[str, str] = {}


def rows_key(params: Any) -> str | None:
    """The key a request's ``SamplingParams`` asks its rows to be kept under, if any."""
    key = (getattr(params, "extra_args", None) or {}).get(ROWS_KEY)
    return key if isinstance(key, str) else None


def keep(key: str, position: int, rows: torch.Tensor) -> None:
    """Keep ``rows`` (a copy, [n, vocab] float32) for positions ``position`` onwards."""
    _KEPT.setdefault(key, {})[position] = rows


def take_rows(worker: Any, keys: Sequence[str]) -> dict[str, Any] | None:
    """Runs in every worker (``collective_rpc``): pops the kept rows of ``keys``. Every TP rank
    computes the same all-gathered logits; only the one whose reply is read answers with
    them (TP rank 0 of a multiprocess engine, or this process's own rank under an external
    launcher), so the rows cross a process boundary once."""
    found = {k: _KEPT.pop(k, {}) for k in keys}
    broken = {k: _BROKEN.pop(k) for k in keys if k in _BROKEN}
    from vllm.distributed import parallel_state

    launched = worker.vllm_config.parallel_config.distributed_executor_backend
    if launched != "external_launcher" and parallel_state.get_tensor_model_parallel_rank() != 0:
        return None
    return {"rows": found, "broken": broken}


def install_prompt_capture(worker: Any) -> bool:
    """Runs in every worker (``collective_rpc``) of every engine: wraps the model
    runner's prompt-logprobs step so that an asked-for request's prompt rows are kept."""
    runner = worker.model_runner
    original = runner._get_prompt_logprobs_dict
    if getattr(original, "keeps_rows", False):
        return True

    def prompt_logprobs_keeping_rows(hidden_states: torch.Tensor, scheduled: Any) -> Any:
        asked: dict[int, tuple[str, int]] = {}  # row offset in hidden_states -> (key, start)
        for req_id in runner.num_prompt_logprobs:
            state = runner.requests.get(req_id)
            key = rows_key(getattr(state, "sampling_params", None))
            if key is None or req_id not in scheduled:
                continue
            index = runner.input_batch.req_id_to_index[req_id]
            offset = int(runner.query_start_loc.np[index])
            asked[offset] = (key, int(state.num_computed_tokens))
        if not asked:
            return original(hidden_states, scheduled)
        model = runner.model
        compute = model.compute_logits
        storage = hidden_states.untyped_storage().data_ptr()
        base, stride = hidden_states.storage_offset(), hidden_states.stride(0)

        def compute_logits_keeping_rows(states: torch.Tensor) -> Any:
            logits = compute(states)
            if states.untyped_storage().data_ptr() != storage:
                # Not a slice of this step's hidden states: which request it is cannot be told.
                for key, _start in asked.values():
                    _BROKEN[key] = "prompt logits computed outside this step's hidden states"
                return logits
            found = asked.get((states.storage_offset() - base) // stride)
            if found is not None:
                key, start = found
                keep(key, start, logits.to(torch.float32).clone())
            return logits

        model.compute_logits = compute_logits_keeping_rows
        try:
            return original(hidden_states, scheduled)
        finally:
            del model.compute_logits  # the class's own method again

    prompt_logprobs_keeping_rows.keeps_rows = True  # type: ignore[attr-defined]
    runner._get_prompt_logprobs_dict = prompt_logprobs_keeping_rows
    return True


def taken(engine: Any, keys: Sequence[str]) -> Mapping[str, Any]:
    """The kept rows of ``keys`` from the engine's workers: key -> ({start: rows}, broken)."""
    replies = engine.llm.collective_rpc(take_rows, args=(list(keys),))
    reply = next((r for r in replies if r is not None), None)
    if reply is None:
        raise ScoringError(
            "runtime.missing_logits", "no engine worker answered with logits rows", "rollout"
        )
    return {k: (reply["rows"].get(k, {}), reply["broken"].get(k)) for k in keys}


def rows_checked(
    kept: tuple[Mapping[int, torch.Tensor], str | None],
    targets: Sequence[int],
    reported: Sequence[float],
    where: str,
    *,
    as_logprobs: bool = False,
) -> torch.Tensor:
    """One request's kept rows as one [len(targets), vocab] tensor, each row checked against
    the raw logit vLLM reported for its target token (``reported``), bit for bit.
    ``as_logprobs``: ``reported`` are a ``raw_logprobs`` engine's raw logprobs, which its
    sampler computes as ``log_softmax(logits, dtype=float32)`` of the row kept here."""
    chunks, broken = kept
    if broken is not None:
        raise ScoringError("runtime.missing_logits", broken, where)
    position, parts = 0, []
    for start in sorted(chunks):
        if start != position:
            raise ScoringError(
                "runtime.missing_logits",
                f"engine kept logits rows from position {start}, expected {position}",
                where,
            )
        parts.append(chunks[start])
        position += chunks[start].shape[0]
    if position != len(targets):
        raise ScoringError(
            "runtime.missing_logits",
            f"engine kept {position} logits rows for {len(targets)} scored tokens",
            where,
        )
    if not parts:  # nothing scored (a one-token prefill)
        return torch.empty((0, 0), dtype=torch.float32)
    rows = torch.cat(parts) if len(parts) > 1 else parts[0]
    index = torch.tensor(targets, dtype=torch.long)
    if index.numel() and (int(index.max()) >= rows.shape[1] or int(index.min()) < 0):
        raise ScoringError(
            "runtime.missing_logits",
            f"a scored token id is outside the engine's {rows.shape[1]} logits columns",
            where,
        )
    scores = rows.log_softmax(-1, dtype=torch.float32) if as_logprobs else rows
    mine = scores.gather(1, index[:, None]).squeeze(1)
    theirs = torch.tensor(reported, dtype=torch.float32)
    same = (mine == theirs) | (mine.isnan() & theirs.isnan())
    if not bool(same.all()):
        k = int((~same).nonzero()[0])
        raise ScoringError(
            "runtime.logits_row_mismatch",
            f"the kept logits row of token {k} gives {float(mine[k])!r} for token "
            f"{targets[k]}, the engine reported {float(theirs[k])!r}",
            f"{where}[{k}]",
        )
    return rows
