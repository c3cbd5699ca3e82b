"""Fixtures of the Megatron side's tests: checkpoints made with transformers' own classes.

Outside ``tests/adapters`` on purpose: that directory's conftest imports vLLM, which these
tests never need. Each checkpoint is written once per session; models are built per module.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest


def _installed(name: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False


# Found, not imported: megatron.core is imported by the side itself, with its notices silenced.
HAVE_MEGATRON = _installed("transformers") and _installed("megatron.core")
needs_megatron = pytest.mark.skipif(
    not HAVE_MEGATRON, reason="megatron-core is not installed (requirements/megatron.txt)"
)

# 4 heads over 2 KV heads (two query heads per group): the QKV interleave is exercised, and
# the model splits over TP 2 without replicating a KV head (which Megatron never does).
GQA = {"num_attention_heads": 4, "num_key_value_heads": 2}


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """``checkpoints(name)``: a checkpoint directory, written on first use. Names: an arch of
    ``tests/adapters/archs.py``, or ``llama-gqa`` / ``qwen3-gqa`` (``GQA``, Qwen3 tied)."""
    from tests.adapters.archs import write_checkpoint

    root = tmp_path_factory.mktemp("megatron-ckpts")
    made: dict[str, Path] = {}
    variants = {
        "llama-gqa": ("llama", GQA),
        "qwen3-gqa": ("qwen3", {**GQA, "tie_word_embeddings": True}),
    }

    def get(name: str) -> Path:
        if name not in made:
            arch, config = variants.get(name, (name, {}))
            made[name] = write_checkpoint(arch, root / name, config=config)
        return made[name]

    return get
