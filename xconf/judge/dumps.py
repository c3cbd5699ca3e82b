"""Reading logprob dumps another system computed: safetensors, npz (no pickle), Parquet.

One file is one case: the rollout and training logprobs and the response mask, [B, T]
(verl's names by default: ``rollout_log_probs``, ``old_log_probs``, ``response_mask``),
optionally ``responses`` / ``input_ids`` for token text, and a ``dtype`` (or
``rollout_dtype`` / ``training_dtype``) that picks the contract threshold. Pickle formats
are refused before the file is opened. Every problem is a coded :class:`JudgeError`
naming the file and key.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from xconf.artifacts.layout import UNBOUNDED, sha256_file
from xconf.errors import XconfError

PICKLE_SUFFIXES = (".pt", ".pth", ".pkl", ".pickle", ".bin", ".ckpt", ".joblib")
DTYPE_KEYS = ("dtype", "rollout_dtype", "training_dtype")
EXPORT_HINT = (
    "export the tensors once with safetensors instead:\n"
    "    from safetensors.torch import save_file\n"
    '    save_file({k: batch[k].contiguous() for k in ("rollout_log_probs", "old_log_probs", '
    '"response_mask")}, "step.safetensors")'
)


class JudgeError(XconfError):
    """A dump that cannot be judged; nothing is written."""


@dataclass(frozen=True)
class Keys:
    rollout: str = "rollout_log_probs"
    training: str = "old_log_probs"
    mask: str = "response_mask"
    responses: str = "responses"
    input_ids: str = "input_ids"


@dataclass(frozen=True)
class Dump:
    """One case's tensors, checked: float32 [B, T] logprobs, a bool mask, token ids."""

    name: str
    path: str
    sha256: str
    rollout: torch.Tensor
    training: torch.Tensor
    mask: torch.Tensor
    responses: torch.Tensor | None
    source_dtypes: tuple[tuple[str, str], ...]
    declared: tuple[tuple[str, str], ...]  # dtype keys found in the file


def sha256_path(path: Path) -> str:
    """A dump's digest: the one file digest (artifacts/layout.py), unbounded, links followed."""
    return sha256_file(path, limit=UNBOUNDED, follow=True)


def _read_safetensors(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as fh:
        meta = dict(fh.metadata() or {})
        return {k: fh.get_tensor(k) for k in fh.keys()}, meta  # noqa: SIM118 - not a dict


def _read_npz(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    import numpy as np

    tensors: dict[str, torch.Tensor] = {}
    meta: dict[str, str] = {}
    with np.load(str(path), allow_pickle=False) as npz:
        for key in npz.files:
            arr = npz[key]
            if arr.dtype.kind in "US":
                meta[key] = str(arr.reshape(-1)[0]) if arr.size else ""
            else:
                tensors[key] = torch.from_numpy(np.ascontiguousarray(arr))
    return tensors, meta


def _read_parquet(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    import numpy as np
    import pyarrow.parquet as pq

    table = pq.read_table(str(path))
    tensors: dict[str, torch.Tensor] = {}
    meta: dict[str, str] = {}
    for name in table.column_names:
        values = table.column(name).to_pylist()
        if values and all(isinstance(v, str) for v in values):
            meta[name] = values[0]
            continue
        if not values or not all(isinstance(v, list) for v in values):
            continue  # scalar columns (uid, step, ...) are not per-token data
        widths = {len(v) for v in values}
        if len(widths) != 1:
            raise JudgeError(
                "judge.ragged_column",
                f"rows of '{name}' have different lengths {sorted(widths)[:4]}; pad them",
                f"{path}:{name}",
            )
        tensors[name] = torch.from_numpy(np.asarray(values))
    return tensors, meta


def _read(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    suffix = path.suffix.lower()
    if suffix in PICKLE_SUFFIXES:
        raise JudgeError(
            "judge.pickle_format",
            f"{path.name} is a pickle format; xconf never loads pickles. {EXPORT_HINT}",
            str(path),
        )
    readers = {".safetensors": _read_safetensors, ".npz": _read_npz, ".parquet": _read_parquet}
    if suffix not in readers:
        raise JudgeError(
            "judge.format", "a dump is a .safetensors, .npz or .parquet file", str(path)
        )
    try:
        return readers[suffix](path)
    except JudgeError:
        raise
    except Exception as exc:  # each format's parser raises its own types for a bad file
        raise JudgeError(
            "judge.unreadable", f"cannot read {path.name}: {type(exc).__name__}: {exc}", str(path)
        ) from exc


def _two_d(tensor: torch.Tensor, key: str, where: str) -> torch.Tensor:
    if tensor.dim() == 1:
        tensor = tensor.unsqueeze(0)
    if tensor.dim() != 2:
        raise JudgeError(
            "judge.bad_shape", f"'{key}' must be [B, T], got {tuple(tensor.shape)}", where
        )
    return tensor


def load_dump(name: str, file: str | Path, keys: Keys) -> Dump:
    path = Path(file).expanduser()
    if not path.is_file():
        raise JudgeError("judge.missing_file", "dump file does not exist", str(path))
    tensors, meta = _read(path)
    where = str(path)
    for key in (keys.rollout, keys.training, keys.mask):
        if key not in tensors:
            raise JudgeError(
                "judge.missing_key",
                f"no '{key}' in {path.name} (has: {', '.join(sorted(tensors)) or 'nothing'})",
                f"{where}:{key}",
            )
    rollout = _two_d(tensors[keys.rollout], keys.rollout, f"{where}:{keys.rollout}")
    training = _two_d(tensors[keys.training], keys.training, f"{where}:{keys.training}")
    mask = _two_d(tensors[keys.mask], keys.mask, f"{where}:{keys.mask}")
    for key, t in ((keys.training, training), (keys.mask, mask)):
        if t.shape != rollout.shape:
            raise JudgeError(
                "judge.shape_mismatch",
                f"'{key}' is {tuple(t.shape)}, '{keys.rollout}' is {tuple(rollout.shape)}",
                f"{where}:{key}",
            )
    for key, t in ((keys.rollout, rollout), (keys.training, training)):
        if not t.is_floating_point():
            raise JudgeError(
                "judge.not_float", f"'{key}' holds {t.dtype}, not logprobs", f"{where}:{key}"
            )
    if not bool(((mask == 0) | (mask == 1)).all()):
        raise JudgeError("judge.bad_mask", "mask entries must be 0 or 1", f"{where}:{keys.mask}")
    responses = _token_ids(tensors, keys, rollout.shape, where)
    declared = tuple((k, str(meta[k])) for k in DTYPE_KEYS if k in meta)
    return Dump(
        name=name,
        path=str(path.resolve()),
        sha256=sha256_path(path),
        rollout=rollout.to(torch.float32).contiguous(),
        training=training.to(torch.float32).contiguous(),
        mask=mask.bool().contiguous(),
        responses=responses,
        source_dtypes=(
            ("rollout", str(rollout.dtype).removeprefix("torch.")),
            ("training", str(training.dtype).removeprefix("torch.")),
        ),
        declared=declared,
    )


def _token_ids(
    tensors: dict[str, torch.Tensor], keys: Keys, shape: torch.Size, where: str
) -> torch.Tensor | None:
    """Response token ids: ``responses``, else the last T columns of ``input_ids``."""
    responses = tensors.get(keys.responses)
    input_ids = tensors.get(keys.input_ids)
    if responses is not None:
        responses = _two_d(responses, keys.responses, f"{where}:{keys.responses}")
        if responses.shape != shape:
            raise JudgeError(
                "judge.shape_mismatch",
                f"'{keys.responses}' is {tuple(responses.shape)}, the logprobs {tuple(shape)}",
                f"{where}:{keys.responses}",
            )
    if input_ids is not None:
        input_ids = _two_d(input_ids, keys.input_ids, f"{where}:{keys.input_ids}")
        if input_ids.shape[0] != shape[0] or input_ids.shape[1] < shape[1]:
            raise JudgeError(
                "judge.shape_mismatch",
                f"'{keys.input_ids}' is {tuple(input_ids.shape)}; it must hold the "
                f"{shape[1]} response tokens of each of the {shape[0]} rows at its end",
                f"{where}:{keys.input_ids}",
            )
        tail = input_ids[:, -shape[1] :]
        if responses is not None and not torch.equal(tail.long(), responses.long()):
            raise JudgeError(
                "judge.inconsistent_ids",
                f"'{keys.input_ids}' does not end with '{keys.responses}' (verl's layout)",
                f"{where}:{keys.input_ids}",
            )
        responses = tail if responses is None else responses
    if responses is None:
        return None
    if responses.is_floating_point() or bool((responses < 0).any()):
        raise JudgeError(
            "judge.bad_token_ids", "token ids must be non-negative integers", f"{where}:responses"
        )
    return responses.to(torch.int64).contiguous()
