"""Hostile checkpoints of the fourth campaign: every file read bounded (no FIFO waited on, no
device read, no 100,000-deep JSON recursing), only the files an engine loads digested, and a
checkpoint that means two things refused. Each is a coded ModelFactoryError naming the
file, in seconds. Before: hangs, MemoryError and RecursionError tracebacks, a 200 GB file
digested byte by byte, and two models passed as one."""

from __future__ import annotations

import json
import os
import shutil
import struct
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from xconf.adapters.errors import ModelFactoryError
from xconf.adapters.models.local import open_checkpoint

DEEP = "[" * 100_000 + "]" * 100_000


def _within(seconds: float, call: Callable[[], Any]) -> Any:
    """``call()``'s result or exception, or a failure when it has not returned in time (a
    daemon thread: a call blocked on a FIFO cannot hold the test process)."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = call()
        except BaseException as exc:  # whatever it raised is the finding
            box["value"] = exc

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(seconds)
    assert not worker.is_alive(), f"no answer in {seconds} s"
    return box["value"]


def _copy(checkpoints: dict[str, Path], root: Path) -> Path:
    out = root / "ckpt"
    shutil.copytree(checkpoints["qwen3"], out)
    return out


def _link(path: Path, target: str) -> None:
    path.unlink()
    path.symlink_to(target)


def _fifo(d: Path, name: str) -> None:
    (d / name).unlink()
    os.mkfifo(d / name)


def _deep(d: Path, name: str) -> None:
    (d / name).write_text(DEEP)


def _config(d: Path, **changes: Any) -> None:
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(changes)
    (d / "config.json").write_text(json.dumps(cfg))


def _split(path: Path) -> tuple[dict[str, Any], bytes]:
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8 : 8 + n]), data[8 + n :]


def _shards(d: Path, *, twice: bool = False, index_lies: bool = False) -> None:
    """The weights as two shards with an index; ``twice``: the second shard holds an
    lm_head.weight too, of other values; ``index_lies``: the index names the other shard."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(d / "model.safetensors"))
    head = "lm_head.weight"
    names = sorted(n for n in tensors if n != head)
    first, second = [*names[: len(names) // 2], head], names[len(names) // 2 :]
    one, two = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
    save_file({n: tensors[n] for n in first}, str(d / one))
    extra = {head: tensors[head] + 1.0} if twice else {}
    save_file({**{n: tensors[n] for n in second}, **extra}, str(d / two))
    (d / "model.safetensors").unlink()
    weight_map = {**{n: one for n in first}, **{n: two for n in second}}
    if index_lies:
        weight_map[first[0]] = two
    index = {"metadata": {}, "weight_map": weight_map}
    (d / "model.safetensors.index.json").write_text(json.dumps(index))


def _deep_header(d: Path) -> None:
    _, body = _split(d / "model.safetensors")
    raw = DEEP.encode()
    (d / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw + body)


# name -> (damage, code, file named)
HOSTILE: dict[str, tuple[Callable[[Path], None], str, str]] = {
    "config_fifo": (lambda d: _fifo(d, "config.json"), "model.bad_config", "config.json"),
    "tokenizer_fifo": (lambda d: _fifo(d, "tokenizer.json"), "model.bad_file", "tokenizer.json"),
    "config_links_to_dev_zero": (
        lambda d: _link(d / "config.json", "/dev/zero"),
        "model.bad_config",
        "config.json",
    ),
    "deep_config": (lambda d: _deep(d, "config.json"), "model.bad_config", "config.json"),
    "deep_tokenizer_config": (
        lambda d: _deep(d, "tokenizer_config.json"),
        "model.bad_tokenizer",
        "tokenizer_config.json",
    ),
    "deep_index": (
        lambda d: _deep(d, "model.safetensors.index.json"),
        "model.bad_index",
        "model.safetensors.index.json",
    ),
    "deep_safetensors_header": (_deep_header, "model.bad_safetensors", "model.safetensors"),
    "model_type_and_architectures_disagree": (
        lambda d: _config(d, architectures=["LlamaForCausalLM"]),  # model_type stays qwen3
        "model.architecture_mismatch",
        "config.json",
    ),
    "two_shards_hold_lm_head": (
        lambda d: _shards(d, twice=True),
        "model.duplicate_tensor",
        "lm_head.weight",
    ),
    "index_names_another_shard": (
        lambda d: _shards(d, index_lies=True),
        "model.index_mismatch",
        "model.safetensors.index.json",
    ),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_hostile_checkpoint_is_coded_quickly(
    name: str, checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    damage, code, named = HOSTILE[name]
    d = _copy(checkpoints, tmp_path)
    damage(d)
    found = _within(60, lambda: open_checkpoint(d, cache_dir=tmp_path / "cache"))
    assert isinstance(found, ModelFactoryError), (name, found)
    assert found.code == code, (name, found)
    assert named in str(found.path) + found.message, (name, found)


@pytest.mark.parametrize("name", ["config_fifo", "config_links_to_dev_zero", "deep_config"])
def test_plan_time_limits_never_wait_on_the_config(
    name: str, checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    """A plan reads config.json for the input limits before any engine: a FIFO hung it, a link
    to /dev/zero ran out of memory; now it says nothing (the run refuses the checkpoint)."""
    from xconf.adapters.checkpoint.limits import input_limits

    d = _copy(checkpoints, tmp_path)
    HOSTILE[name][0](d)
    assert _within(30, lambda: input_limits({"model": {"path": str(d)}})) is None


def test_only_the_files_an_engine_loads_are_digested(
    checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    """A 200 GB sparse archive beside the weights is no part of the checkpoint: never read,
    and the digest is the one of the directory without it; a text file that size is refused."""
    d = _copy(checkpoints, tmp_path)
    cache = tmp_path / "cache"
    before = open_checkpoint(d, cache_dir=cache).checkpoint_sha256
    with open(d / "backup.tar", "wb") as fh:
        fh.truncate(200 << 30)
    started = time.perf_counter()
    found = _within(60, lambda: open_checkpoint(d, cache_dir=tmp_path / "fresh"))
    assert not isinstance(found, BaseException), found
    assert found.checkpoint_sha256 == before and time.perf_counter() - started < 60
    (d / "backup.tar").rename(d / "notes.txt")
    found = _within(60, lambda: open_checkpoint(d, cache_dir=tmp_path / "fresh"))
    assert isinstance(found, ModelFactoryError) and found.code == "model.too_large", found
