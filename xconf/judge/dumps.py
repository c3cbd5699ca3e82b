"""Reading logprob dumps another system computed: safetensors, npz (no pickle), Parquet, JSONL.

One file is one case: the rollout and training logprobs and the response mask, [B, T]
(verl's names by default: ``rollout_log_probs``, ``old_log_probs``, ``response_mask``),
optionally ``responses`` / ``input_ids`` for token text, and a ``dtype`` (or
``rollout_dtype`` / ``training_dtype``) that picks the contract threshold. Parquet and JSONL
rows may be ragged (one row per sequence, lists of different lengths): they are padded and
the mask is built from the lengths (and-ed with a dumped mask, whose rows must have the same
lengths). The file is read once and its digest is of exactly the bytes judged
(:mod:`xconf.judge.formats`). Every problem is a coded :class:`JudgeError` naming the file
and key.

Dtypes: the logprobs keep the dtype they were dumped in. The verdict is computed in float64
when either side was dumped in float64, else in float32 (bfloat16 and float16 convert to
float32 exactly); verl's figures are computed in the dumped dtypes, as verl computes them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from xconf.judge.formats import (
    EXPORT_HINT,
    META_KEYS,
    PICKLE_SUFFIXES,
    Column,
    JudgeError,
    Parsed,
    parse_dump,
)

__all__ = ["EXPORT_HINT", "PICKLE_SUFFIXES", "Dump", "JudgeError", "Keys", "load_dump"]

DTYPE_KEYS = META_KEYS
FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


@dataclass(frozen=True)
class Keys:
    rollout: str = "rollout_log_probs"
    training: str = "old_log_probs"
    mask: str = "response_mask"
    responses: str = "responses"
    input_ids: str = "input_ids"

    def wanted(self) -> set[str]:
        return {self.rollout, self.training, self.mask, self.responses, self.input_ids}

    def check(self, where: str) -> None:
        """Each key names its own tensor: ``--rollout-key`` and ``--training-key`` naming one
        tensor would judge it against itself (a pass that compared nothing)."""
        named: dict[str, str] = {}
        for role, key in (
            ("rollout", self.rollout),
            ("training", self.training),
            ("mask", self.mask),
            ("responses", self.responses),
            ("input_ids", self.input_ids),
        ):
            if key in named:
                raise JudgeError(
                    "judge.same_key",
                    f"the {named[key]} and {role} keys both name '{key}': each side is its "
                    "own tensor",
                    f"{where}:{key}",
                )
            named[key] = role


@dataclass(frozen=True)
class Dump:
    """One case's tensors, checked: [B, T] logprobs in their dumped dtype, a bool mask."""

    name: str
    path: str
    sha256: str
    size: int  # bytes of the file, all of which the digest covers
    rollout: torch.Tensor
    training: torch.Tensor
    mask: torch.Tensor
    responses: torch.Tensor | None
    source_dtypes: tuple[tuple[str, str], ...]
    declared: tuple[tuple[str, str], ...]  # dtype keys found in the file
    keys: Keys
    ragged: bool

    @property
    def verdict_dtype(self) -> torch.dtype:
        """float64 when either side was dumped in float64, else float32."""
        if torch.float64 in (self.rollout.dtype, self.training.dtype):
            return torch.float64
        return torch.float32

    def side(self, name: str) -> torch.Tensor:
        """A side's logprobs in the verdict dtype (no copy when already in it)."""
        tensor = self.rollout if name == "rollout" else self.training
        return tensor.to(self.verdict_dtype)


def _two_d(column: Column, key: str, where: str) -> Column:
    tensor = column.values
    if tensor.dim() == 1:
        tensor = tensor.unsqueeze(0)
    if tensor.dim() != 2:
        raise JudgeError(
            "judge.bad_shape", f"'{key}' must be [B, T], got {tuple(tensor.shape)}", where
        )
    return Column(tensor, column.lengths)


def _mask(columns: dict[str, Column], keys: Keys, rollout: Column, where: str) -> torch.Tensor:
    """The dumped mask (0/1), and-ed with the row lengths of ragged rows."""
    shape = rollout.values.shape
    lengths = rollout.lengths
    here = f"{where}:{keys.mask}"
    if keys.mask not in columns:
        if lengths is None:
            raise JudgeError(
                "judge.missing_key",
                f"no '{keys.mask}' (a mask is built only from ragged rows' lengths)",
                here,
            )
        return torch.arange(shape[1]).unsqueeze(0) < lengths.unsqueeze(1)
    column = _two_d(columns[keys.mask], keys.mask, here)
    mask = column.values
    if not _same_lengths(column.lengths, lengths):
        raise JudgeError(
            "judge.ragged_mismatch",
            f"rows of '{keys.mask}' and '{keys.rollout}' have different lengths",
            here,
        )
    if mask.shape != shape:
        raise JudgeError(
            "judge.shape_mismatch",
            f"'{keys.mask}' is {tuple(mask.shape)}, '{keys.rollout}' is {tuple(shape)}",
            here,
        )
    if mask.is_complex() or not bool(((mask == 0) | (mask == 1)).all()):
        raise JudgeError("judge.bad_mask", "mask entries must be 0 or 1", here)
    active = mask.bool()
    if lengths is not None:
        active &= torch.arange(shape[1]).unsqueeze(0) < lengths.unsqueeze(1)
    return active


def _same_lengths(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    """Equal row lengths; a rectangular column (no lengths) fits any padding."""
    if a is None or b is None:
        return True
    return a.shape == b.shape and bool(torch.equal(a, b))


def load_dump(name: str, file: str | Path, keys: Keys) -> Dump:
    path = Path(file).expanduser()
    keys.check(str(path))
    return dump_of(name, path, parse_dump(path, keys.wanted()), keys)


def dump_of(name: str, path: Path, parsed: Parsed, keys: Keys) -> Dump:
    """The checked case of a parsed dump (``load_dump``'s checks, for tensors already in
    memory too: the in-loop API checks a step's tensors before it writes their dump)."""
    where = str(path)
    columns = parsed.columns
    for key in (keys.rollout, keys.training):
        if key not in columns:
            raise JudgeError(
                "judge.missing_key",
                f"no '{key}' in {path.name} (has: {', '.join(sorted(parsed.names)) or 'nothing'})",
                f"{where}:{key}",
            )
    rollout_col = _two_d(columns[keys.rollout], keys.rollout, f"{where}:{keys.rollout}")
    training_col = _two_d(columns[keys.training], keys.training, f"{where}:{keys.training}")
    rollout, training = rollout_col.values, training_col.values
    if (rollout_col.lengths is None) != (training_col.lengths is None) or not _same_lengths(
        rollout_col.lengths, training_col.lengths
    ):
        raise JudgeError(
            "judge.ragged_mismatch",
            f"rows of '{keys.training}' and '{keys.rollout}' have different lengths",
            f"{where}:{keys.training}",
        )
    if training.shape != rollout.shape:
        raise JudgeError(
            "judge.shape_mismatch",
            f"'{keys.training}' is {tuple(training.shape)}, '{keys.rollout}' is "
            f"{tuple(rollout.shape)}",
            f"{where}:{keys.training}",
        )
    for key, t in ((keys.rollout, rollout), (keys.training, training)):
        if t.dtype not in FLOATS:
            raise JudgeError(
                "judge.not_float", f"'{key}' holds {t.dtype}, not logprobs", f"{where}:{key}"
            )
    if keys.mask not in columns and rollout_col.lengths is None:
        raise JudgeError(
            "judge.missing_key",
            f"no '{keys.mask}' in {path.name} (has: {', '.join(sorted(parsed.names))})",
            f"{where}:{keys.mask}",
        )
    mask = _mask(columns, keys, rollout_col, where)
    responses = _token_ids(columns, keys, rollout.shape, where)
    meta = parsed.meta
    declared = tuple((k, str(meta[k])) for k in DTYPE_KEYS if k in meta)
    return Dump(
        name=name,
        path=str(path.resolve()),
        sha256=parsed.sha256,
        size=parsed.size,
        rollout=rollout,
        training=training,
        mask=mask.contiguous(),
        responses=responses,
        source_dtypes=(
            ("rollout", str(rollout.dtype).removeprefix("torch.")),
            ("training", str(training.dtype).removeprefix("torch.")),
        ),
        declared=declared,
        keys=keys,
        ragged=rollout_col.lengths is not None,
    )


def _token_ids(
    columns: dict[str, Column], keys: Keys, shape: torch.Size, where: str
) -> torch.Tensor | None:
    """Response token ids: ``responses``, else the last T columns of ``input_ids``."""
    responses = columns.get(keys.responses)
    input_ids = columns.get(keys.input_ids)
    ids: torch.Tensor | None = None
    if responses is not None:
        ids = _two_d(responses, keys.responses, f"{where}:{keys.responses}").values
        if ids.shape != shape:
            raise JudgeError(
                "judge.shape_mismatch",
                f"'{keys.responses}' is {tuple(ids.shape)}, the logprobs {tuple(shape)}",
                f"{where}:{keys.responses}",
            )
    if input_ids is not None:
        full = _two_d(input_ids, keys.input_ids, f"{where}:{keys.input_ids}").values
        if full.shape[0] != shape[0] or full.shape[1] < shape[1]:
            raise JudgeError(
                "judge.shape_mismatch",
                f"'{keys.input_ids}' is {tuple(full.shape)}; it must hold the "
                f"{shape[1]} response tokens of each of the {shape[0]} rows at its end",
                f"{where}:{keys.input_ids}",
            )
        tail = full[:, full.shape[1] - shape[1] :]
        if ids is not None and not torch.equal(tail.long(), ids.long()):
            raise JudgeError(
                "judge.inconsistent_ids",
                f"'{keys.input_ids}' does not end with '{keys.responses}' (verl's layout)",
                f"{where}:{keys.input_ids}",
            )
        ids = tail if ids is None else ids
    if ids is None:
        return None
    if ids.is_floating_point() or ids.is_complex() or bool((ids < 0).any()):
        raise JudgeError(
            "judge.bad_token_ids", "token ids must be non-negative integers", f"{where}:responses"
        )
    return ids.to(torch.int64).contiguous()
