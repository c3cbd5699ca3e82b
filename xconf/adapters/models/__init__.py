"""Tiny deterministic checkpoints and tokenizers for real-runtime scenarios (S1, S2)."""

from xconf.adapters.models.factory import ModelRecord, ModelSpec, default_cache_dir, ensure_model
from xconf.adapters.models.local import open_checkpoint, verify_unchanged

__all__ = [
    "ModelRecord",
    "ModelSpec",
    "default_cache_dir",
    "ensure_model",
    "open_checkpoint",
    "verify_unchanged",
]
