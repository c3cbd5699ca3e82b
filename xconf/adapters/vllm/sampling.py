"""The rollout's sampler as the scored requests meet it: what it used on their rows, and, for
processed logprobs, the frozen tokens forced *after* it computed them.

vLLM 0.32's ``Sampler.forward`` computes raw logprobs from the model's logits before anything
else, then runs the logits processors (xconf's forcing among them:
:mod:`~xconf.adapters.vllm.forcing`), the temperature and top-k/top-p, and computes processed
logprobs last (``Sampler.sample``). Pinning a row to its frozen token in a logits processor
leaves raw logprobs untouched but makes the forced token's processed logprob the forcing's
(0). So an engine built with ``logprobs_mode=processed_logprobs`` has the forcing processor
leave the logits alone, and this hook, wrapped around the worker's ``Sampler.sample``,
replaces each scored row's sampled token by its frozen one after ``sample`` returned the
processed logprobs: vLLM then gathers the frozen token's processed logprob (the log-softmax
of the logits divided by the temperature, cut to the top-k/top-p), and the engine emits the
frozen token (the scorer checks it).

In every mode the hook records, for each scored row the sampler met (a request carrying
:data:`SCORED_KEY`), the logprobs mode, temperature, top-k and top-p it sampled with, as
vLLM's sampling metadata held them: what the rollout's sampling knobs read back
(``reads.py``). It is installed in every worker when an engine is built (``collective_rpc``)
and imports vLLM only there.
"""

from __future__ import annotations

import functools
from typing import Any

SCORED_KEY = "xconf_scored"
# Per process (a worker's, or this one's for an in-process engine): the (logprobs mode,
# temperature, top-k, top-p) the sampler used on scored rows since the last ``forget``.
_SEEN: set[tuple[str, float, int, float]] = set()


def _decimal(value: float) -> float:
    """The shortest decimal that is the float32 vLLM holds (its temperature and top-p are
    float32): 0.7 reads back as 0.7, where ``float(float32(0.7))`` is 0.699999988. A value
    the float32 does not hold (0.70000001) reads back as another number, so it is seen.
    Called for every scored row at every step: remembered by the value's exact bits
    (``float.hex``: -0.0 is not 0.0), since numpy's formatting costs ~0.1 ms a call."""
    return _decimal_of(float(value).hex())


@functools.lru_cache(maxsize=1024)
def _decimal_of(bits: str) -> float:
    import numpy as np

    value = np.float32(float.fromhex(bits))
    return float(np.format_float_positional(value, unique=True, trim="0"))


def _forcing(metadata: Any) -> Any:
    """The batch's forced-decoding processor (None: this batch has none: a warm-up run).
    Found by what it does (``forcing.py`` imports this module's key: no import back)."""
    processors = getattr(metadata, "logitsprocs", None)
    for processor in processors.all if processors is not None else ():
        if callable(getattr(processor, "force_sampled", None)):
            return processor
    return None


def _record(forcing: Any, metadata: Any, mode: str, rows: int, vocab: int) -> None:
    temperature, top_k, top_p = metadata.temperature, metadata.top_k, metadata.top_p
    temps = None if temperature is None else temperature.tolist()  # None: every row greedy
    ks = None if top_k is None else top_k.tolist()  # vLLM: no top-k is the vocabulary size
    ps = None if top_p is None else top_p.tolist()
    for index in forcing.scored_rows():
        if index >= rows:
            continue
        k = 0 if ks is None else int(ks[index])
        _SEEN.add(
            (
                str(mode),
                0.0 if temps is None else _decimal(temps[index]),
                0 if k <= 0 or k >= vocab else k,
                1.0 if ps is None else _decimal(ps[index]),
            )
        )


def install_sampler_hook(worker: Any) -> bool:
    """Runs in every worker (``collective_rpc``) of every engine: wraps its sampler's
    ``sample`` (an instance attribute; vLLM's class is not edited)."""
    from vllm.config.model import PROCESSED_LOGPROBS_MODES

    sampler = worker.model_runner.sampler
    original = sampler.sample
    if getattr(original, "xconf_hook", False):
        return True

    def sample(logits: Any, sampling_metadata: Any, *args: Any, **kwargs: Any) -> Any:
        rows, vocab = logits.shape[0], logits.shape[-1]
        sampled, processed = original(logits, sampling_metadata, *args, **kwargs)
        forcing = _forcing(sampling_metadata)
        if forcing is None:
            return sampled, processed
        override = args[0] if args else kwargs.get("logprobs_mode_override")
        mode = override or sampler.logprobs_mode
        _record(forcing, sampling_metadata, mode, rows, vocab)
        if mode in PROCESSED_LOGPROBS_MODES:
            forcing.force_sampled(sampled, processed)
        return sampled, processed

    sample.xconf_hook = True  # type: ignore[attr-defined]
    sampler.sample = sample
    return True


def seen() -> list[tuple[str, float, int, float]]:
    """What the sampler used on scored rows since the last ``forget`` (this process)."""
    return sorted(_SEEN)


def forget(worker: Any = None) -> bool:
    """Runs in every worker (``collective_rpc``) when the engine resets: a new scored pass."""
    _SEEN.clear()
    return True
