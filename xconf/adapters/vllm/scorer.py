"""Rollout-side scoring of frozen tokens on vLLM's own path, and the baseline freeze.

Modes (part of the identity):

- ``decode``: forced decoding of the frozen response through the engine's decode path
  (:mod:`xconf.adapters.vllm.forcing`), reporting vLLM's raw logprob of each forced token
  (an engine built for processed logprobs: its processed logprob, the token forced after
  the sampler: :mod:`xconf.adapters.vllm.sampling`).
- ``prefill``: the whole frozen sequence as a prompt, scored with ``prompt_logprobs``
  (raw: vLLM 0.32 never processes prompt logprobs, so a processed engine is refused).

Every scoring request samples with the engine's ``temperature``, ``top_k`` and ``top_p``
(``rollout.temperature`` ...; 0: greedy) and carries ``SCORED_KEY``, so the sampler hook
records what it used on its rows.

``batch_size`` chunks the frozen samples into ``generate`` calls of that many requests.
With an injected selected-logprob operator the engine must have been built with
``logprobs_mode="raw_logits"``; the operator then computes the selected logprob from the
engine's own full-vocabulary logits rows, which the engine keeps as tensors for the
requests that ask (:mod:`xconf.adapters.vllm.rows`), each checked against the raw logit the
engine reports for its token.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from xconf.adapters.errors import IdentityViolationError, ScoringError, UnsupportedKnobError
from xconf.adapters.frozen import (
    DEFAULT_PROMPTS,
    FrozenBatch,
    FrozenSample,
    VocabRows,
    assemble_scores,
)
from xconf.adapters.vllm import rows as logits_rows
from xconf.adapters.vllm.engine import VllmRolloutEngine
from xconf.adapters.vllm.sampling import SCORED_KEY
from xconf.knobs import LOGP_BACKEND, PROCESSED_LOGPROBS, ROLLOUT_LOGPROBS_MODE

ROLLOUT_MODES: tuple[str, ...] = ("decode", "prefill")
FORCED_TOKENS_KEY = "xconf_forced_tokens"  # same key as xconf.adapters.vllm.forcing
SelectedLogprobOp = Callable[[Any, Any, Any], Any]


def generate_responses(
    engine: VllmRolloutEngine,
    prompts: Sequence[str] = DEFAULT_PROMPTS,
    *,
    response_len: int = 12,
    seed: int = 20260101,
    temperature: float = 1.0,
) -> FrozenBatch:
    """The baseline rollout: seeded sampling of ``response_len`` tokens per prompt."""
    from vllm import SamplingParams

    tok = engine.tokenizer
    prompt_ids = [list(tok(p, add_special_tokens=False)["input_ids"]) for p in prompts]
    params = [
        SamplingParams(
            max_tokens=response_len,
            temperature=temperature,
            seed=seed + i,
            ignore_eos=True,
            detokenize=False,
        )
        for i in range(len(prompts))
    ]
    outs = engine.llm.generate(
        [{"prompt_token_ids": ids} for ids in prompt_ids], params, use_tqdm=False
    )
    samples = []
    for ids, out in zip(prompt_ids, outs, strict=True):
        resp = tuple(int(t) for t in out.outputs[0].token_ids)
        if len(resp) != response_len:
            raise ScoringError(
                "runtime.short_response",
                f"generated {len(resp)} of {response_len} tokens",
                "identity.recipe.response_len",
            )
        samples.append(FrozenSample(tuple(ids), resp))
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    return FrozenBatch(tuple(samples), int(pad))


def _entry_value(entry: dict[int, Any] | None, token: int, where: str) -> float:
    if not entry or token not in entry:
        raise ScoringError(
            "runtime.missing_logprob", f"engine returned nothing for token {token}", where
        )
    return float(entry[token].logprob)


def _select(
    entries: list[dict[int, Any] | None],
    targets: list[int],
    op: SelectedLogprobOp | None,
    where: str,
    kept: Any = None,
    processed: bool = False,
) -> tuple[list[float], Any]:
    """The selected logprobs and the request's logits rows ([targets, vocab]; None: none
    kept). Native: the engine's raw logprob (``processed``: its processed one, and the rows
    kept are its processed logprobs). Operator: op over the engine's full logits rows
    (``kept``: the rows the engine kept for this request, checked against ``entries``, the
    raw logit it reported for each target)."""
    reported = [
        _entry_value(e, t, f"{where}[{k}]")
        for k, (e, t) in enumerate(zip(entries, targets, strict=True))
    ]
    if op is None:
        if kept is None:
            return reported, None
        if processed:  # the processed logprobs rows themselves, each entry the one reported
            return reported, logits_rows.rows_checked(kept, targets, reported, where)
        return reported, _native_rows(kept, targets, reported, where)
    import torch

    logits = logits_rows.rows_checked(kept, targets, reported, where)
    target = torch.tensor(targets, dtype=torch.long)
    out = op(logits, target, torch.ones(len(targets), dtype=torch.bool))
    if (
        not isinstance(out, torch.Tensor)
        or out.dtype != torch.float32
        or tuple(out.shape) != (len(targets),)
    ):
        raise ScoringError(
            "runtime.operator_output", "operator must return float32 [N]", LOGP_BACKEND.path
        )
    return out.tolist(), logits


def _native_rows(kept: Any, targets: list[int], reported: list[float], where: str) -> Any:
    """The rows a ``raw_logprobs`` engine kept (its logits as the sampler saw them), each
    checked against the raw logprob it reported: vLLM's ``log_softmax(logits, float32)`` of
    the same row gives the very bits."""
    return logits_rows.rows_checked(kept, targets, reported, where, as_logprobs=True)


@contextmanager
def _kept_rows(
    engine: VllmRolloutEngine, n: int, asks: bool
) -> Iterator[tuple[list[dict[str, str]], dict[str, Any]]]:
    """Each request's ``extra_args`` asking the engine to keep its logits rows (``asks``: an
    operator computes from them, or the caller collects them), and, once the block's
    ``generate`` is done, what the engine kept: taken from the workers even when ``generate``
    failed, so no rows outlive their requests."""
    keys = [f"{uuid.uuid4().hex}:{i}" for i in range(n)] if asks else []
    extra = [{logits_rows.ROWS_KEY: k} for k in keys] or [{} for _ in range(n)]
    kept: dict[str, Any] = {"keys": keys}
    try:
        yield extra, kept
    except BaseException:
        if keys:  # dropped; the error that stopped generate is the one to see
            with contextlib.suppress(Exception):
                logits_rows.taken(engine, keys)
        raise
    if keys:
        kept.update(logits_rows.taken(engine, keys))


def _score_decode(
    engine: VllmRolloutEngine,
    samples: list[FrozenSample],
    op: SelectedLogprobOp | None,
    rows: Callable[[int, list[int], Any], None] | None = None,
) -> list[dict[int, float]]:
    from vllm import SamplingParams

    with _kept_rows(engine, len(samples), op is not None or rows is not None) as (extra, kept):
        params = [
            SamplingParams(
                max_tokens=len(s.response_ids),
                logprobs=0,  # the emitted (forced) token's raw (processed) logprob, or raw logit
                ignore_eos=True,
                detokenize=False,
                extra_args={FORCED_TOKENS_KEY: list(s.response_ids), SCORED_KEY: True, **more},
                **_sampling(engine),
            )
            for s, more in zip(samples, extra, strict=True)
        ]
        outs = engine.llm.generate(
            [{"prompt_token_ids": list(s.prompt_ids)} for s in samples], params, use_tqdm=False
        )
    engine.note_request(len(outs), _cached(outs))
    result = []
    for i, (s, out) in enumerate(zip(samples, outs, strict=True)):
        comp = out.outputs[0]
        got = tuple(int(t) for t in comp.token_ids)
        if got != s.response_ids:
            raise IdentityViolationError(
                "identity.forced_decoding_diverged",
                f"engine emitted {list(got)} instead of the frozen {list(s.response_ids)}",
                "identity.token_ids",
            )
        if comp.logprobs is None or len(comp.logprobs) != len(got):
            raise ScoringError(
                "runtime.missing_logprob", "decode returned no per-token logprobs", "rollout"
            )
        processed = engine.cfg.logprobs_mode == PROCESSED_LOGPROBS
        values, logits = _select(
            list(comp.logprobs), list(got), op, "rollout.decode", _of(kept, i), processed
        )
        base = len(s.prompt_ids) - 1
        if rows is not None:
            rows(i, [base + k for k in range(len(values))], logits)
        result.append({base + k: v for k, v in enumerate(values)})
    return result


def _score_prefill(
    engine: VllmRolloutEngine,
    samples: list[FrozenSample],
    op: SelectedLogprobOp | None,
    rows: Callable[[int, list[int], Any], None] | None = None,
) -> list[dict[int, float]]:
    from vllm import SamplingParams

    with _kept_rows(engine, len(samples), op is not None or rows is not None) as (extra, kept):
        # prompt_logprobs=0: each prompt token's own raw logprob, or raw logit
        params = [
            SamplingParams(
                max_tokens=1,
                prompt_logprobs=0,
                detokenize=False,
                extra_args={SCORED_KEY: True, **more},
                **_sampling(engine),
            )
            for more in extra
        ]
        outs = engine.llm.generate(
            [{"prompt_token_ids": list(s.token_ids)} for s in samples], params, use_tqdm=False
        )
    engine.note_request(len(outs), _cached(outs))
    result = []
    for i, (s, out) in enumerate(zip(samples, outs, strict=True)):
        plp = out.prompt_logprobs
        if plp is None or len(plp) != s.length:
            raise ScoringError(
                "runtime.missing_logprob", "prefill returned no prompt logprobs", "rollout"
            )
        ids = s.token_ids
        values, logits = _select(list(plp[1:]), list(ids[1:]), op, "rollout.prefill", _of(kept, i))
        if rows is not None:
            rows(i, list(range(len(values))), logits)
        result.append(dict(enumerate(values)))
    return result


def score_frozen(
    engine: VllmRolloutEngine,
    batch: FrozenBatch,
    mode: str,
    batch_size: int,
    op: SelectedLogprobOp | None = None,
    vocab_rows: VocabRows | None = None,
) -> Any:
    """Score every frozen sample in requests of ``batch_size``: float32 [B, T], core layout.
    ``vocab_rows``: where each scored token's logits row is kept (None: the engine keeps
    rows only for an operator)."""
    if mode not in ROLLOUT_MODES:
        raise ScoringError(
            "runtime.unsupported_mode",
            f"rollout mode {mode!r} not in {ROLLOUT_MODES}",
            "identity.scoring_mode",
        )
    if engine.closed:
        raise ScoringError(
            "runtime.engine_closed",
            "this engine was closed (building another in-process engine closes the previous one)",
            "runtime.rollout",
        )
    if mode == "prefill" and engine.cfg.logprobs_mode == PROCESSED_LOGPROBS:
        raise UnsupportedKnobError(
            "unsupported_value",
            "vLLM 0.32 never processes prompt logprobs (_get_prompt_logprobs_dict: processed "
            "and raw yield the same scores): a prefill-scored rollout reports raw logprobs",
            ROLLOUT_LOGPROBS_MODE.path,
        )
    if (op is None) == (engine.cfg.logprobs_mode == "raw_logits"):
        raise ScoringError(
            "runtime.operator_engine_mismatch",
            f"engine built with logprobs_mode={engine.cfg.logprobs_mode} cannot serve "
            f"{'an injected operator' if op is not None else 'the native path'}",
            LOGP_BACKEND.path,
        )
    scorer = _score_decode if mode == "decode" else _score_prefill
    # Engine state never carries over between cases: results must not depend on case order.
    engine.reset_state()
    if engine.cfg.enable_prefix_caching:
        # The measured prefix-caching path: a warm-up pass fills the cache, the scored pass
        # below hits it; the hits it reports are the evidence that caching was exercised.
        for chunk in batch.chunks(batch_size):
            samples = [batch.samples[i] for i in chunk]
            if mode == "decode" and WARM_BY_PROMPTS and _prompts_fill_alike(engine, samples):
                _warm_prompts(engine, samples)
            else:
                scorer(engine, samples, op)  # rows: the scored pass's
        engine.request_sizes = []
        engine.prefix_cache_hits = None
    engine.last_batch_size = batch_size
    engine.last_scoring_mode = mode
    per_sample: list[dict[int, float]] = [{} for _ in batch.samples]
    for chunk in batch.chunks(batch_size):
        keep = None if vocab_rows is None else _keeper(vocab_rows, chunk)
        scored = scorer(engine, [batch.samples[i] for i in chunk], op, keep)
        for i, positions in zip(chunk, scored, strict=True):
            per_sample[i] = positions
    return assemble_scores(batch, per_sample, side="rollout")


def _sampling(engine: VllmRolloutEngine) -> dict[str, Any]:
    """The sampling every scoring request asks with (the engine's rollout knobs)."""
    cfg = engine.cfg
    return {"temperature": cfg.temperature, "top_k": cfg.top_k, "top_p": cfg.top_p}


# The decode warm-up by the prompts alone where that leaves the cache as the whole forced
# decode does (:func:`_prompts_fill_alike`); False: always the whole forced decode.
WARM_BY_PROMPTS = True


def _prompts_fill_alike(engine: VllmRolloutEngine, samples: list[FrozenSample]) -> bool:
    """Whether a one-token request per prompt leaves the prefix cache exactly as the forced
    decode of the whole responses does: the block's prompts are prefilled in one step (they
    fit the step's token budget and sequence limit), and no sample's whole sequence reaches a block
    beyond its prompt's last, so both allocate the same blocks in the same order
    and compute every cached (full prompt) block's KV in the same step. Decode blocks are
    never a scored prompt's hit (a decode-mode request's prompt is the prompt alone)."""
    config = engine.llm.llm_engine.vllm_config
    block = int(config.cache_config.block_size)
    sched = config.scheduler_config
    fits = sum(len(s.prompt_ids) for s in samples) <= int(sched.max_num_batched_tokens)
    if not fits or len(samples) > int(sched.max_num_seqs):
        return False

    def blocks(n: int) -> int:
        return -(-n // block)

    return all(
        blocks(len(s.prompt_ids) + len(s.response_ids)) == blocks(len(s.prompt_ids))
        for s in samples
    )


def _warm_prompts(engine: VllmRolloutEngine, samples: list[FrozenSample]) -> None:
    """Fill the prefix cache with the block's prompts: one prefill step, one token each."""
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True, detokenize=False)
    engine.llm.generate(
        [{"prompt_token_ids": list(s.prompt_ids)} for s in samples],
        [params] * len(samples),
        use_tqdm=False,
    )


def _keeper(vocab_rows: VocabRows, chunk: list[int]) -> Callable[[int, list[int], Any], None]:
    """Keeps the rows of a block's ``i``-th request as those of sample ``chunk[i]``."""

    def keep(i: int, positions: list[int], rows: Any) -> None:
        vocab_rows.keep(chunk[i], positions, rows)

    return keep


def _cached(outs: Any) -> int:
    """Prompt tokens the engine served from its prefix cache for these requests."""
    return sum(int(getattr(out, "num_cached_tokens", 0) or 0) for out in outs)


def _of(kept: dict[str, Any], i: int) -> Any:
    """What the engine kept for the ``i``-th request of a block (None: nothing was asked)."""
    keys = kept["keys"]
    return kept[keys[i]] if keys else None
