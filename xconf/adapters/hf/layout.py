"""How a request's token sequences are laid out for one forward: the one owner of the
right-padded batch and the packed row (the plain scorer and the shaped one both use it)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Layout:
    """Sequence ``r`` sits in row ``rows[r]`` from column ``cols[r]`` on."""

    ids: Any  # [B, T] token ids
    mask: Any  # [B, T] attention mask of a padded batch; None for a packed row
    positions: Any  # [B, T] each token's position in its own sequence (0 on padding)
    rows: tuple[int, ...]
    cols: tuple[int, ...]


def lay_out(sequences: Sequence[Sequence[int]], pad_token_id: int, packed: bool) -> Layout:
    """Right-padded rows, one per sequence, or one packed row of the sequences back to back
    (positions restart per sequence; no mask: transformers derives the per-sequence causal
    blocks from the positions, masking_utils.find_packed_sequence_indices)."""
    import torch

    lengths = [len(s) for s in sequences]
    if packed:
        ids = torch.tensor([[t for s in sequences for t in s]], dtype=torch.long)
        positions = torch.cat([torch.arange(n) for n in lengths]).unsqueeze(0)
        cols = tuple(sum(lengths[:r]) for r in range(len(sequences)))
        return Layout(ids, None, positions, (0,) * len(sequences), cols)
    width = max(lengths)
    ids = torch.full((len(sequences), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    positions = torch.zeros((len(sequences), width), dtype=torch.long)
    for r, s in enumerate(sequences):
        ids[r, : lengths[r]] = torch.tensor(list(s))
        mask[r, : lengths[r]] = 1
        positions[r, : lengths[r]] = torch.arange(lengths[r])
    return Layout(ids, mask, positions, tuple(range(len(sequences))), (0,) * len(sequences))
