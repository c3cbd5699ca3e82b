"""Reach the ``torch.nn.Module`` inside an engine the runtime adapter built.

The engines are built by the adapter exactly as a run builds them; this module only
unwraps them: transformers sides expose their model, the vLLM side its in-process model
(``LLM.apply_model`` runs in this process when the engine core is in-process and TP is 1;
with worker processes the module lives elsewhere and cannot be hooked from here).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from xconf.knobs import ROLLOUT_TENSOR_PARALLEL_SIZE, TRAINING_SHARDING
from xconf.localize.errors import LocalizeError
from xconf.localize.names import Flavour


@dataclass(frozen=True)
class SideModule:
    """The hookable module of one side and what to do before each scoring pass."""

    flavour: Flavour
    module: Any
    before_pass: Callable[[], Any]


def _same(model: Any) -> Any:
    return model


def _nothing() -> None:
    return None


def side_module(engine: Any, side: str) -> SideModule:
    import torch

    from xconf.adapters.hf.side_engine import HfScorerSide
    from xconf.adapters.vllm.side_engine import VllmRolloutSide
    from xconf.runtime.wrappers import OnSideRanks

    inner = engine
    while hasattr(inner, "wrapped") or isinstance(inner, OnSideRanks):
        # the checkpoint runtime's Timed exposes ``wrapped``; OnSideRanks holds the
        # engine on its side's member ranks (every rank in a one-process world)
        inner = inner.engine if isinstance(inner, OnSideRanks) else inner.wrapped
        if inner is None:
            raise LocalizeError(
                "localize.unsupported_topology",
                f"this rank holds no {side} engine (not a member of its side's ranks)",
                f"runtime.{side}",
            )
    if isinstance(inner, VllmRolloutSide):
        cfg = inner.engine.cfg
        if not cfg.in_process or cfg.tensor_parallel_size != 1 or cfg.executor != "auto":
            raise LocalizeError(
                "localize.unsupported_topology",
                f"the {side} vLLM engine runs its model in worker processes "
                f"(TP={cfg.tensor_parallel_size}, in_process={cfg.in_process}); localize hooks "
                "the in-process model only (TP 1)",
                ROLLOUT_TENSOR_PARALLEL_SIZE.path,
            )
        llm = inner.engine.llm
        models = llm.apply_model(_same)
        if len(models) != 1 or not isinstance(models[0], torch.nn.Module):
            raise LocalizeError(
                "localize.unsupported_topology",
                "the vLLM engine did not hand back its in-process module",
                f"runtime.{side}",
            )
        # A prefix-cache hit would skip positions; every pass starts from an empty cache.
        return SideModule("vllm", models[0], llm.reset_prefix_cache)
    if isinstance(inner, HfScorerSide):
        scorer = inner.scorer
        if scorer.sharding != "unsharded":
            raise LocalizeError(
                "localize.unsupported_topology",
                f"the {side} model is sharded ({scorer.sharding}); localize hooks one "
                "unsharded module",
                TRAINING_SHARDING.path,
            )
        return SideModule("hf", scorer.model, _nothing)
    raise LocalizeError(
        "localize.unsupported_engine",
        f"the {side} engine {type(inner).__name__} has no module localize can hook",
        f"runtime.{side}",
    )
