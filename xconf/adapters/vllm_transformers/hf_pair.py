"""The `hf_pair` runtime (S1): an unsharded transformers reference scorer on the rollout
side against the transformers training scorer (unsharded, or FSDP2 under a launcher).

Rollout knobs map onto the reference scorer truthfully: ``rollout.dtype`` is its compute
dtype; prefix caching, graph mode, tensor and context parallelism do not exist in a
teacher-forced reference pass and are reported ``unsupported`` when requested
(``hf_pair_handlers.py``); the reference engine is ``reference.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from xconf.adapters.hf.align.handlers import training_scorer
from xconf.adapters.vllm_transformers.adapter import ADAPTER_VERSION, VllmHfRuntime
from xconf.adapters.vllm_transformers.hf_pair_handlers import HANDLERS
from xconf.adapters.vllm_transformers.placement import process_group_context
from xconf.experiment import Identity
from xconf.knobs import KnobValue
from xconf.runtime.protocol import Engine, Handlers, RuntimeView, SideBinding

if TYPE_CHECKING:
    from xconf.execution_plan import ExecutionCase


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

    def _scorers(
        self, identity: Identity, knobs: Mapping[str, KnobValue]
    ) -> tuple[tuple[str, str], ...]:
        return (
            ("rollout", f"transformers-reference/{ADAPTER_VERSION}"),
            ("training", f"transformers-{training_scorer(knobs)}/{ADAPTER_VERSION}"),
        )

    def _build_engine(self, binding: SideBinding, case: ExecutionCase) -> Engine:
        from xconf.adapters.vllm_transformers.reference import HfReferenceSide

        if binding.side == "training":
            return super()._build_engine(binding, case)
        # One unsharded reference on rank 0; the other launched ranks receive its score.
        return self._transformers_scorer(
            binding.dtype, 1, HfReferenceSide, attention_backend="sdpa", sharding="unsharded"
        )
