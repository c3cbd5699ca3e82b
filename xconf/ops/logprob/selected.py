"""Single-process (TP=1) selected-logprob callables for the runtimes' operator sessions."""

from __future__ import annotations

import torch

from xconf.ops.logprob.contract import (
    LogprobContract,
    ShardingSpec,
    dtype_name,
)
from xconf.ops.logprob.descriptors import VOCAB_PARALLEL_ID
from xconf.ops.logprob.impls import Impl
from xconf.ops.logprob.vocab_parallel import vocab_parallel_selected_logprob


class VocabParallelSelectedLogprob:
    """``op(logits [N, V], target_ids [N], active_mask [N]) -> fp32 logprob [N]`` at TP=1.

    ``real_vocab_size`` marks trailing padded columns of the logits (masked to -inf);
    by default every column is real. The contract is ``cross_tp_bitwise``: the bits equal
    those of the same rows at any TP degree.
    """

    backend_id = VOCAB_PARALLEL_ID

    def __init__(
        self,
        *,
        num_vocab_tiles: int | None = None,
        real_vocab_size: int | None = None,
        validate: bool = True,
        impl: Impl = "auto",
    ) -> None:
        self.num_vocab_tiles = num_vocab_tiles
        self.real_vocab_size = real_vocab_size
        self.validate = validate
        self.impl: Impl = impl

    def contract_for(self, logits: torch.Tensor) -> LogprobContract:
        padded = int(logits.shape[-1])
        real = padded if self.real_vocab_size is None else self.real_vocab_size
        return LogprobContract(
            sharding=ShardingSpec.even(real, padded),
            logits_dtype=dtype_name(logits.dtype),  # type: ignore[arg-type]
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
            validate=self.validate,
            backend_id=self.backend_id,
            impl=self.impl,
        )
        return logprob
