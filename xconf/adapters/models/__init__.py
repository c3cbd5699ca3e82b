"""Tiny deterministic checkpoints and tokenizers for real-runtime scenarios (S1, S2)."""

from xconf.adapters.models.factory import ModelRecord, ModelSpec, default_cache_dir, ensure_model

__all__ = ["ModelRecord", "ModelSpec", "default_cache_dir", "ensure_model"]
