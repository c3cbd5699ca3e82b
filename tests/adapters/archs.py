"""Tiny checkpoints made with transformers' own model classes, not xconf's factory.

Each is what a user's ``save_pretrained`` writes: a config of that architecture (2 layers,
hidden 64, head size 32: a size vLLM's CPU attention supports), weights initialised by
transformers itself under a fixed seed, and a byte-level BPE trained in-process with
``tokenizers`` (saved as a ``PreTrainedTokenizerFast`` with a ChatML template).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

VOCAB = 384
CORPUS = [
    "The rollout engine samples tokens and the trainer scores the very same tokens again.",
    "Question: what is two plus three? Answer: five.",
    "def score(model, tokens): return model(tokens).logits",
    "Once upon a time a small model learned to count from one to ten.",
    "You are a careful assistant inside a reinforcement learning loop.",
] * 20
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def write_tokenizer(out: Path, vocab: int = VOCAB) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token="<|im_start|>",
    )
    fast.chat_template = CHATML
    fast.save_pretrained(str(out))
    return fast


def _common(vocab: int, eos: int, pad: int, bos: int) -> dict[str, Any]:
    return dict(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=512,
        eos_token_id=eos,
        pad_token_id=pad,
        bos_token_id=bos,
        tie_word_embeddings=False,
    )


def _configs() -> dict[str, Callable[[dict[str, Any]], Any]]:
    import transformers as t

    return {
        "llama": lambda c: t.LlamaConfig(**c),
        "qwen2": lambda c: t.Qwen2Config(**c),
        "qwen3": lambda c: t.Qwen3Config(**c, head_dim=32),
        "mistral": lambda c: t.MistralConfig(**c, sliding_window=None),
        # Every Gemma2 release ties its embeddings, and vLLM's Gemma2 has no lm_head of its own.
        "gemma2": lambda c: t.Gemma2Config(**{**c, "tie_word_embeddings": True}, head_dim=32),
        "phi3": lambda c: t.Phi3Config(**c),
        "gpt2": lambda c: t.GPT2Config(
            vocab_size=c["vocab_size"],
            n_embd=64,
            n_layer=2,
            n_head=2,
            n_positions=512,
            eos_token_id=c["eos_token_id"],
            bos_token_id=c["bos_token_id"],
            pad_token_id=c["pad_token_id"],
        ),
    }


ARCHS = tuple(_configs())


# Odd but legal variants: a Llama config without ``num_key_value_heads`` (transformers
# defaults it to the head count) and a Gemma2 with its own lm_head (transformers loads it).
VARIANTS = ("llama-no-kv", "gemma2-untied")


def write_checkpoint(
    arch: str, out: Path, seed: int = 0, config: dict[str, Any] | None = None
) -> Path:
    """``arch`` from :data:`ARCHS` or :data:`VARIANTS`; ``config`` overrides config fields
    (``num_key_value_heads=2``: a model that splits over two TP ranks without replication)."""
    import torch
    from transformers import AutoModelForCausalLM

    out.mkdir(parents=True, exist_ok=True)
    tok = write_tokenizer(out)
    base = arch.split("-")[0]
    common = _common(VOCAB, tok.eos_token_id, tok.pad_token_id, tok.bos_token_id)
    if arch == "llama-no-kv":  # built with its default (one KV head per head), then dropped
        common["num_key_value_heads"] = common["num_attention_heads"]
    common.update(config or {})
    cfg = _configs()[base](common)
    if arch == "gemma2-untied":
        cfg.tie_word_embeddings = False
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    model.save_pretrained(str(out), safe_serialization=True)
    if arch == "llama-no-kv":
        path = out / "config.json"
        doc = json.loads(path.read_text())
        doc.pop("num_key_value_heads")
        path.write_text(json.dumps(doc, indent=2))
    return out


def random_batch(seed: int, shapes: tuple[tuple[int, int], ...]) -> Any:
    """A frozen batch of random token ids in [3, 300) (inside every tiny vocabulary, clear of
    the special ids): one (prompt length, response length) per sample, drawn in that order."""
    import torch

    from xconf.adapters.frozen import FrozenBatch, FrozenSample

    g = torch.Generator().manual_seed(seed)
    samples = tuple(
        FrozenSample(
            tuple(torch.randint(3, 300, (n,), generator=g).tolist()),
            tuple(torch.randint(3, 300, (m,), generator=g).tolist()),
        )
        for n, m in shapes
    )
    return FrozenBatch(samples, 0)
