"""Hostile and broken checkpoints: refused with a code naming the file before anything is
written, and a digest that sees every byte the engines read (links, in-place rewrites)."""

from __future__ import annotations

import json
import os
import shutil
import struct
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.commands import refused_in_process
from tests.conftest import snapshot
from xconf.adapters.errors import ModelFactoryError
from xconf.adapters.models.local import open_checkpoint


def _copy(checkpoints: dict[str, Path], root: Path, name: str) -> Path:
    out = root / name
    shutil.copytree(checkpoints["qwen3"], out)
    return out


def _weights(d: Path) -> Path:
    return d / "model.safetensors"


def _split(path: Path) -> tuple[int, dict, bytes]:
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    return n, json.loads(data[8 : 8 + n]), data[8 + n :]


def _join(path: Path, header: dict, body: bytes) -> None:
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + body)


def _header_len(d: Path) -> None:
    data = _weights(d).read_bytes()
    _weights(d).write_bytes(struct.pack("<Q", 1 << 62) + data[8:])


def _header_past_eof(d: Path) -> None:
    data = _weights(d).read_bytes()
    _weights(d).write_bytes(struct.pack("<Q", len(data)) + data[8:])


def _truncated(d: Path) -> None:
    data = _weights(d).read_bytes()
    _weights(d).write_bytes(data[: len(data) - 4096])


def _dtype_lie(d: Path) -> None:
    _, header, body = _split(_weights(d))
    name = next(k for k in sorted(header) if k != "__metadata__")
    header[name]["dtype"] = "F16"  # half the bytes the offsets give
    _join(_weights(d), header, body)


def _zero_bytes(d: Path) -> None:
    _weights(d).write_bytes(b"")


def _pickle(d: Path) -> None:
    _weights(d).write_bytes(b"\x80\x04\x95 a pickle, never opened")


def _missing_tensor(d: Path) -> None:
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(_weights(d)))
    tensors.pop("model.layers.0.mlp.down_proj.weight")
    save_file(tensors, str(_weights(d)))


def _config(d: Path, **changes: object) -> None:
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(changes)
    (d / "config.json").write_text(json.dumps(cfg))


def _unknown_arch(d: Path) -> None:
    _config(d, architectures=["NoSuchForCausalLM"])


def _unknown_model_type(d: Path) -> None:
    _config(d, model_type="no_such_type")


def _vocab_lie(d: Path) -> None:
    _config(d, vocab_size=1024)  # the weights have 512 rows


def _tokenizer_ids(d: Path) -> None:
    doc = json.loads((d / "tokenizer.json").read_text())
    doc["added_tokens"].append(
        {
            "id": 700,
            "content": "<|beyond|>",
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
    )
    (d / "tokenizer.json").write_text(json.dumps(doc))


def _empty_tokenizer(d: Path) -> None:
    (d / "tokenizer.json").write_bytes(b"")


def _tokenizer_auto_map(d: Path) -> None:
    path = d / "tokenizer_config.json"
    doc = json.loads(path.read_text())
    doc["auto_map"] = {"AutoTokenizer": ["tok.Custom", None]}
    path.write_text(json.dumps(doc))


# name -> (damage, code, file named in the error)
BROKEN: dict[str, tuple[Callable[[Path], None], str, str]] = {
    "header_len_2_62": (_header_len, "model.bad_safetensors", "model.safetensors"),
    "header_past_eof": (_header_past_eof, "model.bad_safetensors", "model.safetensors"),
    "truncated": (_truncated, "model.truncated_weights", "model.safetensors"),
    "dtype_lie": (_dtype_lie, "model.bad_safetensors", "model.safetensors"),
    "zero_bytes": (_zero_bytes, "model.bad_safetensors", "model.safetensors"),
    "pickle_named_safetensors": (_pickle, "model.pickle_weights", "model.safetensors"),
    "missing_down_proj": (_missing_tensor, "model.missing_tensor", "down_proj"),
    "unknown_architecture": (_unknown_arch, "model.unsupported_architecture", "config.json"),
    "unknown_model_type": (_unknown_model_type, "model.bad_config", "config.json"),
    "vocab_1024_rows_512": (_vocab_lie, "model.tensor_shape", "model.safetensors"),
    "tokenizer_ids_beyond_vocab": (_tokenizer_ids, "model.tokenizer_vocab", "tokenizer.json"),
    "zero_byte_tokenizer": (_empty_tokenizer, "model.bad_tokenizer", "tokenizer.json"),
    "tokenizer_auto_map": (_tokenizer_auto_map, "model.remote_code", "tokenizer_config.json"),
}


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_broken_checkpoint_is_coded_and_names_the_file(
    name: str, checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    damage, code, named = BROKEN[name]
    d = _copy(checkpoints, tmp_path, name)
    damage(d)
    with pytest.raises(ModelFactoryError) as err:
        open_checkpoint(d, cache_dir=tmp_path / "cache")
    assert err.value.code == code, (name, err.value)
    assert named in str(err.value.path) + err.value.message, (name, err.value)


@pytest.mark.slow
def test_broken_checkpoints_exit_2_through_xconf_run_and_write_nothing(
    checkpoints: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    for name in ("truncated", "unknown_architecture", "tokenizer_ids_beyond_vocab"):
        damage, code, named = BROKEN[name]
        d = _copy(checkpoints, tmp_path, name)
        damage(d)
        before = snapshot(d)
        out = tmp_path / f"out-{name}"
        cwd = tmp_path / f"cwd-{name}"
        cwd.mkdir()
        monkeypatch.chdir(cwd)
        argv = ["+experiment=s2_cpu", "runtime=vllm_hf"]
        argv += [f"runtime.model.path={d}", f"output_root={out}"]
        refused_in_process(monkeypatch, capsys, argv, code, named, name)
        assert not out.exists(), name
        assert snapshot(d) == before, name


def _digest(d: Path, cache: Path) -> str:
    return open_checkpoint(d, cache_dir=cache).checkpoint_sha256


def test_same_size_rewrite_with_mtime_and_inode_restored_is_hashed_again(
    checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    d = _copy(checkpoints, tmp_path, "ckpt")
    cache = tmp_path / "cache"
    first = _digest(d, cache)
    weights = _weights(d)
    st = os.stat(weights)
    _, header, _ = _split(weights)
    begin = min(v["data_offsets"][0] for k, v in header.items() if k != "__metadata__")
    with open(weights, "r+b") as fh:  # in place: same inode, same size
        fh.seek(8 + struct.unpack("<Q", weights.read_bytes()[:8])[0] + begin)
        fh.write(b"\x00\x00\x80\x7f")  # one float32 becomes +inf
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns))
    after = os.stat(weights)
    assert (after.st_size, after.st_mtime_ns, after.st_ino) == (
        st.st_size,
        st.st_mtime_ns,
        st.st_ino,
    )
    assert _digest(d, cache) != first


def test_links_are_followed_named_and_digested(
    checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    d = _copy(checkpoints, tmp_path, "ckpt")
    cache = tmp_path / "cache"
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    for name in ("config.json", "tokenizer.json"):
        shutil.move(str(d / name), outside / name)
        (d / name).symlink_to(outside / name)
    first = _digest(d, cache)
    cfg = json.loads((outside / "config.json").read_text())
    (outside / "config.json").write_text(json.dumps({**cfg, "rms_norm_eps": 1e-5}))
    second = _digest(d, cache)
    assert second != first  # the target's bytes are digested
    # The same bytes behind another link target are another checkpoint: the target is named.
    moved = tmp_path / "moved"
    shutil.copytree(outside, moved)
    (d / "config.json").unlink()
    (d / "config.json").symlink_to(moved / "config.json")
    assert _digest(d, cache) not in (first, second)
    # An extra shard linked from outside is part of the digest too.
    extra = tmp_path / "extra.json"
    extra.write_text("{}")
    (d / "extra_notes.json").symlink_to(extra)
    third = _digest(d, cache)
    extra.write_text('{"changed": true}')
    fourth = _digest(d, cache)
    assert fourth != third
    (d / "subdir").symlink_to(outside)  # a linked directory is skipped, like a real one
    assert _digest(d, cache) == fourth
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    (d / "pipe.json").symlink_to(fifo)
    with pytest.raises(ModelFactoryError) as err:
        open_checkpoint(d, cache_dir=cache)  # never opened: reading a FIFO would hang
    assert err.value.code == "model.bad_link" and "pipe.json" in str(err.value.path)
    (d / "pipe.json").unlink()
    (d / "dangling.json").symlink_to(tmp_path / "nowhere")
    with pytest.raises(ModelFactoryError) as err:
        open_checkpoint(d, cache_dir=cache)
    assert err.value.code == "model.broken_link" and "dangling.json" in str(err.value.path)


def _hub_snapshot(src: Path, hub: Path) -> Path:
    """The Hugging Face hub cache layout: snapshots/<rev>/<file> -> ../../blobs/<sha>."""
    import hashlib

    repo = hub / "models--someone--tiny"
    blobs = repo / "blobs"
    snap = repo / "snapshots" / ("a" * 40)
    blobs.mkdir(parents=True)
    snap.mkdir(parents=True)
    for f in sorted(src.iterdir()):
        if not f.is_file():
            continue
        data = f.read_bytes()
        blob = blobs / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snap / f.name).symlink_to(Path("../..") / "blobs" / blob.name)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("a" * 40)
    return snap


def test_hub_snapshot_directory_is_accepted_and_its_blobs_digested(
    checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    snap = _hub_snapshot(checkpoints["qwen3"], tmp_path / "hub")
    cache = tmp_path / "cache"
    record = open_checkpoint(snap, cache_dir=cache)
    assert record.vocab_size == 512 and record.architecture == "Qwen3ForCausalLM"
    blob = (snap / "model.safetensors").resolve()
    data = bytearray(blob.read_bytes())
    data[-1] ^= 1  # the last byte of the last tensor
    blob.write_bytes(bytes(data))
    assert open_checkpoint(snap, cache_dir=cache).checkpoint_sha256 != record.checkpoint_sha256


def test_check_model_reads_a_checkpoint_and_refuses_a_broken_one(
    checkpoints: dict[str, Path], tmp_path: Path, capsys
) -> None:
    from xconf.cli.main import main

    assert main(["check-model", str(checkpoints["qwen3"])]) == 0
    out = capsys.readouterr().out
    assert "4 attention, 2 KV, size 32" in out and "TP sizes             1, 2, 4" in out
    assert "localize             yes" in out
    d = _copy(checkpoints, tmp_path, "broken")
    _truncated(d)
    before = snapshot(d)
    assert main(["check-model", str(d)]) == 2
    captured = capsys.readouterr()
    assert "[model.truncated_weights]" in captured.err and "model.safetensors" in captured.err
    assert "Traceback" not in captured.err
    assert snapshot(d) == before
