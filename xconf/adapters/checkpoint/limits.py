"""The checkpoint's vocabulary and the longest sequence the real runtimes score, from their
options alone (no torch, no transformers, no engine): what a plan checks an identity's
explicit rows against (``xconf.runtime.input_limits``).

``runtime.model.path``: its ``config.json`` as JSON (``vocab_size`` and
``max_position_embeddings``, or a multimodal config's ``text_config``); otherwise the tiny
model the options name (:class:`~xconf.adapters.models.ModelSpec`). The longest sequence is
``runtime.max_model_len``, or the checkpoint's positions when fewer. A config that cannot be
read gives None: the runtime refuses it with a coded error when a run builds it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from xconf.adapters.checkpoint.model_options import parse_model_options
from xconf.adapters.errors import ModelFactoryError
from xconf.adapters.models.factory import model_spec
from xconf.adapters.models.facts import read_checkpoint_json
from xconf.runtime.input_limits import InputLimits

DEFAULT_MAX_MODEL_LEN = 256


def _positive(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _checkpoint(path: Path) -> tuple[int, int | None] | None:
    """(vocab_size, max_position_embeddings) of ``path/config.json``, None if unreadable."""
    try:  # the one bounded reader: a FIFO or a 100,000-deep config is refused, never waited on
        raw = read_checkpoint_json(path / "config.json")
    except ModelFactoryError:
        return None
    if not isinstance(raw, dict):
        return None
    text = raw.get("text_config")
    node = text if isinstance(text, dict) and "vocab_size" in text else raw
    vocab = _positive(node.get("vocab_size"))
    return None if vocab is None else (vocab, _positive(node.get("max_position_embeddings")))


def input_limits(options: Mapping[str, Any]) -> InputLimits | None:
    max_model_len = _positive(options.get("max_model_len", DEFAULT_MAX_MODEL_LEN))
    if max_model_len is None:
        return None
    model = parse_model_options(
        options.get("model"), options.get("tokenizer"), options.get("trust_remote_code", False)
    )
    if model.path is not None:
        facts = _checkpoint(Path(model.path))
        if facts is None:
            return None
        vocab, positions = facts
        where = f"{Path(model.path) / 'config.json'}"
    else:
        spec = model_spec(model.spec)
        vocab, positions = spec.vocab_size, spec.max_position_embeddings
        where = f"the tiny {spec.arch} model"
    if _positive(vocab) is None or (positions is not None and _positive(positions) is None):
        return None  # the runtime refuses such a tiny-model option when it is built
    longest = max_model_len if positions is None else min(max_model_len, positions)
    return InputLimits(vocab, longest, f"{where} (max_model_len {max_model_len})")
