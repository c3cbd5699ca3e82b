"""Deterministic vocab-parallel selected-token logprob (see ``contract`` for the semantics).

The padded vocab is cut into fixed global tiles; every tile is reduced by the same
row-wise kernel on any rank, the tile partials are all-gathered (bytes only) and every
rank merges all tiles in global order over the same shape, so the bits do not depend on
the TP degree, the shard bounds or the batch composition. One path serves every
determinism scope: a ``fixed_topology`` contract gets the ``cross_tp_bitwise`` bits.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from xconf.errors import XconfError
from xconf.ops.logprob import kernels, preflight, validation
from xconf.ops.logprob.contract import LogprobContract, normalize_logprob_backend_id
from xconf.ops.logprob.descriptors import VOCAB_PARALLEL_ID
from xconf.ops.logprob.errors import LogprobValidationError
from xconf.ops.logprob.impls import Impl, ResolvedImpl, resolve_impl
from xconf.ops.logprob.kernels import NEG_INF

MAX_TILE_WIDTH = 4096


@functools.lru_cache(maxsize=64)
def default_num_vocab_tiles(padded_vocab_size: int) -> int:
    """The fewest tiles of at most ``MAX_TILE_WIDTH`` columns that divide the padded vocab,
    preferring a multiple of 8 tiles (then even shards for TP 1, 2, 4, 8 align with tiles).

    A function of the padded vocab only, so every TP degree uses the same tiles.
    """
    fitting = [
        t
        for t in range(1, padded_vocab_size + 1)
        if padded_vocab_size % t == 0 and padded_vocab_size // t <= MAX_TILE_WIDTH
    ]
    preferred = [t for t in fitting if t % 8 == 0]
    return (preferred or fitting)[0]


@dataclass(frozen=True)
class _Plan:
    contract: LogprobContract
    impl: ResolvedImpl
    num_tiles: int
    tile: int
    tiles_by_rank: tuple[int, ...]  # partials each rank contributes
    group: Any

    @property
    def rank(self) -> int:
        return self.contract.sharding.tp_rank

    @property
    def world(self) -> int:
        return self.contract.sharding.tp_world_size

    @property
    def local_tiles(self) -> int:
        return self.tiles_by_rank[self.rank]

    @property
    def valid_local(self) -> int:
        """Real (unpadded) columns in this rank's shard."""
        s = self.contract.sharding
        lo, hi = s.local_bounds
        return max(0, min(hi, s.real_vocab_size) - lo)


def vocab_parallel_selected_logprob(
    local_logits: torch.Tensor,
    target_ids: torch.Tensor,
    active_mask: torch.Tensor | None = None,
    *,
    contract: LogprobContract,
    tp_group: Any = None,
    num_vocab_tiles: int | None = None,
    validate: bool = True,
    backend_id: str = VOCAB_PARALLEL_ID,
    impl: Impl = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 ``(selected logprob [N], LSE [N])``, replicated on every rank of the TP group.

    ``local_logits`` is this rank's ``[N, local_vocab]`` shard; ``target_ids`` are global
    padded-vocab ids. Gradients flow to ``local_logits`` from both outputs.
    """
    s = contract.sharding
    tiles = (
        default_num_vocab_tiles(s.padded_vocab_size) if num_vocab_tiles is None else num_vocab_tiles
    )
    error = validation.local_checks(
        local_logits, target_ids, active_mask, contract, tiles, impl, tp_group
    )
    try:
        backend = normalize_logprob_backend_id(backend_id)
    except XconfError as exc:  # reported through the preflight like any local failure
        backend, error = str(backend_id), error or exc
    resolved: ResolvedImpl | None = None
    if error is None:
        try:
            resolved = resolve_impl(impl, local_logits.device.type)
        except LogprobValidationError as exc:
            error = exc
    pending: preflight.PendingAgreement | None = None
    if s.tp_world_size > 1 and dist.is_available() and dist.is_initialized():
        # Unconditional: validate=False must never let disagreeing ranks reach a collective.
        ok_tensors = error is None
        digest = preflight.build_digest(
            fingerprint=contract.cross_rank_fingerprint(),
            backend_id=backend,
            num_vocab_tiles=tiles if isinstance(tiles, int) else -1,
            determinism_scope=contract.reduction.determinism_scope,
            impl=resolved.label if resolved is not None else str(impl),
            target_ids=target_ids if ok_tensors else None,
            active_mask=active_mask if ok_tensors else None,
            rows=local_logits.shape[0] if ok_tensors else -1,
            local_error=error,
        )
        # Finished after the local tile pass, before the data collective (see preflight).
        pending = preflight.start(digest, tp_group, s.tp_world_size, s.tp_rank)
    if error is not None or resolved is None:
        if pending is not None:
            pending.finish(error)  # raises on every rank
        raise error or validation.fail("invalid_impl", f"impl {impl!r} did not resolve", "impl")
    try:
        target = target_ids.to(torch.int64)
        active = validation.resolve_active(target, active_mask, contract)
        if validate:
            validation.validate_targets(target, active, contract)
    except XconfError:
        if pending is not None:
            pending.finish(None)  # a disagreement between ranks is the error to report
        raise
    tile = s.padded_vocab_size // tiles
    by_rank = tuple((hi - lo) // tile for lo, hi in s.shard_bounds)
    plan = _Plan(contract, resolved, tiles, tile, by_rank, tp_group)
    logprob, lse = _SelectedLogprob.apply(local_logits, target, active, plan, pending)
    if validate and bool((active & (lse == NEG_INF)).any()):
        raise validation.fail(
            "row_all_neg_inf", "an active row has every real logit at -inf", "logits"
        )
    return logprob, lse


def _merge(m: torch.Tensor, sx: torch.Tensor, plan: _Plan) -> torch.Tensor:
    """The LSE of ``[N, T]`` partials merged in column (global tile) order."""
    if plan.impl.kernel is not None:
        return plan.impl.kernel.merge_lse(m, sx)
    merge = kernels.merge_kernel(m.shape[1], plan.impl.torch_impl)
    (lse,) = merge.run(m.shape[0], (m.contiguous(), sx.contiguous()), (0.0, 1.0))
    return lse


def _tile_partials(x: torch.Tensor, plan: _Plan) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 ``(m, s)`` per local tile, ``[N, local tiles]``."""
    rows = x.shape[0]
    s = plan.contract.sharding
    lo, hi = s.local_bounds
    tile, count = plan.tile, (hi - lo) // plan.tile
    partials: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
    if plan.impl.kernel is not None:
        partials = plan.impl.kernel.row_partials
    else:
        kernel = kernels.partials_kernel(tile, x.dtype, plan.impl.torch_impl)
        partials = functools.partial(_run_partials, kernel)
    m, sx = partials(x.view(rows * count, tile))
    m, sx = m.view(rows, count), sx.view(rows, count)
    for t in range(count):
        start = lo + t * tile
        if start + tile <= s.real_vocab_size:
            continue
        if start >= s.real_vocab_size:  # padding only: the identity partial
            m[:, t], sx[:, t] = NEG_INF, 0.0
            continue
        scratch = x[:, t * tile : (t + 1) * tile].clone()  # same [rows, tile] kernel shape
        scratch[:, s.real_vocab_size - start :] = NEG_INF
        m[:, t], sx[:, t] = partials(scratch)
    return m, sx


def _run_partials(kernel: kernels.Kernel, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    m, sx = kernel.run(t.shape[0], (t,), (0.0,))
    return m, sx


def _gathers_by_all_to_all(group: Any) -> bool:
    """Every rank sends its pack to every rank: an all-gather, bytes moved and never added,
    so either collective gives the same bits. Gloo's all_gather is a ring of world - 1
    dependent steps; its all_to_all talks to every peer at once (TP 4 on 2 cores: 2.3-3.2 ms
    a call against 4.1-6.7). Other backends (NCCL) gather into one buffer directly."""
    return bool(dist.get_backend(group) == "gloo")


def _exchange(
    m: torch.Tensor, sx: torch.Tensor, z: torch.Tensor, plan: _Plan
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """All-gather tile partials and owned target logits; returns global-order ``[N, T]``
    partials and the ``[world, N]`` target logits. One collective into one buffer."""
    rows, count = m.shape
    width = max(plan.tiles_by_rank)
    pack = torch.empty(rows, 2 * width + 1, dtype=torch.float32, device=m.device)
    if count < width:  # slots past this rank's tiles are never read; sent as identities
        pack[:, count:width] = NEG_INF
        pack[:, width + count : 2 * width] = 0.0
    pack[:, :count] = m
    pack[:, width : width + count] = sx
    pack[:, 2 * width] = z
    flat = torch.empty(plan.world * rows, 2 * width + 1, dtype=torch.float32, device=m.device)
    if _gathers_by_all_to_all(plan.group):
        dist.all_to_all_single(flat, pack.repeat(plan.world, 1), group=plan.group)
    else:
        dist.all_gather_single(flat, pack, group=plan.group)
    gathered = flat.view(plan.world, rows, 2 * width + 1)  # [source rank, row, slot]
    if all(c == width for c in plan.tiles_by_rank):  # even shards: two strided copies
        m_all = gathered[:, :, :width].transpose(0, 1).reshape(rows, -1)
        s_all = gathered[:, :, width : 2 * width].transpose(0, 1).reshape(rows, -1)
    else:
        counts = list(enumerate(plan.tiles_by_rank))
        m_all = torch.cat([gathered[r, :, :c] for r, c in counts], 1)
        s_all = torch.cat([gathered[r, :, width : width + c] for r, c in counts], 1)
    return m_all, s_all, gathered[:, :, 2 * width]


class _SelectedLogprob(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        logits: torch.Tensor,
        target: torch.Tensor,
        active: torch.Tensor,
        plan: _Plan,
        pending: preflight.PendingAgreement | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[override]
        x = logits.detach().contiguous()
        s = plan.contract.sharding
        lo, _ = s.local_bounds
        rows, local = x.shape
        ctx.plan = plan
        if rows == 0:
            if pending is not None:
                pending.finish(None)
            empty = torch.zeros(0, dtype=torch.float32, device=x.device)
            ctx.save_for_backward(x, empty, target, active, active)
            return empty, empty.clone()
        tgt = target.clamp(0, s.padded_vocab_size - 1)
        owned = (tgt >= lo) & (tgt < lo + local)
        col = (tgt - lo).clamp(0, local - 1)
        z = torch.where(owned, x.gather(1, col[:, None]).squeeze(1).float(), 0.0)
        try:
            m, sx = _tile_partials(x, plan)
        finally:
            if pending is not None:  # every rank agrees before any rank enters the exchange
                pending.finish(None)
        if plan.world > 1:
            m, sx, z_all = _exchange(m, sx, z, plan)
            starts = torch.tensor(
                [b[0] for b in s.shard_bounds[1:]], dtype=torch.int64, device=tgt.device
            )
            owner = torch.bucketize(tgt, starts, right=True)
            z = z_all.gather(0, owner[None, :]).squeeze(0)  # a copy from the owner, never a sum
        lse = _merge(m, sx, plan)
        logprob = torch.where(active, z - lse, 0.0)
        ctx.save_for_backward(x, lse, col, owned, active)
        return logprob, lse

    @staticmethod
    def backward(
        ctx: Any, g_logprob: torch.Tensor | None, g_lse: torch.Tensor | None
    ) -> tuple[torch.Tensor, None, None, None, None]:  # type: ignore[override]
        x, lse, col, owned, active = ctx.saved_tensors
        plan: _Plan = ctx.plan
        rows, local = x.shape
        if rows == 0:
            return torch.zeros_like(x), None, None, None, None
        g_lp = torch.zeros_like(lse) if g_logprob is None else g_logprob.float()
        g_ls = torch.zeros_like(lse) if g_lse is None else g_lse.float()
        keep = active & torch.isfinite(lse)
        coef = torch.where(keep, g_ls - g_lp, 0.0)
        safe_lse = torch.where(keep, lse, 0.0)
        width = plan.tile
        per_row = local // width
        kernel = kernels.grad_kernel(width, x.dtype, plan.impl.torch_impl)
        inputs = (
            x.view(rows * per_row, width),
            safe_lse.repeat_interleave(per_row),
            coef.repeat_interleave(per_row),
            keep.repeat_interleave(per_row),
        )
        (grad,) = kernel.run(rows * per_row, inputs, (0.0, 0.0, 0.0, False))
        grad = grad.view(rows, local)
        if plan.valid_local < local:
            grad[:, plan.valid_local :] = 0.0
        hit = (owned & keep).nonzero().squeeze(1)
        grad[hit, col[hit]] = grad[hit, col[hit]] + g_lp[hit]
        return grad.to(x.dtype), None, None, None, None
