"""Which frozen samples a localization replays: all of them, or the worst that fit in memory.

Every tap of every compared position is kept on the host until both sides are scored: per
position, ``hidden`` floats for each decoder tap and ``vocab`` floats for the logits, for
each stored pass (four when the case is the baseline, six otherwise). A real checkpoint's
run (SmolLM2-135M: vocab 49152, 30 layers, 24 samples of ~250 tokens) would need ~10 GB, so
past ``MAX_BYTES`` localize replays the samples whose |diff| in the case's own sealed token
artifact is largest, worst first, as many as fit (always at least one), and records which.
The noise floor and the case are measured on the same samples, so the rule is unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from xconf.experiment import Identity

MAX_BYTES = 1 << 30  # host memory for the captured activations of one localization
FLOAT_BYTES = 4


@dataclass(frozen=True)
class Selection:
    identity: Identity  # the frozen identity restricted to the chosen samples
    samples: tuple[int, ...]  # row indices of the sealed identity, in replay order
    total: int  # rows of the sealed identity

    @property
    def note(self) -> str:
        if len(self.samples) == self.total:
            return f"all {self.total} frozen samples"
        return (
            f"{len(self.samples)} of {self.total} frozen samples, those with the largest "
            f"|diff| in the case's token artifact (the memory bound, {MAX_BYTES >> 20} MiB)"
        )


def _worst_first(attempt: Path, rows: int) -> list[int]:
    """Row indices by the largest active |diff| the case sealed (unreadable: in order)."""
    try:
        from safetensors.numpy import load_file

        tensors = load_file(str(attempt / "token_diffs.safetensors"))
        diffs, active = tensors["abs_diff"], tensors["active_mask"].astype(bool)
    except (OSError, KeyError, ValueError):
        return list(range(rows))
    if diffs.shape != active.shape or diffs.ndim != 2 or diffs.shape[0] != rows:
        return list(range(rows))
    import numpy as np

    worst = np.where(active, np.nan_to_num(diffs, nan=np.inf), -1.0).max(axis=1)
    return sorted(range(rows), key=lambda r: (-float(worst[r]), r))


def select(
    identity: Identity, attempt: Path, *, hidden: int, vocab: int, layers: int, passes: int
) -> Selection:
    rows = len(identity.attention_mask)
    per_position = FLOAT_BYTES * passes * (hidden * (3 * layers + 2) + vocab)
    chosen: list[int] = []
    used = 0
    for row in _worst_first(attempt, rows):
        cost = per_position * max(sum(identity.attention_mask[row]) - 1, 0)
        if chosen and used + cost > MAX_BYTES:
            continue
        chosen.append(row)
        used += cost
    chosen.sort()
    if len(chosen) == rows:
        return Selection(identity, tuple(chosen), rows)

    # Re-laid out by the frozen-batch owner: the chosen rows padded to their own longest.
    from xconf.adapters.frozen import FrozenBatch

    batch = FrozenBatch.from_identity(identity)
    chosen_batch = FrozenBatch(tuple(batch.samples[r] for r in chosen), batch.pad_token_id)
    layout = chosen_batch.layout()

    def rows_of(name: str) -> tuple[tuple[int, ...], ...]:
        return tuple(tuple(row) for row in layout[name])

    subset = replace(
        identity,
        token_ids=rows_of("token_ids"),
        selected_token_ids=rows_of("selected_token_ids"),
        active_mask=rows_of("active_mask"),
        attention_mask=rows_of("attention_mask"),
        position_ids=rows_of("position_ids"),
    )
    return Selection(subset, tuple(chosen), rows)
