"""Checkpoints for the real runtimes (S1, S2): tiny deterministic ones built locally, the
real pretrained default converted from its packaged GGUF, and users' own directories."""

from xconf.adapters.models.factory import ModelRecord, ModelSpec, default_cache_dir, ensure_model
from xconf.adapters.models.local import open_checkpoint, verify_unchanged
from xconf.adapters.models.pretrained import open_pretrained, pretrained_checkpoint

__all__ = [
    "ModelRecord",
    "ModelSpec",
    "default_cache_dir",
    "ensure_model",
    "open_checkpoint",
    "open_pretrained",
    "pretrained_checkpoint",
    "verify_unchanged",
]
