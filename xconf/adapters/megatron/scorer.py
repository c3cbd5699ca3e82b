"""Teacher-forced, read-only scoring of the frozen tokens with a Megatron ``GPTModel``.

Read-only as the transformers scorer is (``adapters/hf/readonly.py`` holds the guards):
``torch.no_grad``, eval mode during the forwards and every module's mode restored after, no
optimizer, no inference context (so no KV cache), and the digests of every parameter and
buffer compared before and after, on every TP rank, agreed over the group before anyone
raises (a rank alone raising would leave the others in a collective). Each request is one
forward of a right-padded batch, or (``remove_padding``) one packed row with per-sample
positions and a block-diagonal causal mask; the mask is always explicit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from xconf.adapters.errors import ReadOnlyViolationError, ScoringError
from xconf.adapters.frozen import FrozenBatch, FrozenSample, assemble_scores
from xconf.adapters.hf.readonly import (
    StateDigest,
    check_unchanged,
    mode_snapshot,
    restore_modes,
    state_digest,
)
from xconf.adapters.megatron.logprob import VocabShards, megatron_native, with_operator
from xconf.knobs import LOGP_BACKEND
from xconf.runtime.protocol import SelectedLogprobOp

Layout = Literal["padded", "packed"]


@dataclass(frozen=True)
class Forward:
    """One request laid out for one forward, and where its scored tokens are."""

    ids: Any  # [b, W] token ids
    positions: Any  # [b, W]
    mask: Any  # [b, 1, W, W] bool, True where a query may not see a key (Megatron's sense)
    rows: Any  # [N] row of each scored token
    cols: Any  # [N] column of each scored token (it predicts column + 1)
    sample: Any  # [N] index of its sample in the request
    offset: Any  # [N] its position inside its own sample
    active: Any  # [N] bool: a response token (scored against the rollout)
    layout: Layout


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def _scored(samples: list[FrozenSample], starts: list[int], rows: list[int]) -> dict[str, Any]:
    import torch

    def cat(parts: list[Any]) -> Any:
        return torch.cat(parts).long()

    spans = [torch.arange(s.length - 1) for s in samples]
    return {
        "rows": cat([torch.full((s.length - 1,), r) for s, r in zip(samples, rows, strict=True)]),
        "cols": cat([st + sp for st, sp in zip(starts, spans, strict=True)]),
        "sample": cat([torch.full((s.length - 1,), i) for i, s in enumerate(samples)]),
        "offset": cat(spans),
        "active": torch.cat(
            [sp >= len(s.prompt_ids) - 1 for s, sp in zip(samples, spans, strict=True)]
        ),
    }


def padded(samples: list[FrozenSample], pad_id: int, multiple: int = 1) -> Forward:
    """``[b, W]`` right-padded rows (``W`` a multiple of ``multiple``: sequence parallelism
    splits the sequence over TP); each query sees its own sample's keys up to itself."""
    import torch

    width = _round_up(max(s.length for s in samples), multiple)
    ids = torch.full((len(samples), width), pad_id, dtype=torch.long)
    pos = torch.zeros((len(samples), width), dtype=torch.long)
    real = torch.zeros((len(samples), width), dtype=torch.bool)
    for r, s in enumerate(samples):
        ids[r, : s.length] = torch.tensor(s.token_ids)
        pos[r, : s.length] = torch.arange(s.length)
        real[r, : s.length] = True
    future = torch.triu(torch.ones(width, width, dtype=torch.bool), diagonal=1)
    mask = (future.unsqueeze(0) | ~real.unsqueeze(1)).unsqueeze(1)
    scored = _scored(samples, [0] * len(samples), list(range(len(samples))))
    return Forward(ids, pos, mask, layout="padded", **scored)


def packed(samples: list[FrozenSample], pad_id: int, multiple: int = 1) -> Forward:
    """One ``[1, L]`` row of the samples back to back, positions restarting per sample and a
    block-diagonal causal mask (no token sees another sample); filler tokens that round ``L``
    up to ``multiple`` each see only themselves."""
    import torch

    total = sum(s.length for s in samples)
    width = _round_up(total, multiple)
    ids = torch.full((1, width), pad_id, dtype=torch.long)
    pos = torch.zeros((1, width), dtype=torch.long)
    segment = torch.arange(width)  # filler: a segment of its own
    starts = []
    at = 0
    for i, s in enumerate(samples):
        starts.append(at)
        ids[0, at : at + s.length] = torch.tensor(s.token_ids)
        pos[0, at : at + s.length] = torch.arange(s.length)
        segment[at : at + s.length] = -1 - i
        at += s.length
    future = torch.triu(torch.ones(width, width, dtype=torch.bool), diagonal=1)
    mask = (future | (segment.unsqueeze(0) != segment.unsqueeze(1))).view(1, 1, width, width)
    return Forward(ids, pos, mask, layout="packed", **_scored(samples, starts, [0] * len(samples)))


def _checked(out: Any, n: int) -> Any:
    import torch

    if not isinstance(out, torch.Tensor) or out.dtype != torch.float32 or out.shape != (n,):
        got = (getattr(out, "dtype", type(out)), tuple(getattr(out, "shape", ())))
        raise ScoringError(
            "operator_output",
            f"the selected logprob must be float32 [{n}], got {got}",
            LOGP_BACKEND.path,
        )
    return out


@dataclass(frozen=True)
class MegatronScore:
    """Selected logprobs [B, T] and the read-only evidence of the pass (every TP rank's)."""

    logprobs: Any
    digest_before: str
    digest_after: str
    mode_restored: bool
    request_sizes: tuple[int, ...]
    layouts: tuple[Layout, ...]
    cross_entropy: str  # the native path that ran: "fused", "unfused", or "operator"


def _group_digest(digest: StateDigest, group: Any) -> str:
    """The digests of every TP rank's parameters and buffers, as one string (rank order)."""
    import torch.distributed as dist

    mine = f"{digest.parameters}:{digest.buffers}"
    if group.size() == 1:
        return mine
    every: list[Any] = [None] * group.size()
    dist.all_gather_object(every, mine, group=group)
    return "|".join(str(d) for d in every)


def _agree_unchanged(before: StateDigest, after: StateDigest, group: Any) -> None:
    """Raise on every rank when any rank's model changed (never on one rank alone)."""
    import torch
    import torch.distributed as dist

    unchanged = before == after
    if group.size() > 1:
        flag = torch.tensor([1 if unchanged else 0], dtype=torch.int64)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=group)
        unchanged = bool(flag.item())
    if not unchanged:
        if before == after:  # another rank's shard changed
            raise ReadOnlyViolationError(
                "parameters_changed",
                "another TP rank's model changed while scoring",
                "training.model",
            )
        check_unchanged(before, after, "training.model")


def score_frozen(
    model: Any,
    batch: FrozenBatch,
    batch_size: int,
    shards: VocabShards,
    *,
    device: str,
    op: SelectedLogprobOp | None = None,
    remove_padding: bool = False,
    sequence_multiple: int = 1,
    fused_cross_entropy: bool = False,
) -> MegatronScore:
    """Score every frozen sample (requests of ``batch_size``) and prove nothing changed."""
    import torch

    from xconf.adapters.megatron.shims import megatron_on

    before = state_digest(model)
    before_text = _group_digest(before, shards.group)
    modes = mode_snapshot(model)
    per_sample: list[dict[int, float]] = [{} for _ in batch.samples]
    sizes: list[int] = []
    layouts: list[Layout] = []
    try:
        model.eval()
        with torch.no_grad(), megatron_on(device):
            for chunk in batch.chunks(batch_size):
                samples = [batch.samples[i] for i in chunk]
                lay = packed if remove_padding else padded
                fwd = lay(samples, batch.pad_token_id, sequence_multiple)
                sizes.append(len(samples))
                layouts.append(fwd.layout)
                logits = model(
                    input_ids=fwd.ids.to(device),
                    position_ids=fwd.positions.to(device),
                    attention_mask=fwd.mask.to(device),
                )
                rows, cols = fwd.rows.to(device), fwd.cols.to(device)
                local = logits[rows, cols, :]
                targets = fwd.ids.to(device)[rows, cols + 1]
                if op is None:
                    out = megatron_native(local, targets, shards, fused_cross_entropy)
                else:
                    out = with_operator(op, local, targets, fwd.active.to(device), shards)
                selected = _checked(out, int(rows.shape[0])).cpu()
                for k in range(selected.shape[0]):
                    sample = chunk[int(fwd.sample[k])]
                    per_sample[sample][int(fwd.offset[k])] = float(selected[k])
    finally:
        restore_modes(model, modes)
    after = state_digest(model)
    _agree_unchanged(before, after, shards.group)
    return MegatronScore(
        logprobs=assemble_scores(batch, per_sample, side="training"),
        digest_before=before_text,
        digest_after=_group_digest(after, shards.group),
        mode_restored=mode_snapshot(model) == modes,
        request_sizes=tuple(sizes),
        layouts=tuple(layouts),
        cross_entropy="operator"
        if op is not None
        else ("fused" if fused_cross_entropy else "unfused"),
    )
