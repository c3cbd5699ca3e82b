"""Offline, deterministic byte-level BPE tokenizer trained in-process on a built-in corpus.

Nothing is downloaded: the corpus is generated here from fixed text and a fixed recipe,
so the same ``vocab_size`` always gives the same ``tokenizer.json`` (checked by digest).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from xconf.adapters.errors import ModelFactoryError, RuntimeUnavailableError

EOS_TOKEN = "<|endoftext|>"
SPECIAL_TOKENS: tuple[str, ...] = (EOS_TOKEN, "<|im_start|>", "<|im_end|>")
TOKENIZER_RECIPE_VERSION = "xconf-bpe.v1"
# ChatML, as Qwen3 uses it (its two markers are special tokens above), so that dataset rows
# with chat messages render on the tiny models exactly as on a real one.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

_BASE_TEXT = """\
The rollout engine samples tokens and reports their log probabilities.
The trainer recomputes the same log probabilities with teacher forcing.
When the two numbers disagree, a configuration change is usually the cause.
Precision, caching, batching, parallelism and attention kernels all matter.
A frozen identity pins the prompt, the response, the masks and the positions.
def score(model, tokens):
    logits = model(tokens).logits
    return logits.log_softmax(dim=-1).gather(-1, tokens[..., None])
for step in range(8):
    loss = -(advantages * logprobs).mean()
Numbers: 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 32 64 128 256 512 1024.
Once upon a time a small model learned to count, to spell and to rhyme.
The quick brown fox jumps over the lazy dog while the cat sleeps in the sun.
Question: what is two plus three? Answer: five. Question: and four times six?
Matrices multiply rows by columns; softmax turns scores into probabilities.
"""

_WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "epsilon",
    "zeta",
    "theta",
    "kappa",
    "lambda",
    "sigma",
    "omega",
    "token",
    "logit",
    "prompt",
    "response",
    "mask",
    "position",
    "cache",
    "prefix",
    "decode",
    "prefill",
    "tensor",
    "shard",
    "rank",
    "world",
    "gather",
    "reduce",
    "scatter",
    "kernel",
    "float",
    "bfloat",
    "half",
    "red",
    "green",
    "blue",
    "yellow",
    "river",
    "mountain",
    "forest",
    "ocean",
    "city",
    "garden",
    "window",
]


def corpus() -> list[str]:
    """The fixed training corpus: base text plus a deterministic word/number mix."""
    lines = _BASE_TEXT.splitlines()
    for i in range(240):
        words = [_WORDS[(i * 7 + j * 13) % len(_WORDS)] for j in range(3 + i % 5)]
        lines.append(f"{' '.join(words)} {i * 37 % 1000}.")
    return lines


@dataclass(frozen=True)
class TokenizerArtifacts:
    """What :func:`train_tokenizer` wrote: the file digest doubles as the tokenizer id."""

    tokenizer_id: str
    tokenizer_sha256: str
    vocab_size: int
    eos_token_id: int


def train_tokenizer(vocab_size: int, out_dir: Path, model_max_length: int) -> TokenizerArtifacts:
    """Train the byte-level BPE and save HF-loadable files (tokenizer.json + configs)."""
    try:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise RuntimeUnavailableError(
            "runtime_unavailable", f"tokenizers is not installed: {exc}", "tokenizer"
        ) from exc
    min_vocab = 256 + len(SPECIAL_TOKENS)
    if vocab_size <= min_vocab:
        raise ModelFactoryError(
            "vocab_too_small", f"vocab_size must exceed {min_vocab}", "spec.vocab_size"
        )
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=1,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    if tok.get_vocab_size() > vocab_size:
        raise ModelFactoryError(
            "tokenizer_overflow",
            f"trained {tok.get_vocab_size()} tokens for a vocabulary of {vocab_size}",
            "spec.vocab_size",
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    tok_path = out_dir / "tokenizer.json"
    tok.save(str(tok_path), pretty=False)
    eos_id = tok.token_to_id(EOS_TOKEN)
    if eos_id is None:
        raise ModelFactoryError(
            "tokenizer_no_eos", f"{EOS_TOKEN} missing from the vocabulary", "tokenizer"
        )
    tok_cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": EOS_TOKEN,
        "pad_token": EOS_TOKEN,
        "bos_token": None,
        "unk_token": None,
        "model_max_length": model_max_length,
        "clean_up_tokenization_spaces": False,
        "add_bos_token": False,
        "add_eos_token": False,
        "chat_template": CHAT_TEMPLATE,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2, sort_keys=True))
    special_map = {"eos_token": EOS_TOKEN, "pad_token": EOS_TOKEN}
    (out_dir / "special_tokens_map.json").write_text(json.dumps(special_map, indent=2))
    sha = hashlib.sha256(tok_path.read_bytes()).hexdigest()
    return TokenizerArtifacts(
        tokenizer_id=f"{TOKENIZER_RECIPE_VERSION}-v{vocab_size}-{sha[:16]}",
        tokenizer_sha256=sha,
        vocab_size=tok.get_vocab_size(),
        eos_token_id=eos_id,
    )
