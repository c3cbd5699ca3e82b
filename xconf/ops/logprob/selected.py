"""Single-process (TP=1) selected-logprob callables for the runtimes' operator sessions."""

from __future__ import annotations

import torch

from xconf.ops.logprob.contract import (
    DeterminismScope,
    LogprobContract,
    ReductionSpec,
    ShardingSpec,
    dtype_name,
)
from xconf.ops.logprob.descriptors import VOCAB_PARALLEL_FAST_ID, VOCAB_PARALLEL_ID
from xconf.ops.logprob.impls import Impl
from xconf.ops.logprob.vocab_parallel import vocab_parallel_selected_logprob


class VocabParallelSelectedLogprob:
    """``op(logits [N, V], target_ids [N], active_mask [N]) -> fp32 logprob [N]`` at TP=1.

    ``real_vocab_size`` marks trailing padded columns of the logits (masked to -inf);
    by default every column is real. ``deterministic=False`` takes the fast path under a
    ``fixed_topology`` contract.
    """

    def __init__(
        self,
        *,
        deterministic: bool = True,
        num_vocab_tiles: int | None = None,
        real_vocab_size: int | None = None,
        validate: bool = True,
        impl: Impl = "auto",
    ) -> None:
        self.deterministic = deterministic
        self.num_vocab_tiles = num_vocab_tiles
        self.real_vocab_size = real_vocab_size
        self.validate = validate
        self.impl: Impl = impl
        self.backend_id = VOCAB_PARALLEL_ID if deterministic is True else VOCAB_PARALLEL_FAST_ID

    def contract_for(self, logits: torch.Tensor) -> LogprobContract:
        padded = int(logits.shape[-1])
        real = padded if self.real_vocab_size is None else self.real_vocab_size
        scope: DeterminismScope = (
            "cross_tp_bitwise" if self.deterministic is True else "fixed_topology"
        )
        return LogprobContract(
            sharding=ShardingSpec.even(real, padded),
            logits_dtype=dtype_name(logits.dtype),  # type: ignore[arg-type]
            reduction=ReductionSpec(determinism_scope=scope),
            requested_backend=self.backend_id,
        )

    def __call__(
        self,
        logits: torch.Tensor,
        target_ids: torch.Tensor,
        active_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        logprob, _ = vocab_parallel_selected_logprob(
            logits,
            target_ids,
            None if active_mask is None else active_mask.bool(),
            contract=self.contract_for(logits),
            num_vocab_tiles=self.num_vocab_tiles,
            deterministic=self.deterministic,
            validate=self.validate,
            backend_id=self.backend_id,
            impl=self.impl,
        )
        return logprob


class VocabParallelSelectedLogprobFast(VocabParallelSelectedLogprob):
    """The ``deterministic=False`` variant: one partial per shard, layout-dependent bits."""

    def __init__(
        self,
        *,
        real_vocab_size: int | None = None,
        validate: bool = True,
        impl: Impl = "auto",
    ) -> None:
        super().__init__(
            deterministic=False, real_vocab_size=real_vocab_size, validate=validate, impl=impl
        )
