"""Rollout-side scoring of frozen tokens on vLLM's own path, and the baseline freeze.

Modes (part of the identity):

- ``decode``: forced decoding of the frozen response through the engine's decode path
  (:mod:`xconf.adapters.vllm.forcing`), reporting vLLM's raw logprob of each forced token.
- ``prefill``: the whole frozen sequence as a prompt, scored with ``prompt_logprobs``.

``batch_size`` chunks the frozen samples into ``generate`` calls of that many requests.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from xconf.adapters.errors import IdentityViolationError, ScoringError
from xconf.adapters.frozen import (
    DEFAULT_PROMPTS,
    FrozenIdentity,
    FrozenSample,
    ScoreBatch,
    assemble_scores,
)
from xconf.adapters.vllm.engine import VllmRolloutEngine

RolloutMode = Literal["decode", "prefill"]
ROLLOUT_MODES: tuple[str, ...] = ("decode", "prefill")
FORCED_TOKENS_KEY = "xconf_forced_tokens"  # same key as xconf.adapters.vllm.forcing


def freeze_identity(
    engine: VllmRolloutEngine,
    *,
    checkpoint_id: str,
    model_version: str,
    tokenizer_id: str,
    prompts: Sequence[str] = DEFAULT_PROMPTS,
    response_len: int = 12,
    seed: int = 20260101,
    temperature: float = 1.0,
) -> FrozenIdentity:
    """Generate the baseline responses once (seeded sampling) and freeze everything."""
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
                "short_response", f"generated {len(resp)} of {response_len} tokens",
                "identity.response_token_ids",
            )
        samples.append(FrozenSample(tuple(ids), resp))
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    return FrozenIdentity(
        samples=tuple(samples),
        checkpoint_id=checkpoint_id,
        model_version=model_version,
        tokenizer_id=tokenizer_id,
        pad_token_id=int(pad),
        prompts=tuple(prompts),
        generation={
            "engine": "vllm",
            "engine_fingerprint": engine.cfg.fingerprint(),
            "dtype": engine.cfg.dtype,
            "seed": seed,
            "temperature": temperature,
            "response_len": response_len,
        },
    )


def _lp(entry: dict[int, Any] | None, token: int, where: str) -> float:
    if not entry or token not in entry:
        raise ScoringError("missing_logprob", f"engine returned no logprob for token {token}", where)
    return float(entry[token].logprob)


def _score_decode(engine: VllmRolloutEngine, samples: list[FrozenSample]) -> list[dict[int, float]]:
    from vllm import SamplingParams

    params = [
        SamplingParams(
            max_tokens=len(s.response_ids),
            temperature=0.0,
            logprobs=0,
            ignore_eos=True,
            detokenize=False,
            extra_args={FORCED_TOKENS_KEY: list(s.response_ids)},
        )
        for s in samples
    ]
    outs = engine.llm.generate(
        [{"prompt_token_ids": list(s.prompt_ids)} for s in samples], params, use_tqdm=False
    )
    result = []
    for s, out in zip(samples, outs, strict=True):
        comp = out.outputs[0]
        got = tuple(int(t) for t in comp.token_ids)
        if got != s.response_ids:
            raise IdentityViolationError(
                "forced_decoding_diverged",
                f"engine emitted {list(got)} instead of the frozen {list(s.response_ids)}",
                "identity.response_token_ids",
            )
        if comp.logprobs is None or len(comp.logprobs) != len(got):
            raise ScoringError("missing_logprob", "decode returned no per-token logprobs", "rollout")
        base = len(s.prompt_ids)
        result.append(
            {base + k: _lp(comp.logprobs[k], tok, f"rollout.decode[{k}]") for k, tok in enumerate(got)}
        )
    return result


def _score_prefill(engine: VllmRolloutEngine, samples: list[FrozenSample]) -> list[dict[int, float]]:
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0, detokenize=False)
    outs = engine.llm.generate(
        [{"prompt_token_ids": list(s.token_ids)} for s in samples], params, use_tqdm=False
    )
    result = []
    for s, out in zip(samples, outs, strict=True):
        plp = out.prompt_logprobs
        if plp is None or len(plp) != s.length:
            raise ScoringError("missing_logprob", "prefill returned no prompt logprobs", "rollout")
        ids = s.token_ids
        result.append({t: _lp(plp[t], ids[t], f"rollout.prefill[{t}]") for t in range(1, s.length)})
    return result


def score_frozen(
    engine: VllmRolloutEngine, identity: FrozenIdentity, mode: str, batch_size: int
) -> ScoreBatch:
    """Score every frozen sample in requests of ``batch_size``; returns the aligned layout."""
    if mode not in ROLLOUT_MODES:
        raise ScoringError("unsupported_mode", f"rollout mode {mode!r} not in {ROLLOUT_MODES}", "rollout.mode")
    scorer = _score_decode if mode == "decode" else _score_prefill
    per_sample: list[dict[int, float]] = [{} for _ in identity.samples]
    for chunk in identity.chunks(batch_size):
        scored = scorer(engine, [identity.samples[i] for i in chunk])
        for i, positions in zip(chunk, scored, strict=True):
            per_sample[i] = positions
    return assemble_scores(identity, per_sample, side="rollout", mode=mode)
