"""xconf's Hugging Face -> Megatron weight mapping, tensor by tensor, on checkpoints written by
transformers' own classes.

The loader's own check (``verify_weights``, run by every build) reads the checkpoint through
the same plan as the loader; these tests derive the layout independently: every Megatron
parameter is unpacked back into the Hugging Face tensors (the per-group QKV interleave, the
gate/up halves of fc1) and compared with ``safetensors.torch.load_file``'s, bit for bit.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.megatron.conftest import needs_megatron
from tests.megatron.inputs import engine as make_engine

pytestmark = needs_megatron
ARCHS = ("llama", "qwen2", "qwen3", "mistral", "llama-gqa", "qwen3-gqa")


def unpack(arch: Any, params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Megatron's TP-1 parameters as the Hugging Face tensors they must have come from."""
    per, hd, groups = arch.num_heads // arch.num_kv_heads, arch.head_dim, arch.num_kv_heads
    out = {
        "model.embed_tokens.weight": params["embedding.word_embeddings.weight"],
        "model.norm.weight": params["decoder.final_layernorm.weight"],
    }
    if not arch.tied_embeddings:
        out["lm_head.weight"] = params["output_layer.weight"]
    for i in range(arch.num_layers):
        mg, hf = f"decoder.layers.{i}.", f"model.layers.{i}."
        kinds = ("weight", "bias") if arch.qkv_bias else ("weight",)
        for kind in kinds:
            qkv = params[f"{mg}self_attention.linear_qkv.{kind}"]
            grouped = qkv.reshape(groups, (per + 2) * hd, *qkv.shape[1:])
            q, k, v = grouped.split([per * hd, hd, hd], dim=1)
            for name, part in (("q", q), ("k", k), ("v", v)):
                out[f"{hf}self_attn.{name}_proj.{kind}"] = part.reshape(-1, *qkv.shape[1:])
        gate, up = params[f"{mg}mlp.linear_fc1.weight"].chunk(2, dim=0)
        out |= {
            f"{hf}mlp.gate_proj.weight": gate,
            f"{hf}mlp.up_proj.weight": up,
            f"{hf}mlp.down_proj.weight": params[f"{mg}mlp.linear_fc2.weight"],
            f"{hf}self_attn.o_proj.weight": params[f"{mg}self_attention.linear_proj.weight"],
            f"{hf}input_layernorm.weight": params[f"{mg}input_layernorm.weight"],
            f"{hf}post_attention_layernorm.weight": params[f"{mg}pre_mlp_layernorm.weight"],
        }
        if arch.qk_layernorm:
            out[f"{hf}self_attn.q_norm.weight"] = params[f"{mg}self_attention.q_layernorm.weight"]
            out[f"{hf}self_attn.k_norm.weight"] = params[f"{mg}self_attention.k_layernorm.weight"]
    return out


def _bits(t: torch.Tensor) -> bytes:
    return t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


@pytest.mark.parametrize("name", ARCHS)
def test_every_parameter_is_its_checkpoint_tensor_bit_for_bit(checkpoints, name) -> None:
    from safetensors.torch import load_file

    root = checkpoints(name)
    engine = make_engine(root)
    params = dict(engine.model.named_parameters())
    stored = load_file(str(root / "model.safetensors"))
    derived = unpack(engine.arch, params)
    assert set(derived) == set(stored)  # save_pretrained stores no tied lm_head
    for tensor, value in derived.items():
        assert value.shape == stored[tensor].shape, tensor
        assert _bits(value) == _bits(stored[tensor]), tensor
    assert engine.weights.ok and engine.weights.parameters == len(params)


def test_a_changed_parameter_is_named_by_the_check(checkpoints) -> None:
    from xconf.adapters.megatron.weights import verify_weights

    engine = make_engine(checkpoints("qwen3"))
    name = "decoder.layers.1.self_attention.k_layernorm.weight"
    with torch.no_grad():
        dict(engine.model.named_parameters())[name][3] += 2.0**-20
    check = verify_weights(engine.model, engine.cfg.model_path, engine.arch, 1, 0)
    assert check.mismatched == (name,)


def test_tensor_parallel_shards_are_whole_query_groups_and_per_shard_gate_up(checkpoints) -> None:
    """TP 2 plans, read without building: rank r's QKV is query groups r of the TP 1
    layout, its fc1 is ``cat(gate[r], up[r])`` (not a half of ``cat(gate, up)``), its
    row-parallel weights are input columns r, its vocabulary rows r."""
    from safetensors.torch import load_file

    from xconf.adapters.megatron.arch import megatron_arch
    from xconf.adapters.megatron.weights import CheckpointTensors, weight_plan

    root = checkpoints("llama-gqa")
    arch = megatron_arch(root)
    stored = load_file(str(root / "model.safetensors"))
    with CheckpointTensors(root) as ckpt:
        whole = {k: ckpt.read(v) for k, v in weight_plan(arch, ckpt.shapes).items()}
        ranks = [
            {k: ckpt.read(v) for k, v in weight_plan(arch, ckpt.shapes, 2, r).items()}
            for r in (0, 1)
        ]
    qkv = "decoder.layers.0.self_attention.linear_qkv.weight"
    assert torch.equal(torch.cat([ranks[0][qkv], ranks[1][qkv]]), whole[qkv])
    half = arch.ffn_hidden_size // 2
    gate, up = (
        stored["model.layers.0.mlp.gate_proj.weight"],
        stored["model.layers.0.mlp.up_proj.weight"],
    )
    for r in (0, 1):
        rows = slice(r * half, (r + 1) * half)
        assert torch.equal(
            ranks[r]["decoder.layers.0.mlp.linear_fc1.weight"], torch.cat([gate[rows], up[rows]])
        )
    for name, dim in (
        ("decoder.layers.0.self_attention.linear_proj.weight", 1),
        ("decoder.layers.0.mlp.linear_fc2.weight", 1),
        ("embedding.word_embeddings.weight", 0),
        ("output_layer.weight", 0),
    ):
        assert torch.equal(torch.cat([ranks[0][name], ranks[1][name]], dim=dim), whole[name]), name
    norm = "decoder.layers.0.input_layernorm.weight"
    assert torch.equal(ranks[1][norm], whole[norm])
