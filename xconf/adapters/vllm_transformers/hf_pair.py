"""The `hf_pair` runtime (S1): an unsharded transformers reference scorer on the rollout
side against the transformers training scorer (unsharded, or FSDP2 under a launcher).

Rollout knobs map onto the reference scorer truthfully: ``rollout.dtype`` is its compute
dtype; prefix caching, graph mode, tensor and context parallelism do not exist in a
teacher-forced reference pass and are reported ``unsupported`` when requested.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, ClassVar

from xconf.adapters.vllm_transformers.adapter import ADAPTER_VERSION, VllmHfRuntime
from xconf.adapters.vllm_transformers.delegating import Delegating
from xconf.adapters.vllm_transformers.placement import process_group_context
from xconf.experiment import Identity
from xconf.knobs import (
    BATCH_SIZE,
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
from xconf.operators.catalog import Side
from xconf.runtime.protocol import (
    Engine,
    KnobApplication,
    ReadbackValue,
    RuntimeBinding,
    SideBinding,
    applied_application,
    unsupported_application,
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

_ONLY = {
    ROLLOUT_ENABLE_PREFIX_CACHING.path: (False, "a teacher-forced reference pass has no KV cache"),
    ROLLOUT_ENFORCE_EAGER.path: (True, "the reference scorer has no graph/compiled mode"),
    ROLLOUT_TENSOR_PARALLEL_SIZE.path: (1, "vocab-parallel TP needs the vocab-parallel operator"),
    ROLLOUT_CONTEXT_PARALLEL_SIZE.path: (1, "no context parallelism in the reference scorer"),
    ROLLOUT_KV_CACHE_DTYPE.path: ("auto", "a teacher-forced reference pass has no KV cache"),
    ROLLOUT_ENABLE_CHUNKED_PREFILL.path: (False, "the reference scores each request in one pass"),
    ROLLOUT_MAX_NUM_BATCHED_TOKENS.path: (None, "the reference scorer has no scheduler budget"),
    ROLLOUT_BATCH_INVARIANT.path: (False, "the reference scorer has no batch-invariant mode"),
}


class HfReferenceSide(Delegating):
    """Engine protocol: the unsharded reference scorer, read back under rollout knob names."""

    def readback(self) -> Mapping[str, ReadbackValue]:
        live = self._inner.readback()
        wrapped = live.get(TRAINING_SHARDING.path)
        return {
            ROLLOUT_DTYPE.path: live.get(TRAINING_COMPUTE_DTYPE.path),
            ROLLOUT_ENABLE_PREFIX_CACHING.path: False,  # use_cache=False on every forward
            ROLLOUT_ENFORCE_EAGER.path: True,
            ROLLOUT_TENSOR_PARALLEL_SIZE.path: 1 if wrapped == "unsharded" else None,
            ROLLOUT_CONTEXT_PARALLEL_SIZE.path: 1,
            ROLLOUT_WORLD_SIZE.name: live.get(TRAINING_WORLD_SIZE.name),
            ROLLOUT_KV_CACHE_DTYPE.path: "auto",
            ROLLOUT_ENABLE_CHUNKED_PREFILL.path: False,
            ROLLOUT_BATCH_INVARIANT.path: False,
            BATCH_SIZE.path: live.get(BATCH_SIZE.path),
            ROLLOUT_ATTENTION_BACKEND.name: live.get(TRAINING_ATTENTION_BACKEND.path),
            ROLLOUT_VOCAB_LAYOUT.name: live.get(TRAINING_VOCAB_LAYOUT.name),
        }


class HfPairRuntime(VllmHfRuntime):
    """S1: transformers on both sides; vLLM is used only to freeze a recipe identity."""

    runtime_kind = "hf-pair"
    max_cached_engines: ClassVar[dict[str, int]] = {"rollout": 2, "training": 2}

    def _materialize(
        self,
        path: str,
        side: Side,
        value: KnobValue,
        knobs: Mapping[str, KnobValue] | None = None,
    ) -> KnobApplication:
        if path in _ONLY:
            allowed, why = _ONLY[path]
            if value == allowed:
                return applied_application(
                    path, side, value, f"fixed by the reference scorer: {why}"
                )
            return unsupported_application(path, side, value, why)
        if path == ROLLOUT_DTYPE.path:
            return applied_application(path, side, value, "reference scorer compute dtype")
        if side == "rollout" and path.startswith("rollout."):
            # The rollout side is the reference scorer, never vLLM: no other rollout knob.
            return unsupported_application(path, side, value, "not a reference-scorer setting")
        return super()._materialize(path, side, value, knobs)

    def bind(self, case: ExecutionCase, identity: Identity) -> RuntimeBinding:
        binding = super().bind(case, identity)
        rollout = SideBinding(
            "rollout",
            binding.rollout.knobs,
            binding.rollout.dtype,
            (
                ("backend", "none"),
                ("rank", dict(process_group_context())["rank"]),
                ("world_size", 1),
            ),
        )
        return RuntimeBinding(
            runtime_kind=self.runtime_kind,
            case_id=binding.case_id,
            rollout=rollout,
            training=binding.training,
            scorers=(
                ("rollout", f"transformers-reference/{ADAPTER_VERSION}"),
                ("training", f"transformers-teacher-forced/{ADAPTER_VERSION}"),
            ),
        )

    def _build_engine(self, binding: SideBinding, case: ExecutionCase) -> Engine:
        if binding.side == "training":
            return super()._build_engine(binding, case)
        # One unsharded reference on rank 0; the other launched ranks receive its score.
        reference = self._transformers_scorer(
            binding.dtype, 1, attention_backend="sdpa", sharding="unsharded"
        )
        return HfReferenceSide(reference)
