"""The synthetic model's vocabulary and context from the runtime's options alone: a plan reads
them without torch (``xconf.runtime.input_limits``); the model is built with the same sizes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from xconf.errors import ConfigError
from xconf.runtime.input_limits import InputLimits

VOCAB_SIZE = 97  # odd, so vocabulary tiles never divide it evenly
MAX_POSITIONS = 64


def input_limits(options: Mapping[str, Any]) -> InputLimits:
    vocab = options.get("vocab_size", VOCAB_SIZE)
    if isinstance(vocab, bool) or not isinstance(vocab, int) or vocab < 1:
        raise ConfigError(
            "config.wrong_type",
            f"the vocabulary size is a positive integer, got {vocab!r}",
            "runtime.vocab_size",
        )
    return InputLimits(
        vocab, MAX_POSITIONS, f"the synthetic model ({vocab} tokens, {MAX_POSITIONS} positions)"
    )
