"""Tiny checkpoints made with transformers' own model classes, not xconf's factory.

Each architecture of the matrix gets a two-layer config built with its transformers config
class, weights from the class's own initializer (seeded), ``save_pretrained`` with
safetensors, and a byte-level BPE trained here with ``tokenizers`` on a fixed corpus and
saved as a ``PreTrainedTokenizerFast``. Nothing is downloaded and nothing comes from xconf.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

VOCAB = 384
HEAD_DIM = 32  # vLLM's CPU attention supports head sizes 32, 64, 80, ...
CORPUS = [
    "the rollout engine samples tokens and reports log probabilities",
    "the trainer recomputes them with teacher forcing on the same frozen tokens",
    "precision caching batching and attention kernels all move the numbers",
    "one two three four five six seven eight nine ten eleven twelve",
    "a small model learns to count to spell and to rhyme in the sun",
] * 20

# architecture -> (config class, extra config fields)
ARCHITECTURES: dict[str, tuple[str, dict[str, Any]]] = {
    "LlamaForCausalLM": ("LlamaConfig", {}),
    "Qwen2ForCausalLM": ("Qwen2Config", {}),
    "Qwen3ForCausalLM": ("Qwen3Config", {}),
    "MistralForCausalLM": ("MistralConfig", {"sliding_window": None}),
    "Gemma2ForCausalLM": (
        "Gemma2Config",
        {
            "query_pre_attn_scalar": HEAD_DIM,
            "sliding_window": 64,
            "final_logit_softcapping": 30.0,
            "tie_word_embeddings": True,  # vLLM's Gemma2 has no lm_head of its own
        },
    ),
    "Phi3ForCausalLM": ("Phi3Config", {"pad_token_id": 0}),
    "GPT2LMHeadModel": ("GPT2Config", {}),
}


def _tokenizer(out: Path) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB - 8,
        special_tokens=["<eos>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<eos>")
    fast.save_pretrained(str(out))
    return fast


def _config(architecture: str, eos: int) -> Any:
    import transformers

    name, extra = ARCHITECTURES[architecture]
    cls = getattr(transformers, name)
    if architecture == "GPT2LMHeadModel":
        fields: dict[str, Any] = {
            "vocab_size": VOCAB,
            "n_embd": 64,
            "n_layer": 2,
            "n_head": 2,
            "n_positions": 256,
            "bos_token_id": eos,
            "eos_token_id": eos,
        }
    else:
        fields = {
            "vocab_size": VOCAB,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "head_dim": HEAD_DIM,
            "max_position_embeddings": 256,
            "bos_token_id": eos,
            "eos_token_id": eos,
            "pad_token_id": eos,
            "tie_word_embeddings": False,
        }
    cfg = cls(**{**fields, **extra})
    cfg.architectures = [architecture]
    return cfg


def build(architecture: str, out: Path, seed: int = 7) -> Path:
    """A tiny ``architecture`` checkpoint in ``out`` (config, safetensors, tokenizer)."""
    import torch
    import transformers

    out.mkdir(parents=True, exist_ok=True)
    fast = _tokenizer(out)
    cfg = _config(architecture, int(fast.eos_token_id))
    torch.manual_seed(seed)
    model = getattr(transformers, architecture)(cfg).to(torch.float32).eval()
    with torch.no_grad():  # logits far from uniform, so that drift is visible
        model.get_output_embeddings().weight.normal_(0.0, 0.5)
    model.save_pretrained(str(out), safe_serialization=True)
    return out
