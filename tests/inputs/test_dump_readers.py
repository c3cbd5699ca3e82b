"""Hostile dumps for `xconf judge` (fourth campaign): every one a coded exit 2 naming the file,
nothing written, no traceback, memory bounded. Before: a tensor judged against itself, the
last of two same-named tensors judged, tracebacks, decoded bombs and a 20-million-character
error line."""

from __future__ import annotations

import io
import json
import struct
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save, save_file

from tests.conftest import snapshot

G = torch.Generator().manual_seed(5)
R = -torch.rand((2, 4), generator=G) - 0.1
T = R + 1e-6
MASK = torch.ones((2, 4), dtype=torch.int64)


def _safetensors(path: Path, header_text: str, body: bytes) -> Path:
    raw = header_text.encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + body)
    return path


def _entry(name: str, dtype: str, shape: list[int], begin: int, end: int) -> str:
    return f'"{name}": {json.dumps({"dtype": dtype, "shape": shape, "data_offsets": [begin, end]})}'


def _twice(tmp: Path) -> Path:
    """A header naming old_log_probs twice: the first copy fails, the last passes."""
    body = R.numpy().tobytes() + (R + 1.0).numpy().tobytes() + T.numpy().tobytes()
    body += MASK.numpy().tobytes()
    n = 32
    entries = [
        _entry("rollout_log_probs", "F32", [2, 4], 0, n),
        _entry("old_log_probs", "F32", [2, 4], n, 2 * n),
        _entry("old_log_probs", "F32", [2, 4], 2 * n, 3 * n),
        _entry("response_mask", "I64", [2, 4], 3 * n, 3 * n + 64),
    ]
    return _safetensors(tmp / "twice.safetensors", "{" + ", ".join(entries) + "}", body)


def _metadata_twice(tmp: Path) -> Path:
    """Two ``__metadata__`` objects: the first says nothing, the last names another format."""
    body = R.numpy().tobytes() + T.numpy().tobytes() + MASK.numpy().tobytes()
    entries = [
        '"__metadata__": {"format": "pt"}',
        _entry("rollout_log_probs", "F32", [2, 4], 0, 32),
        _entry("old_log_probs", "F32", [2, 4], 32, 64),
        _entry("response_mask", "I64", [2, 4], 64, 128),
        '"__metadata__": {"format": "other"}',
    ]
    return _safetensors(tmp / "metadata.safetensors", "{" + ", ".join(entries) + "}", body)


def _huge_shape(tmp: Path) -> Path:
    body = T.numpy().tobytes() + MASK.numpy().tobytes()
    entries = [
        _entry("rollout_log_probs", "F32", [0, 2**70], 0, 0),
        _entry("old_log_probs", "F32", [2, 4], 0, 32),
        _entry("response_mask", "I64", [2, 4], 32, 96),
    ]
    return _safetensors(tmp / "shape.safetensors", "{" + ", ".join(entries) + "}", body)


def _long_name(tmp: Path) -> Path:
    """A 20-million-character tensor name with an unknown dtype: its error line."""
    name = "rollout_log_probs"
    entries = [_entry(name, "Q" * 20_000_000, [2, 4], 0, 32)]
    return _safetensors(tmp / "long.safetensors", "{" + ", ".join(entries) + "}", bytes(32))


def _same_key(tmp: Path) -> Path:
    save_file(
        {"rollout_log_probs": R, "old_log_probs": T, "response_mask": MASK},
        str(tmp / "s.safetensors"),
    )
    return tmp / "s.safetensors"


def _npz_lie(tmp: Path) -> Path:
    """A 2 MiB npz whose `responses` header declares 2 GiB of int64 ids."""
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        header, {"descr": "<i8", "fortran_order": False, "shape": (1 << 28,)}
    )
    path = tmp / "lie.npz"
    with zipfile.ZipFile(path, "w") as archive:
        for key, value in (("rollout_log_probs", R), ("old_log_probs", T), ("response_mask", MASK)):
            buffer = io.BytesIO()
            np.save(buffer, value.numpy())
            archive.writestr(f"{key}.npy", buffer.getvalue())
        archive.writestr("responses.npy", header.getvalue() + bytes(2 << 20))
    return path


def _npz_bomb(tmp: Path) -> Path:
    """64 KiB of npz whose deflated `responses` member holds 64 MiB of int64 zeros, as its
    header says (the budget is set to 16 MiB): consistent, and a bomb."""
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        header, {"descr": "<i8", "fortran_order": False, "shape": (8 << 20,)}
    )
    path = tmp / "bomb.npz"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for key, value in (("rollout_log_probs", R), ("old_log_probs", T), ("response_mask", MASK)):
            buffer = io.BytesIO()
            np.save(buffer, value.numpy())
            archive.writestr(f"{key}.npy", buffer.getvalue())
        with archive.open("responses.npy", "w") as member:
            member.write(header.getvalue())
            for _ in range(64):
                member.write(bytes(1 << 20))
    assert path.stat().st_size < 1 << 20
    return path


def _parquet_bomb(tmp: Path) -> Path:
    """A few KiB of Parquet that decode to 64 MiB of logprobs (the budget is set to 16 MiB)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = 8
    column = pa.array([np.zeros(1 << 20, dtype=np.float64)] * rows, type=pa.list_(pa.float64()))
    mask = pa.array([np.ones(1 << 20, dtype=np.int8)] * rows, type=pa.list_(pa.int8()))
    table = pa.table({"rollout_log_probs": column, "old_log_probs": column, "response_mask": mask})
    path = tmp / "bomb.parquet"
    pq.write_table(table, path, compression="zstd")
    assert path.stat().st_size < 256 << 10
    return path


def _parquet_twice(tmp: Path) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    lists = [pa.array(t.tolist(), type=pa.list_(pa.float32())) for t in (R, T, R)]
    mask = pa.array(MASK.tolist(), type=pa.list_(pa.int64()))
    names = ["rollout_log_probs", "old_log_probs", "old_log_probs", "response_mask"]
    path = tmp / "twice.parquet"
    pq.write_table(pa.Table.from_arrays([*lists, mask], names=names), path)
    return path


def _npz_twice(tmp: Path) -> Path:
    import warnings

    path = tmp / "twice.npz"
    with zipfile.ZipFile(path, "w") as archive, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile warns of the duplicate name, and writes it
        for key, value in (("rollout_log_probs", R), ("old_log_probs", T),
                           ("old_log_probs", R), ("response_mask", MASK)):  # fmt: skip
            buffer = io.BytesIO()
            np.save(buffer, value.numpy())
            archive.writestr(f"{key}.npy", buffer.getvalue())
    return path


def _jsonl_twice(tmp: Path) -> Path:
    path = tmp / "twice.jsonl"
    rows = [
        f'{{"rollout_log_probs": {json.dumps(r)}, "old_log_probs": {json.dumps(t)}, '
        f'"old_log_probs": {json.dumps(r)}, "response_mask": [1, 1, 1, 1]}}'
        for r, t in zip(R.tolist(), T.tolist(), strict=True)
    ]
    path.write_text("\n".join(rows) + "\n")
    return path


# name -> (make the dump, extra argv, code, text the error shows)
Attack = tuple[Callable[[Path], Path], list[str], str, str]
ATTACKS: dict[str, Attack] = {
    "same_key": (_same_key, ["--training-key", "rollout_log_probs"], "judge.same_key", "both name"),
    "tensor_named_twice": (_twice, [], "judge.unreadable", "'old_log_probs' twice"),
    "metadata_twice": (_metadata_twice, [], "judge.unreadable", "'__metadata__' twice"),
    "shape_0_2_70": (_huge_shape, [], "judge.unreadable", "is not a tensor's"),
    "npz_declares_2_gib": (_npz_lie, [], "judge.unreadable", "declares (268435456,)"),
    "parquet_bomb": (_parquet_bomb, [], "judge.too_large", "more than the 16777216"),
    "npz_deflated_bomb": (_npz_bomb, [], "judge.too_large", "more than the 16777216"),
    "parquet_column_twice": (_parquet_twice, [], "judge.unreadable", "'old_log_probs' twice"),
    "npz_member_twice": (_npz_twice, [], "judge.unreadable", "'old_log_probs.npy' twice"),
    "jsonl_key_twice": (_jsonl_twice, [], "judge.unreadable", "'old_log_probs' twice"),
}


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_a_hostile_dump_is_coded_and_writes_nothing(
    name: str, tmp_path: Path, xconf_cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    make, extra, code, shown = ATTACKS[name]
    monkeypatch.setenv("XCONF_MAX_INPUT_BYTES", str(16 << 20))
    dump = make(tmp_path)
    out = tmp_path / "out"
    rc, _, err = xconf_cli("judge", dump, "--dtype", "float32", *extra, "--output-root", out)
    assert rc == 2 and f"[{code}]" in err and shown in err, err[-3000:]
    assert str(dump) in err and "Traceback" not in err
    assert snapshot(out) == {}


def test_an_error_line_stays_bounded(tmp_path: Path, xconf_cli) -> None:
    dump = _long_name(tmp_path)
    rc, _, err = xconf_cli("judge", dump, "--dtype", "float32", "--output-root", tmp_path / "o")
    assert rc == 2 and "[judge.bad_dtype]" in err
    assert len(err) < 20_000


def test_unsigned_ids_in_an_npz_are_judged(tmp_path: Path, xconf_cli) -> None:
    """uint32 response ids (a tokenizer's natural type): judged, the ids kept exactly."""
    path = tmp_path / "u32.npz"
    ids = np.arange(8, dtype=np.uint32).reshape(2, 4) + 4_000_000_000
    np.savez(path, rollout_log_probs=R.numpy(), old_log_probs=T.numpy(),
             response_mask=MASK.numpy(), responses=ids)  # fmt: skip
    out = tmp_path / "out"
    rc, _, err = xconf_cli("judge", path, "--dtype", "float32", "--output-root", out)
    assert rc == 0, err[-3000:]
    from safetensors.torch import load_file

    (attempt,) = (out / "judge" / "cases" / "u32").iterdir()
    stored = load_file(str(attempt / "score_rollout.safetensors"))["token_ids"]
    assert stored.tolist() == ids.astype(np.int64).tolist()
    assert xconf_cli("verify", out / "judge")[0] == 0


def test_a_safetensors_dump_within_the_budget_is_read_as_before(tmp_path: Path) -> None:
    from xconf.judge.dumps import Keys, load_dump

    data = save({"rollout_log_probs": R, "old_log_probs": T, "response_mask": MASK})
    (tmp_path / "ok.safetensors").write_bytes(data)
    dump = load_dump("ok", tmp_path / "ok.safetensors", Keys())
    assert torch.equal(dump.rollout, R) and torch.equal(dump.training, T)
