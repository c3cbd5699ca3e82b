"""A user's checkpoint directory: validated, digested once, never unpickled, watched for change."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from xconf.adapters.errors import IdentityViolationError, ModelFactoryError
from xconf.adapters.models import local
from xconf.adapters.models.local import open_checkpoint, verify_unchanged
from xconf.errors import ConfigError


def test_make_checkpoint_dirs_load_in_transformers(checkpoints: dict[str, Path]) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    for arch, expected in (("qwen3", "Qwen3ForCausalLM"), ("llama", "LlamaForCausalLM")):
        model = AutoModelForCausalLM.from_pretrained(checkpoints[arch], use_safetensors=True)
        assert type(model).__name__ == expected
        tok = AutoTokenizer.from_pretrained(checkpoints[arch])
        text = tok.apply_chat_template(
            [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
        )
        assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
        ids = torch.tensor([tok("The rollout engine", add_special_tokens=False)["input_ids"]])
        assert model(ids).logits.shape[-1] == 512


def test_digest_is_cached_by_stat_and_follows_content(
    checkpoints: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ckpt = tmp_path / "ckpt"
    shutil.copytree(checkpoints["qwen3"], ckpt)
    cache = tmp_path / "cache"
    first = open_checkpoint(ckpt, cache_dir=cache)
    assert first.local and first.checkpoint_sha256 == first.spec_sha256
    assert first.tokenizer_id.startswith("xconf-bpe.v1-v512-")  # the factory's own id
    hashed: list[str] = []
    real = local.sha256_file

    def recording_sha256(p: Path) -> str:
        hashed.append(p.name)
        return real(p)

    monkeypatch.setattr(local, "sha256_file", recording_sha256)
    again = open_checkpoint(ckpt, cache_dir=cache)
    assert again == first
    assert "model.safetensors" not in hashed  # stat unchanged: the weights are not re-read
    verify_unchanged(first, cache)
    cfg = ckpt / "generation_config.json"
    cfg.write_text(json.dumps({"eos_token_id": 1}))
    with pytest.raises(IdentityViolationError) as err:
        verify_unchanged(first, cache)
    assert err.value.code == "identity.checkpoint_changed"
    assert hashed.count("generation_config.json") >= 1
    assert open_checkpoint(ckpt, cache_dir=cache).checkpoint_sha256 != first.checkpoint_sha256


def _bad_dirs(checkpoints: dict[str, Path], tmp_path: Path) -> list[tuple[Path, str]]:
    pickles = tmp_path / "pickles"
    pickles.mkdir()
    shutil.copy(checkpoints["qwen3"] / "config.json", pickles)
    shutil.copy(checkpoints["qwen3"] / "tokenizer.json", pickles)
    (pickles / "pytorch_model.bin").write_bytes(b"\x80\x04 never opened")
    remote = tmp_path / "remote"
    shutil.copytree(checkpoints["qwen3"], remote)
    cfg = json.loads((remote / "config.json").read_text())
    (remote / "config.json").write_text(json.dumps({**cfg, "auto_map": {"AutoModel": "m.M"}}))
    no_tok = tmp_path / "no_tok"
    no_tok.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(checkpoints["qwen3"] / name, no_tok)
    return [
        (tmp_path / "absent", "model.missing_dir"),
        (pickles, "model.pickle_weights"),
        (remote, "model.remote_code"),
        (no_tok, "model.no_tokenizer"),
    ]


def test_bad_checkpoint_dirs_are_coded(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    for path, code in _bad_dirs(checkpoints, tmp_path):
        with pytest.raises(ModelFactoryError) as err:
            open_checkpoint(path, cache_dir=tmp_path / "cache")
        assert err.value.code == code, path
    pickles = tmp_path / "pickles"
    with pytest.raises(ModelFactoryError) as err:
        open_checkpoint(pickles, cache_dir=tmp_path / "cache")
    assert "safetensors" in err.value.message


@pytest.mark.parametrize(
    ("model", "tokenizer", "trust", "code", "path"),
    [
        ({"pathh": "/x"}, None, False, "config.unknown_key", "runtime.model.pathh"),
        ({"path": "/x", "arch": "llama"}, None, False, "config.conflict", "runtime.model.arch"),
        ({}, {"path": "/x"}, False, "config.conflict", "runtime.tokenizer.path"),
        ({}, {"dir": "/x"}, False, "config.unknown_key", "runtime.tokenizer.dir"),
        ({}, None, "yes", "config.wrong_type", "runtime.trust_remote_code"),
    ],
)
def test_bad_model_options_are_coded(model, tokenizer, trust, code, path) -> None:
    from xconf.adapters.checkpoint.model_options import parse_model_options

    with pytest.raises(ConfigError) as err:
        parse_model_options(model, tokenizer, trust)
    assert (err.value.code, err.value.path) == (code, path)


def test_unknown_runtime_option_is_coded_not_a_traceback() -> None:
    from xconf.adapters.checkpoint.runtime import CheckpointRuntime

    for rollout in ("vllm", "hf"):
        with pytest.raises(ConfigError) as err:
            CheckpointRuntime(rollout, "hf", model_path="/somewhere")
        assert (err.value.code, err.value.path) == ("runtime.unknown_option", "runtime.model_path")
        assert "runtime.model.path" in err.value.message
