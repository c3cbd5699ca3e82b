"""The tiny-model factory: deterministic, idempotent, verified, and not near-uniform."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.adapters.conftest import needs_hf
from xconf.adapters.models import ModelSpec, ensure_model
from xconf.adapters.models.factory import Arch

pytestmark = needs_hf


def test_same_spec_same_digests_in_fresh_caches(tmp_path: Path, model_record) -> None:
    again = ensure_model(cache_dir=tmp_path / "other")
    assert again.checkpoint_sha256 == model_record.checkpoint_sha256
    assert again.tokenizer_id == model_record.tokenizer_id
    assert again.spec_sha256 == model_record.spec_sha256


def test_cached_model_is_reused_not_rebuilt(model_cache: str, model_record) -> None:
    weights = Path(model_record.path) / "model.safetensors"
    before = weights.stat().st_mtime_ns
    assert ensure_model(cache_dir=model_cache) == model_record
    assert weights.stat().st_mtime_ns == before


def test_tampered_cache_is_rebuilt(tmp_path: Path) -> None:
    spec = ModelSpec(num_hidden_layers=1)
    first = ensure_model(spec, tmp_path)
    weights = Path(first.path) / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    rebuilt = ensure_model(spec, tmp_path)
    assert rebuilt.checkpoint_sha256 == first.checkpoint_sha256


def test_seed_changes_weights(tmp_path: Path, model_record) -> None:
    other = ensure_model(ModelSpec(seed=7), tmp_path)
    assert other.checkpoint_sha256 != model_record.checkpoint_sha256
    assert other.tokenizer_id == model_record.tokenizer_id  # tokenizer depends on the corpus only


def test_config_is_one_vllm_recognizes(model_record) -> None:
    cfg = json.loads((Path(model_record.path) / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3ForCausalLM"]
    assert cfg["dtype"] == "float32"
    assert cfg["tie_word_embeddings"] is False
    assert cfg["head_dim"] in (32, 64, 80, 96, 112, 128)  # vLLM CPU attention head sizes


def test_logits_are_far_from_uniform(model_record) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_record.path)
    model = AutoModelForCausalLM.from_pretrained(model_record.path, dtype=torch.float32)
    ids = tok("The rollout engine samples tokens", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        probs = model(ids).logits.softmax(-1)
    top = probs.max(-1).values
    assert float(top.mean()) > 20.0 / model_record.vocab_size  # uniform would be 1/512
    assert float(top.max()) > 0.3


@pytest.mark.parametrize("arch", ["llama"])
def test_llama_variant_loads_in_transformers(tmp_path: Path, arch: Arch) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    record = ensure_model(ModelSpec(arch=arch, num_hidden_layers=1), tmp_path)
    model = AutoModelForCausalLM.from_pretrained(record.path, dtype=torch.float32)
    assert type(model).__name__ == "LlamaForCausalLM"
    assert record.architecture == "LlamaForCausalLM"
