"""Every cache entry is checked against what produced it before it is used (fourth campaign):
the model cache's manifests file by file, the converted default against its manifest and the
packaged GGUF, frozen tokens against the recipe's key and their own digest, digests only
from the user's own files; a cache that cannot be written is no cache, never an error.
Before: each of these was believed, and an unwritable cache stopped a run with exit 2."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.adapters.conftest import needs_vllm
from xconf.adapters.models.local import open_checkpoint

REAL_DEFAULT = Path(os.environ.get("XCONF_MODEL_CACHE", "")) / "pretrained"


def test_a_digest_entry_in_a_directory_others_can_write_is_not_believed(
    checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    d = tmp_path / "ckpt"
    shutil.copytree(checkpoints["qwen3"], d)
    cache = tmp_path / "cache"
    first = open_checkpoint(d, cache_dir=cache).checkpoint_sha256
    (entry,) = (cache / "digests").iterdir()
    os.chmod(cache / "digests", 0o777)  # anyone may write here
    weights = d / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF  # one byte of the last tensor
    weights.write_bytes(bytes(data))
    # ... and someone did: the entry keeps the old digest under the new file's stat key
    doc = json.loads(entry.read_text())
    st = os.stat(weights)
    doc["files"]["model.safetensors"]["key"] = [
        st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev, None,
    ]  # fmt: skip
    entry.write_text(json.dumps(doc))
    assert open_checkpoint(d, cache_dir=cache).checkpoint_sha256 != first
    assert json.loads(entry.read_text()) == doc  # nothing written into that directory


def test_an_edited_config_of_a_cached_tiny_model_is_rebuilt(tmp_path: Path) -> None:
    from xconf.adapters.models import ModelSpec, ensure_model

    spec = ModelSpec(num_hidden_layers=1)
    record = ensure_model(spec, cache_dir=tmp_path)
    config = Path(record.path) / "config.json"
    original = json.loads(config.read_text())
    edited = json.loads(config.read_text())
    edited["rope_parameters"]["rope_theta"] = 3.0  # transformers 5 nests rope_theta here
    config.write_text(json.dumps(edited))
    again = ensure_model(spec, cache_dir=tmp_path)
    assert json.loads((Path(again.path) / "config.json").read_text()) == original
    assert again.checkpoint_sha256 == record.checkpoint_sha256


def _converted() -> Path:
    found = sorted(REAL_DEFAULT.glob("smollm2-135m-instruct-*"))
    if not found:
        pytest.skip("the pretrained default is not converted in this model cache")
    return found[0]


def test_a_directory_planted_at_the_default_is_not_the_default(
    checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    """The tiny random model with an all-zero manifest, where the converted default lives."""
    from xconf.adapters.models import pretrained

    planted = tmp_path / "pretrained" / "smollm2-135m-instruct-v1"
    shutil.copytree(checkpoints["qwen3"], planted)
    (planted / "xconf_model.json").unlink()
    names = sorted(p.name for p in planted.iterdir())
    manifest = {
        "converter": pretrained.CONVERTER_VERSION,
        "source_sha256": "0" * 64,
        "files": dict.fromkeys(names, "0" * 64),
    }
    (planted / pretrained.MANIFEST).write_text(json.dumps(manifest))
    assert not pretrained._complete(planted)


def test_an_edited_config_of_the_converted_default_is_not_the_default(tmp_path: Path) -> None:
    """rope_theta edited in the converted default (the logprobs move by up to 7.4)."""
    from xconf.adapters.models import pretrained

    source = _converted()
    copy = tmp_path / "pretrained" / source.name
    copy.mkdir(parents=True)
    for f in source.iterdir():  # hard links: the 538 MB weights are not copied
        os.link(f, copy / f.name)
    assert pretrained._complete(copy)
    config = json.loads((copy / "config.json").read_text())
    (copy / "config.json").unlink()  # a new file: the shared one is left alone
    (copy / "config.json").write_text(json.dumps({**config, "rope_theta": 3.0}))
    assert not pretrained._complete(copy)


def _recipe_identity() -> Any:
    from xconf.config.identity import parse_identity

    return parse_identity(
        {
            "checkpoint_id": "local",
            "model_version": "local",
            "tokenizer_id": "local",
            "tokenizer_policy": "prompt_ids+response_ids",
            "pre_update_state": "as given",
            "cache_metadata": {"training_kv_cache": "forbidden"},
            "packing_metadata": {"packed": False},
            "scoring_mode": "decode",
            "recipe": {
                "kind": "vllm_baseline_rollout",
                "prompts": ["The rollout engine samples", "def score(model):"],
                "response_len": 4,
                "seed": 7,
            },
        }
    )


@needs_vllm
@pytest.mark.slow
def test_rewritten_frozen_tokens_are_sampled_again(
    checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    from xconf.adapters.checkpoint.runtime import CheckpointRuntime

    cache = tmp_path / "cache"

    def freeze() -> Any:
        runtime = CheckpointRuntime(
            "vllm", "hf", model={"path": str(checkpoints["qwen3"])}, model_cache=str(cache)
        )
        return runtime.freeze_identity(_recipe_identity())

    first = freeze()
    (entry,) = (cache / "frozen").iterdir()
    doc = json.loads(entry.read_text())
    doc["response_ids"][0] = [(t + 1) % 512 for t in doc["response_ids"][0]]
    entry.write_text(json.dumps(doc))
    assert freeze().token_ids == first.token_ids  # the recipe's tokens, sampled at its seed


@needs_vllm
@pytest.mark.slow
def test_a_cache_that_cannot_be_written_costs_time_never_the_run(
    checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    """A user checkpoint with an unwritable model cache (below a file: every mkdir fails, as
    on a read-only mount, whoever runs the test): frozen tokens are sampled and not stored."""
    from xconf.adapters.checkpoint.runtime import CheckpointRuntime

    (tmp_path / "file").write_text("not a directory")
    cache = tmp_path / "file" / "cache"
    runtime = CheckpointRuntime(
        "vllm", "hf", model={"path": str(checkpoints["qwen3"])}, model_cache=str(cache)
    )
    frozen = runtime.freeze_identity(_recipe_identity())
    assert len(frozen.token_ids) == 2


@pytest.mark.slow
def test_a_conversion_offline_gives_the_honest_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A planted or edited default is converted again; the conversion's bytes must not
    depend on the environment: under HF_HUB_OFFLINE=1 transformers recorded
    `local_files_only: true` in tokenizer_config.json, another digest than SmolLM2's."""
    from xconf.adapters.models import pretrained

    honest = json.loads((_converted() / pretrained.MANIFEST).read_text())["files"]
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    converted = pretrained.pretrained_checkpoint(tmp_path)
    again = json.loads((converted / pretrained.MANIFEST).read_text())["files"]
    assert again == honest
