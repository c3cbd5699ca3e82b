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
from xconf.knobs import KnobValue
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

if TYPE_CHECKING:
    from xconf.execution_plan import ExecutionCase

_ONLY = {
    "rollout.enable_prefix_caching": (False, "a teacher-forced reference pass has no KV cache"),
    "rollout.enforce_eager": (True, "the reference scorer has no graph/compiled mode"),
    "rollout.tensor_parallel_size": (1, "vocab-parallel TP needs the vocab-parallel operator"),
    "rollout.context_parallel_size": (1, "no context parallelism in the reference scorer"),
    "rollout.kv_cache_dtype": ("auto", "a teacher-forced reference pass has no KV cache"),
    "rollout.enable_chunked_prefill": (False, "the reference scores each request in one pass"),
    "rollout.max_num_batched_tokens": (None, "the reference scorer has no scheduler budget"),
    "rollout.batch_invariant": (False, "the reference scorer has no batch-invariant mode"),
}


class HfReferenceSide(Delegating):
    """Engine protocol: the unsharded reference scorer, read back under rollout knob names."""

    def readback(self) -> Mapping[str, ReadbackValue]:
        live = self._inner.readback()
        wrapped = live.get("training.sharding")
        return {
            "rollout.dtype": live.get("training.compute_dtype"),
            "rollout.enable_prefix_caching": False,  # use_cache=False on every forward
            "rollout.enforce_eager": True,
            "rollout.tensor_parallel_size": 1 if wrapped == "unsharded" else None,
            "rollout.context_parallel_size": 1,
            "rollout.world_size": live.get("training.world_size"),
            "rollout.kv_cache_dtype": "auto",
            "rollout.enable_chunked_prefill": False,
            "rollout.batch_invariant": False,
            "batch.size": live.get("batch.size"),
            "rollout.attention_backend": live.get("training.attention_backend"),
            "rollout.vocab_layout": live.get("training.vocab_layout"),
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
        if path == "rollout.dtype":
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
