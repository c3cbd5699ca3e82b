"""The `hf_pair` runtime (S1): an unsharded transformers reference scorer on the rollout
side against the transformers training scorer (unsharded, or FSDP2 under a launcher).

Rollout knobs map onto the reference scorer truthfully: ``rollout.dtype`` is its compute
dtype; prefix caching, graph mode, tensor and context parallelism do not exist in a
teacher-forced reference pass and are reported ``unsupported`` when requested.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar

from xconf.adapters.vllm_transformers.adapter import ADAPTER_VERSION, VllmHfRuntime
from xconf.adapters.vllm_transformers.delegating import Delegating
from xconf.adapters.vllm_transformers.handlers import HANDLERS as VLLM_HF_HANDLERS
from xconf.adapters.vllm_transformers.placement import process_group_context
from xconf.experiment import Identity
from xconf.knobs import (
    BATCH_SIZE,
    KNOBS,
    ROLLOUT_BATCH_INVARIANT,
    ROLLOUT_CONTEXT_PARALLEL_SIZE,
    ROLLOUT_DTYPE,
    ROLLOUT_ENABLE_CHUNKED_PREFILL,
    ROLLOUT_ENABLE_PREFIX_CACHING,
    ROLLOUT_ENFORCE_EAGER,
    ROLLOUT_KV_CACHE_DTYPE,
    ROLLOUT_MAX_NUM_BATCHED_TOKENS,
    ROLLOUT_TENSOR_PARALLEL_SIZE,
    TRAINING_ATTENTION_BACKEND,
    TRAINING_COMPUTE_DTYPE,
    TRAINING_SHARDING,
    KnobValue,
)
from xconf.runtime.protocol import (
    CHUNKED_REQUESTS,
    Engine,
    Handlers,
    KnobApplication,
    KnobHandler,
    KnobRequest,
    ReadBack,
    ReadbackValue,
    RuntimeView,
    SideBinding,
)
from xconf.runtime.readback import (
    ROLLOUT_ATTENTION_BACKEND,
    ROLLOUT_VOCAB_LAYOUT,
    ROLLOUT_WORLD_SIZE,
    TRAINING_VOCAB_LAYOUT,
    TRAINING_WORLD_SIZE,
)

if TYPE_CHECKING:
    from xconf.execution_plan import ExecutionCase


def _fixed(allowed: KnobValue | None, why: str, reads: ReadBack | None) -> KnobHandler:
    """A rollout setting the reference scorer has exactly one value of (``allowed``; None:
    none at all): that value is applied, any other is unsupported with ``why``."""

    def materialize(request: KnobRequest) -> KnobApplication:
        if request.value == allowed:
            return request.applied(f"fixed by the reference scorer: {why}")
        return request.unsupported(why)

    return KnobHandler(materialize, reads)


def _constant(value: KnobValue) -> ReadBack:
    return lambda live: value


def _reads(name: str) -> ReadBack:
    """The reference scorer's own reading ``name`` (a training-side name)."""
    return lambda live: live.get(name)


def _unsharded(live: Mapping[str, ReadbackValue]) -> ReadbackValue:
    return 1 if live.get(TRAINING_SHARDING.path) == "unsharded" else None


NO_KV_CACHE = "a teacher-forced reference pass has no KV cache"
# The rollout side is the reference scorer, never vLLM: only these rollout settings exist,
# each read back from the reference's own state (use_cache=False on every forward, eager
# forwards, one unsharded module).
REFERENCE: Mapping[str, KnobHandler] = {
    ROLLOUT_DTYPE.path: KnobHandler(
        lambda request: request.applied("reference scorer compute dtype"),
        _reads(TRAINING_COMPUTE_DTYPE.path),
    ),
    ROLLOUT_ENABLE_PREFIX_CACHING.path: _fixed(False, NO_KV_CACHE, _constant(False)),
    ROLLOUT_ENFORCE_EAGER.path: _fixed(
        True, "the reference scorer has no graph/compiled mode", _constant(True)
    ),
    ROLLOUT_TENSOR_PARALLEL_SIZE.path: _fixed(
        1, "vocab-parallel TP needs the vocab-parallel operator", _unsharded
    ),
    ROLLOUT_CONTEXT_PARALLEL_SIZE.path: _fixed(
        1, "no context parallelism in the reference scorer", _constant(1)
    ),
    ROLLOUT_KV_CACHE_DTYPE.path: _fixed("auto", NO_KV_CACHE, _constant("auto")),
    ROLLOUT_ENABLE_CHUNKED_PREFILL.path: _fixed(
        False, "the reference scores each request in one pass", _constant(False)
    ),
    ROLLOUT_MAX_NUM_BATCHED_TOKENS.path: _fixed(
        None, "the reference scorer has no scheduler budget", None
    ),
    ROLLOUT_BATCH_INVARIANT.path: _fixed(
        False, "the reference scorer has no batch-invariant mode", _constant(False)
    ),
    BATCH_SIZE.path: KnobHandler(CHUNKED_REQUESTS.materialize, _reads(BATCH_SIZE.path)),
}
# The training side is vllm_hf's own transformers scorer: its handlers, no rollout one.
HANDLERS: Mapping[str, KnobHandler] = MappingProxyType(
    {
        **{p: h for p, h in VLLM_HF_HANDLERS.items() if KNOBS[p].side != "rollout"},
        **REFERENCE,
    }
)


class HfReferenceSide(Delegating):
    """Engine protocol: the unsharded reference scorer, read back under rollout knob names."""

    def readback(self) -> Mapping[str, ReadbackValue]:
        live = self._inner.readback()
        knobs = {
            path: handler.readback(live)
            for path, handler in REFERENCE.items()
            if handler.readback is not None
        }
        return {
            **knobs,
            ROLLOUT_WORLD_SIZE.name: live.get(TRAINING_WORLD_SIZE.name),
            ROLLOUT_ATTENTION_BACKEND.name: live.get(TRAINING_ATTENTION_BACKEND.path),
            ROLLOUT_VOCAB_LAYOUT.name: live.get(TRAINING_VOCAB_LAYOUT.name),
        }


class HfPairRuntime(VllmHfRuntime):
    """S1: transformers on both sides; vLLM is used only to freeze a recipe identity."""

    runtime_kind = "hf-pair"
    max_cached_engines: ClassVar[dict[str, int]] = {"rollout": 2, "training": 2}
    handlers: ClassVar[Handlers] = HANDLERS

    def view(self) -> RuntimeView:
        """No handler here splits the checkpoint over ranks: its facts are not read."""
        return RuntimeView(self.runtime_kind, self.device)

    def _rollout_context(self, knobs: Mapping[str, KnobValue]) -> tuple[tuple[str, Any], ...]:
        return (
            ("backend", "none"),
            ("rank", dict(process_group_context())["rank"]),
            ("world_size", 1),
        )

    def _scorers(self, identity: Identity) -> tuple[tuple[str, str], ...]:
        return (
            ("rollout", f"transformers-reference/{ADAPTER_VERSION}"),
            ("training", f"transformers-teacher-forced/{ADAPTER_VERSION}"),
        )

    def _build_engine(self, binding: SideBinding, case: ExecutionCase) -> Engine:
        if binding.side == "training":
            return super()._build_engine(binding, case)
        # One unsharded reference on rank 0; the other launched ranks receive its score.
        reference = self._transformers_scorer(
            binding.dtype, 1, attention_backend="sdpa", sharding="unsharded"
        )
        return HfReferenceSide(reference)
