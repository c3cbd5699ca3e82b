"""The vLLM side's handlers of the rollout's logprobs mode and sampling (``rollout.logprobs_mode``,
``rollout.temperature``, ``rollout.top_k``, ``rollout.top_p``), each read back from what the
engine's sampler used on the scored rows (``sampling.py``, ``reads.py``).

What they mean on vLLM 0.32 (``v1/sample/sampler.py``): raw logprobs are the log-softmax of the
model's logits before any temperature, top-k/top-p or logits processor, so with them the
sampling knobs change which token vLLM would sample but no reported number; processed logprobs
are the log-softmax after the temperature and top-k/top-p (``log_softmax(z / T)``, cut to the
nucleus), what a verl rollout reports with ``logprobs_mode=processed_logprobs``. Where a value
has no meaning here it is ``unsupported`` with the reason.
"""

from __future__ import annotations

from collections.abc import Mapping

from xconf.adapters.vllm import reads
from xconf.knobs import (
    LOGP_BACKEND,
    PROCESSED_LOGPROBS,
    RAW_LOGPROBS,
    ROLLOUT_LOGPROBS_MODE,
    ROLLOUT_SCORING_MODE,
    ROLLOUT_TEMPERATURE,
    ROLLOUT_TOP_K,
    ROLLOUT_TOP_P,
)
from xconf.runtime.protocol import KnobApplication, KnobHandler, KnobRequest

# vLLM samples greedily below this temperature (sampling_params._SAMPLING_EPS).
GREEDY_BELOW = 1e-5
RAW_BEFORE = (
    "raw logprobs come before the temperature and top-k/top-p (Sampler.forward): the "
    "reported logprobs do not depend on it"
)


def _mode(request: KnobRequest) -> str:
    return str(request.knobs.get(ROLLOUT_LOGPROBS_MODE.path, RAW_LOGPROBS))


def _logprobs_mode(request: KnobRequest) -> KnobApplication:
    if request.value == RAW_LOGPROBS:
        return request.applied(
            "vLLM's raw logprobs: the log-softmax of the model's logits, before the "
            "temperature, top-k/top-p and every logits processor (Sampler.forward)"
        )
    backend = request.knobs.get(LOGP_BACKEND.path, "native")
    if backend != "native":
        return request.unsupported(
            f"an injected operator ({LOGP_BACKEND.path}={backend}) computes from the engine's "
            "raw logits rows, taken before the temperature and top-k/top-p: it has no "
            "processed logprobs to compute"
        )
    if request.knobs.get(ROLLOUT_SCORING_MODE.path) == "prefill":
        return request.unsupported(
            "vLLM 0.32 never processes prompt logprobs (_get_prompt_logprobs_dict): a "
            "prefill-scored rollout would report raw logprobs under this name"
        )
    return request.applied(
        "vLLM built with logprobs_mode=processed_logprobs: the log-softmax after its "
        "temperature and top-k/top-p; xconf forces each frozen token after the sampler "
        "computed them (adapters/vllm/sampling.py), so the forcing is not in them"
    )


def _temperature(request: KnobRequest) -> KnobApplication:
    value = float(request.value)
    if value == 0.0:
        return request.applied("greedy scoring requests (temperature 0: nothing divides)")
    if value < GREEDY_BELOW:
        return request.unsupported(
            f"vLLM samples greedily below temperature {GREEDY_BELOW}: {value} would be 0 there"
        )
    if _mode(request) == PROCESSED_LOGPROBS:
        return request.applied(
            f"scoring requests sample at temperature {value}: the processed logprobs are "
            f"log_softmax(logits / {value})"
        )
    return request.applied(f"scoring requests sample at temperature {value}; {RAW_BEFORE}")


def _nucleus(request: KnobRequest) -> KnobApplication:
    """top-k / top-p: vLLM ignores them at temperature 0 (SamplingParams resets them)."""
    off = request.value == (0 if request.spec is ROLLOUT_TOP_K else 1.0)
    name = request.path.split(".", 1)[1]
    if off:
        return request.applied(f"no {name}: every token")
    temperature = float(request.knobs.get(ROLLOUT_TEMPERATURE.path, 0.0))
    if temperature < GREEDY_BELOW:
        return request.unsupported(
            f"vLLM resets {name} for greedy requests (SamplingParams at temperature 0): set "
            f"{ROLLOUT_TEMPERATURE.path} above 0 for {name} to apply"
        )
    if _mode(request) == PROCESSED_LOGPROBS:
        return request.applied(
            f"scoring requests sample with {name}={request.value}: the processed logprobs are "
            "renormalized over the tokens it keeps (a frozen token outside them is -inf, "
            "and the case is invalid_artifact: non-finite scores)"
        )
    return request.applied(f"scoring requests sample with {name}={request.value}; {RAW_BEFORE}")


HANDLERS: Mapping[str, KnobHandler] = {
    ROLLOUT_LOGPROBS_MODE.path: KnobHandler(_logprobs_mode, reads.logprobs_mode),
    ROLLOUT_TEMPERATURE.path: KnobHandler(_temperature, reads.SAMPLED_TEMPERATURE),
    ROLLOUT_TOP_K.path: KnobHandler(_nucleus, reads.SAMPLED_TOP_K),
    ROLLOUT_TOP_P.path: KnobHandler(_nucleus, reads.SAMPLED_TOP_P),
}
