"""`xconf make-checkpoint DIR --arch qwen3|llama`: a tiny Hugging Face checkpoint to try xconf on.

The directory is written by `save_pretrained` and gets what a real checkpoint has:
config.json, model.safetensors, generation_config.json, and a byte-level BPE tokenizer
trained in-process (tokenizer.json, with a chat template in tokenizer_config.json).
Nothing is downloaded.
"""

from __future__ import annotations

import argparse
from typing import Any


def add_parser(sub: Any) -> None:
    parser = sub.add_parser(
        "make-checkpoint",
        help="write a tiny local HF checkpoint (safetensors + tokenizer + chat template)",
    )
    parser.add_argument("dir", help="new (or empty) directory to write")
    parser.add_argument("--arch", choices=("qwen3", "llama"), default="qwen3")
    parser.add_argument("--seed", type=int, default=1234, help="weight seed")


def run(args: argparse.Namespace, console: Any) -> int:
    from xconf.adapters.models import ModelSpec
    from xconf.adapters.models.factory import write_checkpoint

    record = write_checkpoint(ModelSpec(arch=args.arch, seed=args.seed), args.dir)
    console.print(
        f"wrote {record.architecture} checkpoint {record.path} "
        f"(model.safetensors sha256:{record.checkpoint_sha256[:16]}…, "
        f"vocab {record.vocab_size})"
    )
    return 0
