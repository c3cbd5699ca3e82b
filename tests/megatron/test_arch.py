"""What Megatron's local spec can build from a checkpoint, and the coded refusals naming the
config field (or the tensor) for what it cannot map."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.megatron.conftest import needs_megatron
from tests.megatron.inputs import engine
from xconf.adapters.errors import ModelFactoryError

pytestmark = needs_megatron
SMALL = dict(
    vocab_size=384,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
)


def _config_dir(tmp_path: Path, kind: str, **fields: Any) -> Path:
    """A checkpoint directory holding only the config transformers' own class writes."""
    import transformers as t

    classes = {
        "llama": t.LlamaConfig,
        "qwen2": t.Qwen2Config,
        "qwen3": t.Qwen3Config,
        "mistral": t.MistralConfig,
        "gemma2": t.Gemma2Config,
        "phi3": t.Phi3Config,
    }
    out = tmp_path / kind
    classes[kind](**{**SMALL, **fields}).save_pretrained(str(out))
    return out


def _refused(root: Path) -> ModelFactoryError:
    from xconf.adapters.megatron.arch import megatron_arch

    with pytest.raises(ModelFactoryError) as info:
        megatron_arch(root)
    return info.value


@pytest.mark.parametrize(
    ("kind", "fields", "named"),
    [
        ("gemma2", {}, "model_type"),
        ("phi3", {}, "model_type"),
        ("llama", {"attention_bias": True}, "attention_bias"),
        ("llama", {"mlp_bias": True}, "mlp_bias"),
        ("llama", {"hidden_act": "gelu"}, "hidden_act"),
        ("mistral", {"sliding_window": 16}, "sliding_window"),
        ("qwen3", {"use_sliding_window": True, "sliding_window": 16}, "use_sliding_window"),
        ("qwen3", {"attention_bias": True}, "attention_bias"),
        (
            "llama",
            {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}},
            "rope_parameters",
        ),
    ],
)
def test_an_unmappable_config_is_refused_naming_its_field(tmp_path, kind, fields, named) -> None:
    err = _refused(_config_dir(tmp_path, kind, **fields))
    assert err.code == "model.megatron_unmappable"
    assert err.path == f"{tmp_path / kind / 'config.json'}:{named}", err.path


def test_a_mixture_of_experts_is_refused_naming_its_field(tmp_path) -> None:
    root = _config_dir(tmp_path, "qwen2")
    doc = json.loads((root / "config.json").read_text())
    (root / "config.json").write_text(json.dumps({**doc, "num_experts": 8}))
    assert str(_refused(root).path).endswith("config.json:num_experts")


@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3", "mistral"])
def test_the_mapped_families(tmp_path, kind) -> None:
    from xconf.adapters.megatron.arch import megatron_arch

    # Mistral's config class defaults to a 4096-token sliding window (refused): its later
    # releases, like archs.py's, have none.
    fields = {"sliding_window": None} if kind == "mistral" else {}
    arch = megatron_arch(_config_dir(tmp_path, kind, **fields))
    assert (arch.num_heads, arch.num_kv_heads, arch.num_layers) == (2, 1, 2)
    assert (arch.qkv_bias, arch.qk_layernorm) == (kind == "qwen2", kind == "qwen3")


def test_megatron_splits_smollm2_over_one_or_three_ranks_never_two(tmp_path) -> None:
    """SmolLM2-135M's shape: 9 heads over 3 KV heads, 1536 MLP columns, 49152 tokens.
    Megatron replicates no KV head, so TP 9 (vLLM's other choice) is refused too."""
    from xconf.adapters.megatron.arch import megatron_arch

    root = _config_dir(
        tmp_path,
        "llama",
        **{
            **SMALL,
            "hidden_size": 576,
            "intermediate_size": 1536,
            "num_attention_heads": 9,
            "num_key_value_heads": 3,
            "vocab_size": 49152,
            "tie_word_embeddings": True,
        },
    )
    arch = megatron_arch(root)
    assert arch.tp_sizes == (1, 3)
    assert arch.tp_reason(2) == "9 attention heads do not split over TP=2"
    assert "KV heads" in str(arch.tp_reason(9))


def test_a_tensor_with_no_place_in_the_spec_is_refused_by_name(checkpoints, tmp_path) -> None:
    """A bias the config does not announce (an o_proj bias in a Llama) has no Megatron
    parameter: building names the tensor instead of dropping it."""
    import shutil

    from safetensors.torch import load_file, save_file

    root = tmp_path / "llama-extra"
    shutil.copytree(checkpoints("llama"), root)
    tensors = load_file(str(root / "model.safetensors"))
    extra = "model.layers.0.self_attn.o_proj.bias"
    tensors[extra] = tensors["model.norm.weight"].clone()
    save_file(tensors, str(root / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ModelFactoryError) as info:
        engine(root)
    assert (info.value.code, info.value.path) == ("model.megatron_unmappable", f"{root}:{extra}")
