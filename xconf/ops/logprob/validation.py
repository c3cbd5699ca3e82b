"""Call validation of the vocab-parallel operator; every failure has a stable code."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from xconf.errors import XconfError
from xconf.ops.logprob.contract import LogprobContract, dtype_name
from xconf.ops.logprob.errors import LogprobValidationError
from xconf.ops.logprob.impls import IMPLS


def fail(code: str, message: str, path: str) -> LogprobValidationError:
    return LogprobValidationError(f"logprob.call.{code}", message, path)


def local_checks(
    logits: Any,
    target_ids: Any,
    active_mask: Any,
    contract: LogprobContract,
    num_tiles: Any,
    impl: Any,
    group: Any,
) -> XconfError | None:
    """Every check that needs no peer; returned, not raised, so peers are never left waiting."""
    s = contract.sharding
    if impl not in IMPLS:
        return fail("invalid_impl", f"impl must be one of {list(IMPLS)}, got {impl!r}", "impl")
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2 or not logits.is_floating_point():
        return fail(
            "logits_shape", "local logits must be a 2-D floating tensor [N, local_vocab]", "logits"
        )
    if dtype_name(logits.dtype) != contract.logits_dtype:
        return fail(
            "dtype_mismatch",
            f"logits are {dtype_name(logits.dtype)}, contract says {contract.logits_dtype}",
            "logits_dtype",
        )
    if logits.shape[1] != s.local_vocab_size:
        return fail(
            "shard_size",
            f"local logits have {logits.shape[1]} columns, shard {s.tp_rank} "
            f"bounds {s.local_bounds} hold {s.local_vocab_size}",
            "sharding.shard_bounds",
        )
    rows = logits.shape[0]
    if (
        not isinstance(target_ids, torch.Tensor)
        or target_ids.dim() != 1
        or target_ids.shape[0] != rows
    ):
        return fail("target_shape", f"target ids must be a 1-D tensor of {rows} ids", "target_ids")
    if target_ids.is_floating_point() or target_ids.dtype == torch.bool:
        return fail("target_dtype", "target ids must be integers", "target_ids")
    if active_mask is not None and (
        not isinstance(active_mask, torch.Tensor)
        or active_mask.dtype != torch.bool
        or active_mask.dim() != 1
        or active_mask.shape[0] != rows
    ):
        return fail(
            "mask_length", f"active mask must be a 1-D bool tensor of {rows} rows", "active_mask"
        )
    if isinstance(num_tiles, bool) or not isinstance(num_tiles, int) or num_tiles < 1:
        return fail(
            "tile_count",
            f"num_vocab_tiles must be an int >= 1, got {num_tiles!r}",
            "num_vocab_tiles",
        )
    if s.padded_vocab_size % num_tiles:
        return fail(
            "tiles_not_dividing",
            f"{num_tiles} tiles do not divide the padded vocab {s.padded_vocab_size}",
            "num_vocab_tiles",
        )
    tile = s.padded_vocab_size // num_tiles
    if any(lo % tile or hi % tile for lo, hi in s.shard_bounds):
        return fail(
            "tiles_not_aligned",
            f"tile width {tile} does not align with shard bounds {list(s.shard_bounds)}",
            "num_vocab_tiles",
        )
    if s.tp_world_size > 1:
        if not dist.is_available() or not dist.is_initialized():
            return fail("no_process_group", "TP > 1 needs an initialized process group", "tp_group")
        if dist.get_world_size(group) != s.tp_world_size or dist.get_rank(group) != s.tp_rank:
            return fail(
                "group_mismatch",
                f"group has rank {dist.get_rank(group)} of {dist.get_world_size(group)}, "
                f"contract says {s.tp_rank} of {s.tp_world_size}",
                "tp_group",
            )
    return None


def resolve_active(
    target: torch.Tensor, active: torch.Tensor | None, contract: LogprobContract
) -> torch.Tensor:
    mask = contract.mask
    if mask.mode == "ignore_index":
        from_targets = torch.ne(target, int(mask.ignore_index or 0))
        if active is not None and not torch.equal(active, from_targets):
            raise fail(
                "mask_inexpressible",
                "ignore_index mode cannot express inactive rows whose target is not "
                "ignore_index (use explicit_active_mask)",
                "mask.mode",
            )
        return from_targets
    return torch.ones_like(target, dtype=torch.bool) if active is None else active


def validate_targets(target: torch.Tensor, active: torch.Tensor, contract: LogprobContract) -> None:
    s = contract.sharding
    chosen = target[active]
    if bool(((chosen < 0) | (chosen >= s.padded_vocab_size)).any()):
        raise fail(
            "target_out_of_range",
            f"an active target lies outside [0, {s.padded_vocab_size})",
            "target_ids",
        )
    if bool((chosen >= s.real_vocab_size).any()):
        raise fail(
            "target_in_padding",
            "an active target lies in the padded columns "
            f"[{s.real_vocab_size}, {s.padded_vocab_size})",
            "target_ids",
        )
