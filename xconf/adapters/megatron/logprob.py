"""The selected logprob of the Megatron side, from its vocab-parallel logits.

Each tensor-parallel rank holds the logits of its own contiguous slice of the vocabulary
(:class:`VocabShards`). Three ways to a selected logprob, each used as its backend declares:

* ``native`` (no operator): Megatron's own vocab-parallel cross entropy on the shards, negated
  (``tensor_parallel.vocab_parallel_cross_entropy``; with ``training.cross_entropy_loss_fusion``
  its fused ``fused_vocab_parallel_cross_entropy``), what a Megatron trainer computes;
* xconf's ``xconf.vocab_parallel_logp`` at TP > 1: the deterministic operator on the shards
  themselves, under a contract that states Megatron's shard bounds (checked against the
  backend's declared capabilities first; a layout it does not serve is a coded refusal);
* any other operator (the reference, the smoke ones): the full vocabulary rows, gathered from
  the shards, as every runtime calls its operator (a TP 1 contract).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from xconf.errors import OperatorResolutionError
from xconf.runtime.protocol import SelectedLogprobOp


@dataclass(frozen=True)
class VocabShards:
    """The output vocabulary over the TP group: this rank's bounds and every rank's."""

    group: Any
    vocab_size: int
    bounds: tuple[tuple[int, int], ...]  # per TP rank, in rank order

    @property
    def size(self) -> int:
        return len(self.bounds)

    @property
    def rank(self) -> int:
        return int(self.group.rank())

    def spec(self) -> Any:
        """The layout as the operators' contract states it (Megatron pads no vocabulary)."""
        from xconf.ops.logprob.contract import ShardingSpec

        return ShardingSpec(self.vocab_size, self.vocab_size, self.bounds, tp_rank=self.rank)


def megatron_native(local: Any, targets: Any, shards: VocabShards, fused: bool) -> Any:
    """-CE of the target under Megatron's own vocab-parallel cross entropy: fp32 [N]."""
    # Megatron's CE takes [s, b, V/tp] and [s, b] and writes into its logits input: a copy.
    logits, target = local.unsqueeze(1).clone(), targets.unsqueeze(1)
    if fused:
        from megatron.core.fusions.fused_cross_entropy import fused_vocab_parallel_cross_entropy

        loss = fused_vocab_parallel_cross_entropy(logits, target, shards.group)
    else:
        from megatron.core.tensor_parallel import vocab_parallel_cross_entropy

        from xconf.adapters.megatron.shims import tensor_parallel_state

        with tensor_parallel_state(shards.group):
            loss = vocab_parallel_cross_entropy(logits, target)
    return (-loss).squeeze(1).float()


def _vocab_parallel(op: SelectedLogprobOp) -> Any:
    """The vocab-parallel implementation behind a dispatched operator (None: another one)."""
    from xconf.operators.dispatch import DispatchedOperator
    from xconf.ops.logprob.selected import VocabParallelSelectedLogprob

    if isinstance(op, DispatchedOperator) and isinstance(
        op.implementation, VocabParallelSelectedLogprob
    ):
        return op
    return None


def _on_shards(op: Any, local: Any, targets: Any, active: Any, shards: VocabShards) -> Any:
    """xconf's vocab-parallel operator on this rank's shard, under Megatron's layout."""
    from dataclasses import replace

    from xconf.operators.dispatch import contract_reasons
    from xconf.ops.logprob.vocab_parallel import vocab_parallel_selected_logprob

    impl = op.implementation
    contract = replace(impl.contract_for(local), sharding=shards.spec(), role=op.side)
    reasons = contract_reasons(op.descriptor, contract, str(local.device.type))
    if reasons:
        raise OperatorResolutionError(
            "operator.dispatch.incompatible_backend",
            f"backend '{op.descriptor.backend_id}' cannot serve Megatron's vocab shards: "
            + "; ".join(reasons),
            f"operators.{op.descriptor.semantic_operation}.{op.side}",
        )
    logprob, _ = vocab_parallel_selected_logprob(
        local,
        targets,
        active.bool(),
        contract=contract,
        tp_group=shards.group,
        num_vocab_tiles=impl.num_vocab_tiles,
        validate=impl.validate,
        backend_id=impl.backend_id,
        impl=impl.impl,
    )
    return logprob


def _full_rows(local: Any, shards: VocabShards) -> Any:
    """Every rank's shard, gathered into full vocabulary rows [N, V]."""
    import torch
    import torch.distributed as dist

    parts = [torch.empty_like(local) for _ in range(shards.size)]
    dist.all_gather(parts, local.contiguous(), group=shards.group)
    return torch.cat(parts, dim=-1)


def with_operator(
    op: SelectedLogprobOp, local: Any, targets: Any, active: Any, shards: VocabShards
) -> Any:
    """The operator's selected logprob of this rank's rows: fp32 [N] on every rank."""
    if shards.size > 1:
        vocab_parallel = _vocab_parallel(op)
        if vocab_parallel is not None:
            return _on_shards(vocab_parallel, local, targets, active, shards)
        local = _full_rows(local, shards)
    return op(local, targets, active)
