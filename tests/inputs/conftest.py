"""A tiny Qwen3 and a tiny Llama checkpoint written by `xconf make-checkpoint`, once per session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.adapters.conftest import HAVE_HF


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    if not HAVE_HF:
        pytest.skip("transformers/tokenizers are not installed")
    from xconf.cli.main import main

    root = tmp_path_factory.mktemp("checkpoints")
    os.environ.setdefault("XCONF_MODEL_CACHE", str(tmp_path_factory.mktemp("model-cache")))
    out = {}
    for arch in ("qwen3", "llama"):
        assert main(["make-checkpoint", str(root / arch), "--arch", arch]) == 0
        out[arch] = root / arch
    return out
