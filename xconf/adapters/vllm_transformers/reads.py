"""How vllm_hf and hf_pair read each knob back: from the live state their engines expose.

The rollout side is vLLM (``adapters/vllm/state.VllmState``: its resolved config, the
requests it answered, each worker's loaded model); the training side, and hf_pair's
reference scorer, is the transformers scorer (``adapters/hf/scorer.ScorerState``: its model
as it is now and the forwards it ran). Each function here is one handler's ``readback``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from xconf.runtime.protocol import ReadBack, ReadbackFailure, ReadbackValue

if TYPE_CHECKING:
    from xconf.adapters.hf.scorer import ScorerState
    from xconf.adapters.vllm.state import VllmState


# -- rollout: vLLM ---------------------------------------------------------------------------
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


# -- training (and hf_pair's reference): the transformers scorer ---------------------------
def attention(live: ScorerState) -> str:
    return live.model.attention


def compute_dtype(live: ScorerState) -> str | None:
    """The parameters' one dtype (None: mixed dtypes, not one observable value)."""
    dtypes = live.model.param_dtypes
    return dtypes[0] if len(dtypes) == 1 else None


def sharding(live: ScorerState) -> str:
    return live.model.sharding


def param_dtype(live: ScorerState) -> str:
    return live.model.policy[0]


def reduce_dtype(live: ScorerState) -> str:
    return live.model.policy[1]


def remove_padding(live: ScorerState) -> bool | None:
    """What the forwards really were: one packed row per request, or a padded batch (None:
    both, or none ran)."""
    kinds = set(live.layouts)
    return (kinds.pop() == "packed") if len(kinds) == 1 else None


def unsharded_ranks(live: ScorerState) -> int | None:
    """One rank when the scorer is one unsharded module (hf_pair's reference TP)."""
    return 1 if live.model.sharding == "unsharded" else None
