"""How the vLLM side reads each rollout knob back: from the live state its engine exposes
(``state.VllmState``: its resolved config, the requests it answered, each worker's loaded
model). Each function here is one handler's ``readback`` (``handlers.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from xconf.runtime.protocol import ReadBack, ReadbackFailure, ReadbackValue

if TYPE_CHECKING:
    from xconf.adapters.vllm.state import VllmState


def from_workers(values: Callable[[dict[str, Any]], Iterable[Any]]) -> ReadBack:
    """A value only vLLM's workers can tell (their loaded model): the one value every worker
    reports (None: they disagree), or a failed read when the workers could not be read."""

    def read(live: VllmState) -> ReadbackValue:
        if live.workers is None:
            return ReadbackFailure(str(live.workers_error or "no worker state"))
        found = {v for worker in live.workers for v in values(worker)}
        return found.pop() if len(found) == 1 else None

    return read


WORKER_TP = from_workers(lambda w: (w["tp_world_size"],))
WORKER_DTYPE = from_workers(lambda w: (w.get("compute_dtype"),))
WORKER_KV_CACHE_DTYPE = from_workers(lambda w: w["kv_cache_dtypes"])
WORKER_BATCH_INVARIANT = from_workers(lambda w: (w["batch_invariant"],))


def _logits_dtype(worker: dict[str, Any]) -> tuple[str | None]:
    """``model`` where the lm_head projects in the compute dtype, ``float32`` where vLLM casts
    it up to float32 (None: no logits processor, or another dtype)."""
    head, compute = worker.get("head_dtype"), worker.get("compute_dtype")
    if head is None:
        return (None,)
    return ("model" if head == compute else ("float32" if head == "float32" else None),)


WORKER_LOGITS_DTYPE = from_workers(_logits_dtype)


def prefix_caching(live: VllmState) -> bool:
    """On only when the scored pass hit the cache: an engine configured for it that served
    no cached token measured the uncached path."""
    return bool(live.config.cache_config.enable_prefix_caching) and live.prefix_cache_hits != 0


def enforce_eager(live: VllmState) -> bool:
    return bool(live.config.model_config.enforce_eager)


def context_parallel(live: VllmState) -> int:
    return int(getattr(live.config.parallel_config, "prefill_context_parallel_size", 1))


def chunked_prefill(live: VllmState) -> bool:
    return bool(live.config.scheduler_config.enable_chunked_prefill)


def max_num_batched_tokens(live: VllmState) -> int:
    return int(live.config.scheduler_config.max_num_batched_tokens)


def rollout_scoring_mode(live: VllmState) -> str | None:
    """How the engine's last scored pass asked for logprobs (None: not scored yet)."""
    return live.scoring_mode


# The sampler hook's records (sampling.py): (logprobs mode, temperature, top-k, top-p).
_MODE, _TEMPERATURE, _TOP_K, _TOP_P = range(4)
# vLLM's mode -> the knob's value: an operator's raw logits rows give raw logprobs (vLLM's
# processed_logits: none of the knob's values).
_KNOB_MODES = {
    "raw_logprobs": "raw_logprobs",
    "raw_logits": "raw_logprobs",
    "processed_logprobs": "processed_logprobs",
}


def _sampled(field: int) -> ReadBack:
    """One field of what the sampler used on the scored pass's rows, the one value every
    worker and row saw (None: they differ), or a failed read when nothing was recorded."""

    def read(live: VllmState) -> ReadbackValue:
        if live.workers is None:
            return ReadbackFailure(str(live.workers_error or "no worker state"))
        found = {tuple(r)[field] for w in live.workers for r in w.get("sampling", ())}
        if not found:
            return ReadbackFailure("the sampler met no scored request (nothing scored yet)")
        return found.pop() if len(found) == 1 else None

    return read


_SAMPLER_MODE = _sampled(_MODE)


def logprobs_mode(live: VllmState) -> ReadbackValue:
    """The mode the sampler computed the scored rows' logprobs in (prompt logprobs are raw
    in every mode, and a processed engine refuses to score them)."""
    mode = _SAMPLER_MODE(live)
    if not isinstance(mode, str):
        return mode
    return _KNOB_MODES.get(mode)


SAMPLED_TEMPERATURE = _sampled(_TEMPERATURE)
SAMPLED_TOP_K = _sampled(_TOP_K)
SAMPLED_TOP_P = _sampled(_TOP_P)


def weight_sync(live: VllmState) -> ReadbackValue:
    """``load`` where no sync ran; ``reload`` only where every worker's every parameter and
    buffer equals the reference's after the sync (``weight_sync.py``); otherwise what the
    engine holds, naming the stale tensors: a sync that left one stale is never read back as
    done.

    That value is not the request, so the knob is a fallback (the engine was sent the weights
    and holds others: read, not unreadable): under strict execution the case is an ``error``
    naming the tensors; without it the case is judged, marked "intervention not applied", and
    its figures are the drift the stale tensors cause, never evidence the sync is harmless."""
    from xconf.knobs import WEIGHT_SYNC_LOAD, WEIGHT_SYNC_RELOAD

    sync = live.weight_sync
    if sync is None:
        return WEIGHT_SYNC_LOAD
    if sync.stale:
        shown = ", ".join(sync.stale[:8]) + (" ..." if len(sync.stale) > 8 else "")
        return (
            f"{WEIGHT_SYNC_RELOAD} leaving {len(sync.stale)} tensor(s) stale (live != the "
            f"weights as sent, loaded from disk): {shown}"
        )
    return WEIGHT_SYNC_RELOAD


def weight_sync_dtype(live: VllmState) -> ReadbackValue:
    """The dtype the weights travelled in, read from the files: the sent file's after a sync,
    the checkpoint's own under ``load`` (a bfloat16 request then reads back float32 from a
    float32 checkpoint: a fallback, never applied)."""
    return live.checkpoint_dtype if live.weight_sync is None else live.weight_sync.dtype
