"""The operator's forward for every rank of a TP layout, simulated in one process.

Runs the operator's own per-rank code (``_tile_partials``, the global-order merge) on each
shard of one full logits tensor, with the all-gather (which only moves bytes) replaced by a
concatenation. What it is for: checking on one device that the bits do not depend on the
TP degree (the device check runs it on a GPU for TP 1, 2, 4 and 8), where a real group of
processes is not at hand.
"""

from __future__ import annotations

import torch

from xconf.ops.logprob.contract import LogprobContract, ShardingSpec
from xconf.ops.logprob.impls import Impl, resolve_impl
from xconf.ops.logprob.vocab_parallel import (
    _merge,
    _Plan,
    _tile_partials,
    default_num_vocab_tiles,
)


def simulated_forward(
    logits: torch.Tensor,
    target: torch.Tensor,
    active: torch.Tensor,
    *,
    real_vocab_size: int,
    world: int,
    impl: Impl = "auto",
    num_vocab_tiles: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 ``(logprob, lse)`` as every rank of an even ``world``-way layout would return."""
    padded = logits.shape[1]
    tiles = default_num_vocab_tiles(padded) if num_vocab_tiles is None else num_vocab_tiles
    tile = padded // tiles
    resolved = resolve_impl(impl, logits.device.type)
    ms, ss = [], []
    by_rank: tuple[int, ...] | None = None
    for rank in range(world):
        sharding = ShardingSpec.even(real_vocab_size, padded, world, rank)
        contract = LogprobContract(sharding)
        if by_rank is None:
            by_rank = tuple((hi - lo) // tile for lo, hi in sharding.shard_bounds)
        plan = _Plan(contract, resolved, tiles, tile, by_rank, None)
        lo, hi = sharding.local_bounds
        m, s = _tile_partials(logits[:, lo:hi].contiguous(), plan)
        ms.append(m)
        ss.append(s)
    lse = _merge(torch.cat(ms, 1), torch.cat(ss, 1), plan)
    z = logits.gather(1, target.clamp(0, padded - 1)[:, None]).squeeze(1).float()
    return torch.where(active, z - lse, 0.0), lse
