"""``identity=from_dump``: the dump's rows become frozen samples in every format judge reads;
every dump that cannot be replayed is exit 2 through `xconf-run`'s own `main()`, with its
code and file named, and nothing written (the inputs are checked before any engine)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from tests.adapters.conftest import HAVE_HF
from tests.commands import refused_in_process
from tests.conftest import snapshot

pytestmark = pytest.mark.skipif(not HAVE_HF, reason="transformers is not installed")

P, R = 5, 4


def _batch(**changes: torch.Tensor) -> dict[str, torch.Tensor]:
    """Three rows: full, left-padded prompt, right-padded response (verl's layout)."""
    prompts = torch.tensor([[5, 6, 7, 8, 9], [0, 0, 11, 12, 13], [21, 22, 23, 24, 25]])
    responses = torch.tensor([[31, 32, 33, 34], [41, 42, 43, 44], [51, 52, 0, 0]])
    attention = torch.ones((3, P + R), dtype=torch.int64)
    attention[1, :2] = 0
    attention[2, P + 2 :] = 0
    tensors = {
        "prompts": prompts,
        "responses": responses,
        "input_ids": torch.cat([prompts, responses], dim=1),
        "attention_mask": attention,
        "response_mask": attention[:, P:].clone(),
        "position_ids": torch.clip(torch.cumsum(attention, dim=-1) - 1, min=0),
    }
    tensors.update(changes)
    if "responses" in changes and "input_ids" not in changes:
        tensors["input_ids"] = torch.cat([prompts, changes["responses"]], dim=1)
    return tensors


def _save(path: Path, tensors: dict[str, torch.Tensor]) -> Path:
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path))
    return path


def _frozen(path: Path, checkpoint: Path | None = None, **keys: str) -> Any:
    """The frozen identity the runtime builds from the dump (default: the tiny model)."""
    from xconf.adapters.checkpoint.model_options import parse_model_options
    from xconf.adapters.frozen_dump import dump_recipe, freeze_dump
    from xconf.config.identity import parse_identity

    node = {
        "checkpoint_id": "c",
        "model_version": "m",
        "tokenizer_id": "t",
        "tokenizer_policy": "p",
        "pre_update_state": "s",
        "cache_metadata": {},
        "packing_metadata": {},
        "dump": str(path),
        "dump_keys": keys or None,
    }
    identity = parse_identity(node)
    recipe = dump_recipe(identity)
    assert recipe is not None
    model = {"path": str(checkpoint)} if checkpoint is not None else None
    record = parse_model_options(model, None, False).record({}, None)
    return freeze_dump(identity, recipe, record, 256)


def test_every_format_gives_the_same_frozen_samples(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    tensors = _batch()
    st = _save(tmp_path / "step.safetensors", tensors)
    npz = tmp_path / "step.npz"
    arrays: dict[str, Any] = {k: v.numpy() for k, v in tensors.items()}
    np.savez(npz, **arrays)
    parquet = tmp_path / "step.parquet"
    pq.write_table(pa.table({k: v.tolist() for k, v in tensors.items()}), parquet)
    renamed = _save(
        tmp_path / "renamed.safetensors",
        {("response_ids" if k == "responses" else k): v for k, v in tensors.items()},
    )
    frozen = [
        _frozen(st),
        _frozen(npz),
        _frozen(parquet),
        _frozen(renamed, responses="response_ids"),
    ]
    expected = [
        [5, 6, 7, 8, 9, 31, 32, 33, 34],
        [11, 12, 13, 41, 42, 43, 44, 0, 0],  # the dump's pad id (0) pads the frozen row
        [21, 22, 23, 24, 25, 51, 52, 0, 0],
    ]
    for identity in frozen:
        assert [list(r) for r in identity.token_ids] == expected
        assert [sum(r) for r in identity.active_mask] == [4, 4, 2]
    assert len({f.digest() for f in frozen}) == 4  # each dump's own digest is in its identity
    # Float and bool masks, as trainers keep them: the same samples.
    floats = _batch(
        attention_mask=tensors["attention_mask"].bool(),
        response_mask=tensors["response_mask"].float(),
    )
    assert _frozen(_save(tmp_path / "floats.safetensors", floats)).token_ids == frozen[0].token_ids
    # Only prompts (no input_ids), no response_mask or positions: the same samples.
    minimal = {k: v for k, v in tensors.items() if k in ("prompts", "responses", "attention_mask")}
    only = _frozen(_save(tmp_path / "minimal.safetensors", minimal))
    assert [list(r) for r in only.token_ids] == expected
    # judge's replay hint: only for a dump that holds what a replay needs.
    from xconf.adapters.frozen_dump import replay_command

    for replayable in (st, npz, parquet):
        assert f"identity.dump={replayable} " in str(replay_command(str(replayable)))
    no_prompt = {k: v for k, v in tensors.items() if k not in ("input_ids", "prompts")}
    assert replay_command(str(_save(tmp_path / "np.safetensors", no_prompt))) is None
    # Trailing response tokens outside the mask are not scored: the sample ends at the mask.
    short = tensors["response_mask"].clone()
    short[0, 3] = 0
    cut = _frozen(_save(tmp_path / "short.safetensors", _batch(response_mask=short)))
    assert list(cut.token_ids[0][:8]) == expected[0][:8] and sum(cut.active_mask[0]) == 3


def test_the_dump_digest_is_in_the_planned_identity(tmp_path: Path) -> None:
    """The plan's identity (so every case id) follows the dump's bytes, and a dump rewritten
    between planning and scoring is refused, never scored under the old identity."""
    from xconf.adapters.checkpoint.model_options import parse_model_options
    from xconf.adapters.frozen_dump import dump_recipe, freeze_dump
    from xconf.config.identity import parse_identity
    from xconf.errors import ConfigError

    path = _save(tmp_path / "step.safetensors", _batch())
    node: dict[str, Any] = {k: "x" for k in ("checkpoint_id", "model_version", "tokenizer_id")}
    node |= {"tokenizer_policy": "p", "pre_update_state": "s", "dump": str(path)}
    node |= {"cache_metadata": {}, "packing_metadata": {}}
    planned = parse_identity(node)
    responses = _batch()["responses"].clone()
    responses[0, 0] = 7
    _save(path, _batch(responses=responses))  # same path, other bytes
    assert parse_identity(node).digest() != planned.digest()
    recipe = dump_recipe(planned)
    assert recipe is not None
    record = parse_model_options(None, None, False).record({}, None)
    with pytest.raises(ConfigError) as info:
        freeze_dump(planned, recipe, record, 256)
    assert info.value.code == "identity.dump_changed"


def test_a_local_checkpoint_names_itself_and_its_vocabulary(
    checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    """``runtime.model.path=CKPT``: its digest and tokenizer in the identity, its own
    vocabulary checked (a make-checkpoint Llama: transformers' own classes)."""
    from xconf.adapters.models import open_checkpoint
    from xconf.errors import ConfigError

    ckpt = checkpoints["llama"]
    record = open_checkpoint(ckpt)
    frozen = _frozen(_save(tmp_path / "step.safetensors", _batch()), ckpt)
    assert frozen.checkpoint_id == f"sha256:{record.checkpoint_sha256}"
    recipe = json.loads(frozen.recipe)
    assert recipe["tokenizer_path"] == str(ckpt) and recipe["model"] == {"checkpoint": "local"}
    responses = _batch()["responses"].clone()
    responses[0, 0] = record.vocab_size  # one past its vocabulary
    with pytest.raises(ConfigError) as info:
        _frozen(_save(tmp_path / "vocab.safetensors", _batch(responses=responses)), ckpt)
    assert info.value.code == "identity.dump_token_out_of_vocab"
    assert f"[0, {record.vocab_size})" in info.value.message


def _bad_dumps(root: Path) -> list[tuple[str, list[str], str, str]]:
    ok = _batch()
    vocab = ok["responses"].clone()
    vocab[1, 2] = 512  # the tiny model's vocabulary is [0, 512)
    mask = ok["response_mask"].clone()
    mask[2, 3] = 1  # a padded response position
    tail = ok["input_ids"].clone()
    tail[0, -1] = 99  # input_ids no longer ends with responses
    gaps = ok["response_mask"].clone()
    gaps[0, 1] = 0
    positions = ok["position_ids"].clone()
    positions[0] += 3
    pickle = root / "step.pt"
    pickle.write_bytes(b"\x80\x04 never opened")
    # fourth campaign: zero-width responses (before: a broadcasting RuntimeError traceback)
    none = torch.zeros((3, 0), dtype=torch.int64)
    prompt_only = {"attention_mask": torch.ones((3, P), dtype=torch.int64), "response_mask": none}
    prompt_only["position_ids"] = torch.arange(P).expand(3, P)

    def dump(name: str, **changes: torch.Tensor) -> str:
        return f"identity.dump={_save(root / f'{name}.safetensors', _batch(**changes))}"

    return [
        ("no_dump", [], "config.missing_key", "identity.dump"),
        ("absent", [f"identity.dump={root / 'absent.npz'}"], "identity.dump_missing", "absent"),
        ("pickle", [f"identity.dump={pickle}"], "identity.dump_unreadable", "step.pt"),
        ("vocab", [dump("vocab", responses=vocab)], "identity.dump_token_out_of_vocab", "vocab"),
        ("mask", [dump("mask", response_mask=mask)], "identity.dump_mask_mismatch", "mask"),
        (
            "mask_shape",
            [dump("mask_shape", response_mask=mask[:, :3])],
            "identity.dump_mask_mismatch",
            "mask_shape",
        ),
        (
            "mask_values",
            [dump("mask_values", response_mask=ok["response_mask"] * 2)],
            "identity.dump_bad_mask",
            "mask_values",
        ),
        ("tail", [dump("tail", input_ids=tail)], "identity.dump_response_not_at_end", "tail"),
        ("gaps", [dump("gaps", response_mask=gaps)], "identity.dump_mask_gaps", "gaps"),
        ("pos", [dump("pos", position_ids=positions)], "identity.dump_bad_positions", "pos"),
        (
            "zero_width",
            [dump("zero_width", responses=none, **prompt_only)],
            "identity.dump_empty",
            "zero_width",
        ),
        (
            "unknown_key",
            [dump("unknown_key"), "+identity.dump_keys.labels=x"],
            "config.unknown_key",
            "identity.dump_keys.labels",
        ),
    ]


@pytest.mark.slow
def test_bad_dumps_exit_2_with_their_code_and_write_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    cases = _bad_dumps(inputs)
    before = snapshot(inputs)
    for name, overrides, code, named in cases:
        cwd = tmp_path / f"cwd-{name}"
        cwd.mkdir()
        monkeypatch.chdir(cwd)
        out = tmp_path / f"out-{name}"
        argv = ["+experiment=s2_cpu", "runtime=vllm_hf", "identity=from_dump"]
        argv += [*overrides, f"output_root={out}"]
        refused_in_process(monkeypatch, capsys, argv, code, named, name)
        assert not out.exists(), name
        assert snapshot(inputs) == before, name


@pytest.mark.parametrize("kind", ["fifo", "sparse_200_gb", "directory"])
def test_a_dump_that_is_no_regular_file_is_refused_before_it_is_read(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Fourth campaign: the dump is digested when the experiment is planned; a FIFO, a
    directory or a 200 GB sparse file is refused there, unread (before: the sparse file was
    hashed byte by byte, a FIFO said "does not exist")."""
    import os

    dump = tmp_path / "inputs" / "step.safetensors"
    dump.parent.mkdir()
    if kind == "fifo":
        os.mkfifo(dump)
    elif kind == "directory":
        dump.mkdir()
    else:
        with open(dump, "wb") as fh:
            fh.truncate(200 << 30)
    code = "identity.dump_too_large" if kind == "sparse_200_gb" else "identity.dump_unreadable"
    monkeypatch.chdir(tmp_path)
    argv = ["+experiment=s2_cpu", "identity=from_dump", f"identity.dump={dump}", "mode=plan"]
    refused_in_process(monkeypatch, capsys, [*argv, "output_root=out"], code, "step", kind)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["inputs"]
